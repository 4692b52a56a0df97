"""A content-addressed, on-disk cache of judge responses (stdlib sqlite3, no heavy imports).

Key: `ChatRequest.key(backend.identity)`, a sha256 over the backend identity (model and endpoint) and
the whole request (messages, so the rendered prompt template and candidate order; max_tokens,
temperature, logprobs flags, seed, the sample index at temperature > 0, the logit bias and the verdict
mode when they are not the defaults). Value:
`ChatResponse.to_json()`.

Modes (`CACHE_MODES`):
  off            never read, never write (nothing is opened on disk)
  read_write     read before a call, write after a cacheable response (the default)
  read_only      read, never write (the database is opened read-only by SQLite itself)
  replay_strict  read; a miss raises `CacheMiss` naming the request. For offline tests and
                 reproducible re-scoring: a replay that would need the network fails loudly.

What is cached (`CACHEABLE_STATUSES`): `ok` and `truncated` responses — both are complete model
outputs that depend only on the request (a truncation is a function of max_tokens), so replaying them
reproduces the original run. Failures (`api_error`, `timeout`) are never cached: they say nothing
about the request and asking again may succeed. Refusals are not cached either: provider-side
moderation is not a stable function of the request, so a refusal is asked again next time.

Nothing that is not a usable answer is stored or served: a response whose logprobs are NaN,
infinite or above 0, or whose text and logprobs exceed `max_entry_bytes` (default 1 MB, the
backend's default answer cap), is refused by `store` (so the cache cannot grow from huge answers), and
such an entry written by an older version is a miss on `lookup` (deleted in read_write mode), so the
request is asked again. Entries are strict JSON (no NaN or Infinity).

The file may come from anyone (--cache, --judge-cache, a run folder's judge_cache.sqlite), so it is read
as untrusted. Before SQLite opens it, the file and its -wal, -shm and -journal siblings must be regular
files (a FIFO would hang SQLite's reads, /dev/zero never ends) and a non-empty file must start with
SQLite's header; a database that is damaged or holds a `responses` table of other columns is refused too:
each is a `CacheFileError`, one line. A row is fetched only up to a size bound and must be strict JSON
(no NaN), bounded in nesting and digits (common/files.py), with every field of the type `store` writes;
anything else (nested 100,000 deep, a 5,000-digit integer, a number where the text goes, a BLOB, NULL)
is an unusable entry like the ones above: a miss, asked again, never a traceback or a wrong number.

A cached response comes back with `cached=True`, `latency=0.0` and `attempts=0` (no network work).
One connection serves the cache, guarded by a lock, in WAL mode; it may be used from any one thread
at a time (in practice the event loop thread of the backend).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path

from common.files import FileProblem, parse_json_line, read_user_head, user_file_problem
from judges.model.backend import MAX_RESPONSE_BYTES, ChatRequest, ChatResponse, response_problem

CACHE_MODES = ("off", "read_write", "read_only", "replay_strict")
CACHEABLE_STATUSES = ("ok", "truncated")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    identity TEXT NOT NULL,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    response TEXT NOT NULL,
    created REAL NOT NULL
)
"""


class CacheMiss(LookupError):
    """A `replay_strict` cache had no entry for a request."""


class CacheFileError(ValueError):
    """The cache file cannot be used: not a regular file (a FIFO would hang SQLite's reads), not an SQLite
    database, or one whose `responses` table is not this cache's. One line; `reason` without the path."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"judge cache {path}: cannot be used as the response cache ({reason}); give a new file "
                         "path or delete it")


def _preview(request: ChatRequest, limit: int = 120) -> str:
    """The start of the last user message (to name a request in errors)."""
    users = [message.get("content", "") for message in request.messages if message.get("role") == "user"]
    text = (users[-1] if users else "").replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


class JudgeCache:
    """SQLite cache of `ChatResponse`s keyed by request and backend identity.

    path: the database file (parent folders are created in writable modes); ":memory:" for a
    throwaway cache. mode: one of CACHE_MODES. max_entry_bytes: the largest answer stored or served.
    """

    def __init__(self, path: str | Path, mode: str = "read_write", max_entry_bytes: int = MAX_RESPONSE_BYTES):
        if mode not in CACHE_MODES:
            raise ValueError(f"cache mode {mode!r} is not one of {CACHE_MODES}")
        self.path = str(path)
        self.mode = mode
        self.max_entry_bytes = int(max_entry_bytes)
        self.refused = 0  # responses store() would not keep (invalid or too large)
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self._lock = threading.Lock()
        self._connection = self._connect()

    # -- properties ----------------------------------------------------------------------------------------
    @property
    def readable(self) -> bool:
        """Whether lookups consult the database."""
        return self.mode != "off"

    @property
    def writable(self) -> bool:
        """Whether responses are stored."""
        return self.mode == "read_write"

    # -- connection ----------------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection | None:
        """Open the database as the mode allows (None: nothing to read, nothing to write); CacheFileError when
        the file cannot be this cache (checked before SQLite opens it: see `_file_problem`)."""
        if self.mode == "off":
            return None
        in_memory = self.path == ":memory:"
        if not in_memory and (problem := _file_problem(Path(self.path))) is not None:
            raise CacheFileError(self.path, problem)
        if not self.writable and (in_memory or not Path(self.path).exists()):
            return None  # read-only and nothing there: every lookup misses
        try:
            return self._open(in_memory)
        except sqlite3.Error as error:  # a corrupt file past its header, a table of another schema
            raise CacheFileError(self.path, str(error).splitlines()[0] if str(error) else "not readable") from None

    def _open(self, in_memory: bool) -> sqlite3.Connection:
        """The connection: created with the schema in read_write mode, read-only (SQLite's mode=ro) else."""
        if not self.writable:
            uri = f"{Path(self.path).resolve().as_uri()}?mode=ro"
            connection = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
            connection.execute("PRAGMA trusted_schema=OFF")  # the file's triggers and views call no function
            _check_schema(connection)
            return connection
        if not in_memory:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        connection.execute("PRAGMA trusted_schema=OFF")
        if not in_memory:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute(_SCHEMA)
        _check_schema(connection)
        return connection

    def close(self) -> None:
        """Close the database (the cache then behaves as empty and read-only)."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def __enter__(self) -> "JudgeCache":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- lookups and writes --------------------------------------------------------------------------------
    def lookup(self, request: ChatRequest, identity: str) -> ChatResponse | None:
        """The cached response for `request` on the backend `identity`, or None.

        Raises CacheMiss in `replay_strict` mode when there is no entry.
        """
        if not self.readable:
            return None
        key = request.key(identity)
        response, why = self._decode(self._fetch(key))
        if response is None:
            self.misses += 1
            if why and self.writable:
                self._delete(key)
            if self.mode == "replay_strict":
                reason = f"an unusable entry ({why})" if why else "no response"
                raise CacheMiss(f"replay_strict cache {self.path!r} has {reason} for backend {identity!r}, "
                                f"request key {key[:16]}..., last user message: {_preview(request)!r}")
            return None
        self.hits += 1
        return response

    def _decode(self, row: tuple | None) -> tuple[ChatResponse | None, str]:
        """(the cached response, "") or (None, why the stored entry is unusable; "" when there is none).

        The file may be anyone's (--cache, --judge-cache, a run folder's judge_cache.sqlite), so an entry is
        read as untrusted: over the size bound it is not fetched; it must be strict JSON (no NaN), bounded in
        nesting and digits (common/files.py), with every field of the type `store` writes. Anything else is
        an unusable entry: a miss, asked again (and deleted in read_write mode), never a traceback."""
        if row is None:
            return None, ""
        text, size = row
        if text is None:  # SQL NULL, or an entry the SELECT did not fetch for its size
            return None, "unreadable: " + ("NULL" if size is None else f"an entry of {size:,} bytes, over the "
                                                                        f"{self._row_limit():,} bytes read")
        try:  # SQLite keeps any type in any column: a BLOB of other bytes, a number
            data = parse_json_line(self.path, 0, text.decode("utf-8") if isinstance(text, bytes) else text)
        except FileProblem as problem:
            return None, f"unreadable: {problem.reason.split('; ')[0]}"
        except (UnicodeDecodeError, TypeError):  # json.loads of an int is a TypeError
            return None, "unreadable: not UTF-8 JSON text"
        if (problem := entry_problem(data)) is not None:
            return None, f"unreadable: {problem}"
        response = ChatResponse.from_json({**data, "cached": True, "latency": 0.0, "attempts": 0})
        problem = response_problem(response, self.max_entry_bytes)
        return (None, problem) if problem else (response, "")

    def _row_limit(self) -> int:
        """The most bytes of one entry fetched: JSON of an answer at the entry cap, with room to spare (a
        logprob table's JSON is a few times its `response_size`)."""
        return 8 * self.max_entry_bytes + (64 << 10)

    def _delete(self, key: str) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.execute("DELETE FROM responses WHERE key = ?", (key,))

    def _fetch(self, key: str) -> tuple | None:
        """(the entry's text, or None when it is over `_row_limit`; its size in bytes), or None: no entry."""
        size = "length(CAST(response AS BLOB))"
        query = f"SELECT CASE WHEN {size} <= ? THEN response END, {size} FROM responses WHERE key = ?"
        with self._lock:
            if self._connection is None:
                return None
            try:
                row = self._connection.execute(query, (self._row_limit(), key)).fetchone()
            except sqlite3.DatabaseError:  # a read-only file without our table, a damaged page: a miss
                return None
        return tuple(row) if row else None

    def store(self, request: ChatRequest, identity: str, response: ChatResponse) -> bool:
        """Store `response` if the mode writes and its status is cacheable; True when stored."""
        if not self.writable or response.status not in CACHEABLE_STATUSES:
            return False
        if response_problem(response, self.max_entry_bytes) is not None:
            self.refused += 1
            return False
        try:
            blob = json.dumps({**response.to_json(), "cached": False}, allow_nan=False)
        except (TypeError, ValueError):  # a usage count or text that is not plain JSON
            self.refused += 1
            return False
        request_blob = json.dumps({"messages": list(request.messages), "max_tokens": request.max_tokens,
                                   "temperature": request.temperature, "logprobs": request.logprobs,
                                   "top_logprobs": request.top_logprobs, "seed": request.seed,
                                   "sample": request.sample, "logit_bias": list(request.logit_bias),
                                   "verdict": request.verdict})
        with self._lock:
            if self._connection is None:
                return False
            self._connection.execute(
                "INSERT OR REPLACE INTO responses (key, identity, status, request, response, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (request.key(identity), identity, response.status, request_blob, blob, time.time()))
        self.writes += 1
        return True

    def __len__(self) -> int:
        with self._lock:
            if self._connection is None:
                return 0
            try:
                return int(self._connection.execute("SELECT COUNT(*) FROM responses").fetchone()[0])
            except sqlite3.OperationalError:
                return 0

    def clear(self) -> None:
        """Delete every entry (only in read_write mode)."""
        if not self.writable:
            raise RuntimeError(f"cannot clear a cache opened in mode {self.mode!r}")
        with self._lock:
            if self._connection is not None:
                self._connection.execute("DELETE FROM responses")

    def __repr__(self) -> str:
        return f"JudgeCache({self.path!r}, mode={self.mode!r})"


def _file_problem(path: Path) -> str | None:
    """Why the file at `path` (and its -wal, -shm, -journal siblings, which SQLite opens too) cannot be an SQLite
    database, or None: a FIFO or a device would hang or flood SQLite's reads, a file of other bytes is not a
    database (SQLite would say so only at the first query, mid-run). A missing or empty file is a new cache."""
    for candidate in (path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal"))):
        if os.path.lexists(candidate) and (problem := user_file_problem(candidate, "a file path")) is not None:
            return f"{candidate.name} {problem.split('; ')[0]}"
    if not os.path.lexists(path) or path.stat().st_size == 0:
        return None
    try:
        header = read_user_head(path, len(SQLITE_HEADER), "a file path")
    except FileProblem as problem:
        return problem.reason.split("; ")[0]
    return None if header == SQLITE_HEADER else "file is not a database"


def _check_schema(connection: sqlite3.Connection) -> None:
    """sqlite3.Error when the database holds a `responses` table without this cache's columns (a lookup would
    miss for ever and every store fail mid-run); a database without one is fine (created, or read as empty)."""
    columns = {row[1] for row in connection.execute("PRAGMA table_info(responses)")}
    if columns and not RESPONSE_COLUMNS <= columns:
        raise sqlite3.DatabaseError("its responses table is not a judge cache's (other columns)")


def entry_problem(data) -> str | None:
    """Why a decoded cache entry is not a response `store` writes (a field missing or of another type), or None."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if (unknown := set(data) - set(ENTRY_FIELDS) - {"status"}):
        return f"unknown field {sorted(unknown)[0][:40]!r}"
    if data.get("status") not in CACHEABLE_STATUSES:
        return f"status {str(data.get('status'))[:40]!r} is not a cached answer's"
    wrong = next((name for name, ok in ENTRY_FIELDS.items() if name in data and not ok(data[name])), None)
    return None if wrong is None else f"its {wrong} is not of the type a cached answer has"


def _number(value, kinds=(int, float)) -> bool:
    """A JSON number of `kinds` that is no bool and converts to a float: an integer of 400 digits (which the
    digit bound lets through) would make math.isfinite raise OverflowError in response_problem."""
    return isinstance(value, kinds) and not isinstance(value, bool) and (isinstance(value, float) or abs(value) < 2**63)


def _str_to(kinds) -> object:
    """A check that a value is an object of str -> a number of `kinds`."""
    return lambda value: isinstance(value, dict) and all(
        isinstance(key, str) and _number(item, kinds) for key, item in value.items())


# the fields of ChatResponse.to_json() and the check of each (status is checked against CACHEABLE_STATUSES)
ENTRY_FIELDS = {
    "text": lambda value: isinstance(value, str),
    "finish_reason": lambda value: value is None or isinstance(value, str),
    "token_logprobs": lambda value: value is None or isinstance(value, list) and all(map(_str_to((int, float)), value)),
    "usage": _str_to((int,)),
    "latency": _number,
    "cached": lambda value: isinstance(value, bool),
    "error": lambda value: isinstance(value, str),
    "attempts": lambda value: _number(value, (int,)),
}
RESPONSE_COLUMNS = {"key", "identity", "status", "request", "response", "created"}
SQLITE_HEADER = b"SQLite format 3\x00"
