"""The ledger of a command's judge calls: one cache, the counts per judge, and each endpoint's health.

A command that scores with model judges (`marl run`, `rollout`, `credit`, `eval`) installs one
`JudgeLedger` for its whole duration (`install` / `installed`). Every `OpenAIBackend` built without a
cache of its own then consults it at call time, whoever built the backend (the training player, the
warm-up's environment, the evaluation, the counterfactual replays): a judgment already paid for is read
back from the cache, never asked again, and every answer is counted against the judge's name.

    calls        requests sent to the endpoint (each retry is one more)
    cache_hits   answers read back from the cache (no request sent)
    failures     answers that were not ok (after the retries): masked downstream, never cached as ok
    retries      of the calls, how many were retries

Endpoint health: an endpoint whose answers fail for endpoint reasons (a timeout, a refused connection,
HTTP 401/403/404/408/409/429 or 5xx) is marked failing with one line; the first answer it gives again is
one more line with the seconds it was failing and the seconds lost to those failed calls' retries. A
request the endpoint refused for its content (400, 413, 422, a malformed or oversized answer) says nothing
about the endpoint and changes no state. Lines go to `log` when given, else they wait for `drain()`
(the Ray backend's ledger actor has no terminal: the driver drains it every step).

The same request asked twice at once (two threads judging equal episodes, a replay beside its episode)
is sent once: the second `lookup` waits for the first caller's answer.

The ledger is plain Python (sqlite through JudgeCache) so that a Ray actor can hold it: on the Ray
backend one actor owns the ledger and its sqlite file (a single writer) and every process reaches it
through a handle with the same methods (trainers/ray/gates.py).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import replace

from common.text import printable
from judges.model.backend import ChatRequest, ChatResponse
from judges.model.cache import JudgeCache

COUNTS = ("calls", "cache_hits", "failures", "retries")
_ENDPOINT_CODES = re.compile(r"^(40[1348]|409|429|5\d\d):")
_ACTIVE = None  # the installed ledger (or a handle to the Ray actor holding it); None: no ledger


def endpoint_failure(response: ChatResponse) -> bool:
    """Whether a failed answer says the endpoint itself is failing (not that this request was refused)."""
    if response.status == "timeout":
        return True
    if response.status != "api_error":
        return False
    return response.error.startswith(("connection:", "timeout:")) or bool(_ENDPOINT_CODES.match(response.error))


def endpoint_of(identity: str) -> str:
    """The endpoint URL of a backend identity ('openai:MODEL@URL' -> URL)."""
    return identity.rpartition("@")[2] or identity


class JudgeLedger:
    """A cache (optional), counts per judge name and endpoint health (see the module docstring).

    cache: a JudgeCache, or None for counts only (`open_cache` may add one later). log: a function
    given each health line at once; None keeps them for `drain()`. clock: seconds (monotonic).
    """

    def __init__(self, cache: JudgeCache | None = None, log=None, clock=time.monotonic):
        self.cache, self.log, self.clock = cache, log, clock
        self._counts: dict[str, dict[str, int]] = {}
        self._health: dict[str, dict] = {}  # endpoint -> {"since", "lost_s", "failed", "error"} while failing
        self._lines: list[str] = []
        self._in_flight: dict[str, asyncio.Future] = {}  # request key -> its answer, while one caller asks
        self._lock = threading.Lock()  # answers are recorded on the judges' event loop, counts read elsewhere

    def open_cache(self, path: str, mode: str = "read_write") -> None:
        """Use the sqlite cache at `path` from now on (replacing any other); its folder is created."""
        previous, self.cache = self.cache, JudgeCache(path, mode)
        if previous is not None:
            previous.close()

    def close(self) -> None:
        """Close the cache file (the ledger still counts)."""
        if self.cache is not None:
            self.cache.close()
            self.cache = None

    async def lookup(self, request: ChatRequest, identity: str, judge: str) -> ChatResponse | None:
        """The cached answer to `request` on the backend `identity` (counted as a hit), or None: then the
        caller asks the endpoint and must `record` the answer (or `abandon`). A request already being asked
        (the same episode judged in two threads, a replay beside its episode) waits for that answer."""
        while True:
            cached = self.cache.lookup(request, identity) if self.cache is not None else None
            if cached is not None:
                self._add(judge, cache_hits=1)
                return cached
            key = request.key(identity)
            asked = self._in_flight.get(key)
            if asked is None:
                self._in_flight[key] = asyncio.get_running_loop().create_future()
                return None
            response = await asyncio.shield(asked)
            if response is not None:  # the one answer, shared: a hit when it is one, else the same failure
                self._add(judge, **({"cache_hits": 1} if response.status == "ok" else {"failures": 1}))
                return replace(response, cached=True, latency=0.0, attempts=0)
            # its asker gave up (cancelled): ask again

    async def record(self, request: ChatRequest, identity: str, judge: str, response: ChatResponse) -> None:
        """Count an answer the endpoint gave, cache it when it is a usable one, follow the endpoint's health."""
        failed = response.status != "ok"
        self._add(judge, calls=response.attempts, retries=max(0, response.attempts - 1), failures=int(failed))
        if self.cache is not None:
            self.cache.store(request, identity, response)  # stores ok and truncated answers only
        self._release(request.key(identity), response)
        self._follow_health(endpoint_of(identity), response)

    def abandon(self, request: ChatRequest, identity: str) -> None:
        """The caller of a `lookup` that returned None will not record an answer (it was cancelled)."""
        self._release(request.key(identity), None)

    def _release(self, key: str, response: ChatResponse | None) -> None:
        """Wake whoever waits for the answer to `key` (None: ask it yourselves)."""
        asked = self._in_flight.pop(key, None)
        if asked is not None and not asked.done():
            asked.set_result(response)

    def _add(self, judge: str, **amounts: int) -> None:
        with self._lock:
            counts = self._counts.setdefault(judge, dict.fromkeys(COUNTS, 0))
            for name, amount in amounts.items():
                counts[name] += amount

    def _follow_health(self, endpoint: str, response: ChatResponse) -> None:
        """One line when `endpoint` starts failing, one when it answers again (with the seconds lost)."""
        with self._lock:
            state = self._health.get(endpoint)
            if endpoint_failure(response):
                if state is None:
                    self._health[endpoint] = {"since": self.clock() - response.latency, "lost_s": response.latency,
                                              "failed": 1, "error": response.error}
                    line = (f"judge endpoint {endpoint} is failing: {printable(response.error)} (after {response.attempts} "
                            "tries); its judgments are masked until it answers again")
                else:
                    state["lost_s"] += response.latency
                    state["failed"] += 1
                    return
            elif state is not None:  # any other answer, even a refusal of this request, is the endpoint answering
                del self._health[endpoint]
                line = (f"judge endpoint {endpoint} recovered after {self.clock() - state['since']:.1f} s failing: "
                        f"{state['lost_s']:.1f} s lost to retries over {state['failed']} failed calls")
            else:
                return
        self._say(line)

    def _say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)
        else:
            with self._lock:
                self._lines.append(line)

    def counts(self) -> dict[str, dict[str, int]]:
        """{judge name: {calls, cache_hits, failures, retries}} since the ledger was made."""
        with self._lock:
            return {judge: dict(counts) for judge, counts in self._counts.items()}

    def failing(self) -> dict[str, str]:
        """{endpoint: its last error} of the endpoints failing now."""
        with self._lock:
            return {endpoint: state["error"] for endpoint, state in self._health.items()}

    def drain(self) -> list[str]:
        """The health lines not given to `log` yet (and forget them)."""
        with self._lock:
            lines, self._lines = self._lines, []
        return lines


def install(ledger) -> None:
    """Make `ledger` the one every cache-less OpenAIBackend of this process uses (None: none)."""
    global _ACTIVE
    _ACTIVE = ledger


def active():
    """The installed ledger (or handle), or None."""
    return _ACTIVE


@contextmanager
def installed(ledger):
    """`ledger` installed for the block; the one before it is restored after (and `ledger`'s cache closed)."""
    previous = _ACTIVE
    install(ledger)
    try:
        yield ledger
    finally:
        install(previous)
        if hasattr(ledger, "close"):
            ledger.close()


def format_counts(counts: dict[str, dict[str, int]]) -> str:
    """One readable line per judge: calls, cache hits and failures."""
    return "\n".join(f"judge {judge}: {c['calls']} calls to the endpoint ({c['retries']} retries), "
                     f"{c['cache_hits']} answers from the cache, {c['failures']} failures"
                     for judge, c in sorted(counts.items()))
