"""A judge cache file from anyone (--cache, --judge-cache, a run folder's judge_cache.sqlite) (issue 31, item 4):
a row that is not a response `store` writes (nested 100,000 deep, a 5,000-digit integer, not JSON, a NaN, a
number where text goes, a BLOB, NULL, 20 MB) is an unusable entry: a miss, asked again and deleted, never a
traceback or a wrong number; a file that is not an SQLite database, a FIFO or /dev/zero (or one as its -wal
file) is one CacheFileError line before SQLite reads it."""

import json
import math
import os
import sqlite3

import pytest

from helpers.special_files import make_special
from judges.model.backend import ChatRequest, ChatResponse
from judges.model.cache import CacheFileError, CacheMiss, JudgeCache

REQUEST = ChatRequest(messages=({"role": "user", "content": "q"},))
GOOD = ChatResponse("ok", "[[A]]", token_logprobs=({"A": -0.5},), usage={"prompt_tokens": 3})
BIG = "9" * 5000
OK = {**GOOD.to_json(), "cached": False}

ROWS = {  # what the response column holds -> the reason the entry is not used
    "deep": ("[" * 100_000 + "]" * 100_000, "JSON nested more than 100 levels deep"),
    "big_int": (json.dumps(OK)[:-1] + f', "attempts": {BIG}}}', "an integer of 5,000 digits"),
    "not_json": ("not json", "not valid JSON"),
    "nan_logprob": (json.dumps({**OK, "token_logprobs": [{"A": math.nan}]}), "NaN is not a JSON number"),
    "nan_latency": (json.dumps({**OK, "latency": math.nan}), "NaN is not a JSON number"),
    "long_logprob": (json.dumps({**OK, "token_logprobs": [{"A": -10**400}]}), "its token_logprobs is not of the type"),
    "text_number": (json.dumps({**OK, "text": 5}), "its text is not of the type a cached answer has"),
    "usage_text": (json.dumps({**OK, "usage": {"prompt_tokens": "3"}}), "its usage is not of the type"),
    "logprobs_text": (json.dumps({**OK, "token_logprobs": ["A"]}), "its token_logprobs is not of the type"),
    "failure": (json.dumps({**OK, "status": "api_error"}), "status 'api_error' is not a cached answer's"),
    "unknown": (json.dumps({**OK, "extra": 1}), "unknown field 'extra'"),
    "array": ("[1, 2]", "not a JSON object"),
    "blob": (b"\xff\xfe garbage", "not UTF-8 JSON text"),
    "integer": (12345, "not a JSON object"),  # the column's TEXT affinity keeps it as '12345'
    "null": (None, "NULL"),
    "huge": (json.dumps({**OK, "text": "x" * (20 << 20)}), "an entry of 20,971,"),
}


@pytest.mark.parametrize("kind", sorted(ROWS))
def test_a_hostile_row_is_a_miss_asked_again_and_deleted(tmp_path, kind):
    path, (value, reason) = tmp_path / "c.sqlite", ROWS[kind]
    with sqlite3.connect(path) as connection:  # the cache's columns without its NOT NULL: anyone's file may
        connection.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, identity, status, request, response TEXT, "
                           "created)")
    cache = JudgeCache(path)
    assert cache.store(REQUEST, "b", GOOD) and cache.lookup(REQUEST, "b") == ChatResponse(
        "ok", "[[A]]", token_logprobs=({"A": -0.5},), usage={"prompt_tokens": 3}, cached=True, latency=0.0, attempts=0)
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE responses SET response = ?", (value,))
    strict = JudgeCache(path, mode="replay_strict")  # says why the entry is not used
    with pytest.raises(CacheMiss, match="has an unusable entry \\(unreadable: .*") as caught:
        strict.lookup(REQUEST, "b")
    assert reason in str(caught.value)
    assert cache.lookup(REQUEST, "b") is None and len(cache) == 0  # a miss: asked again, the row deleted
    assert cache.store(REQUEST, "b", GOOD) and cache.lookup(REQUEST, "b").text == "[[A]]"


FILES = {  # how the file is made -> the reason in the line
    "text": (lambda p: p.write_text("not SQLite\n" * 10), "file is not a database"),
    "fifo": (lambda p: make_special(p, "fifo"), "c.sqlite is a named pipe (FIFO), not a regular file"),
    "dev_zero": (lambda p: make_special(p, "dev_zero"), "c.sqlite is a character device, not a regular file"),
    "folder": (lambda p: make_special(p, "folder"), "c.sqlite is a folder, not a regular file"),
    "wal_fifo": (lambda p: (JudgeCache(p).close(), make_special(p.with_name("c.sqlite-wal"), "fifo")),
                 "c.sqlite-wal is a named pipe (FIFO)"),
    "shm_zero": (lambda p: (JudgeCache(p).close(), make_special(p.with_name("c.sqlite-shm"), "dev_zero")),
                 "c.sqlite-shm is a character device"),
    "other_table": (lambda p: sqlite3.connect(p).execute("CREATE TABLE responses (a, b)").connection.commit(),
                    "its responses table is not a judge cache's"),
    "garbage_pages": (lambda p: p.write_bytes(b"SQLite format 3\x00" + os.urandom(8192)), ""),
}


@pytest.mark.parametrize("mode", ["read_write", "read_only", "replay_strict"])
@pytest.mark.parametrize("kind", sorted(FILES))
def test_a_file_that_cannot_be_the_cache_is_one_line(tmp_path, kind, mode):
    path = tmp_path / "c.sqlite"
    make, reason = FILES[kind]
    make(path)
    with pytest.raises(CacheFileError) as caught:
        JudgeCache(path, mode=mode)
    line = str(caught.value)
    assert line.startswith(f"judge cache {path}: cannot be used as the response cache (") and reason in line, line
    assert line.endswith("); give a new file path or delete it") and "\n" not in line
