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

A cached response comes back with `cached=True`, `latency=0.0` and `attempts=0` (no network work).
One connection serves the cache, guarded by a lock, in WAL mode; it may be used from any one thread
at a time (in practice the event loop thread of the backend).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

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
        """Open the database as the mode allows (None: nothing to read, nothing to write)."""
        if self.mode == "off":
            return None
        in_memory = self.path == ":memory:"
        if self.writable:
            if not in_memory:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            if not in_memory:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute(_SCHEMA)
            return connection
        if in_memory or not Path(self.path).exists():
            return None  # read-only and nothing there: every lookup misses
        uri = f"{Path(self.path).resolve().as_uri()}?mode=ro"
        return sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)

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

    def _decode(self, row: str | None) -> tuple[ChatResponse | None, str]:
        """(the cached response, "") or (None, why the stored entry is unusable; "" when there is none)."""
        if row is None:
            return None, ""
        try:
            data = json.loads(row)
            response = ChatResponse.from_json({**data, "cached": True, "latency": 0.0, "attempts": 0})
        except (ValueError, TypeError) as error:
            return None, f"unreadable: {error}"
        problem = response_problem(response, self.max_entry_bytes)
        return (None, problem) if problem else (response, "")

    def _delete(self, key: str) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.execute("DELETE FROM responses WHERE key = ?", (key,))

    def _fetch(self, key: str) -> str | None:
        with self._lock:
            if self._connection is None:
                return None
            try:
                row = self._connection.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
            except sqlite3.OperationalError:  # a read-only file without our table: an empty cache
                return None
        return row[0] if row else None

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
