"""`OpenAIBackend`: judge requests to any OpenAI-compatible Chat Completions endpoint.

The only module of the project that imports `openai`, and only inside `OpenAIBackend.__init__` when
it has to build a client itself (`import judges.model.openai_backend` stays light). Any object shaped like
`openai.AsyncOpenAI` works as `client` (attributes are read, openai's classes are never required),
for example `judges.model.simulated.SimulatedClient`.

What one `complete(request)` does, in order:
  1. cache lookup (`judges.model.cache.JudgeCache`; `replay_strict` raises CacheMiss on a miss);
  2. per attempt: the concurrency semaphore (`max_concurrency` requests in flight at most), then the
     token bucket (`requests_per_second`, burst 1: N sends take at least (N-1)/R seconds), then the
     call under a per-request timeout (`timeout_s`, also given to a client built here);
  3. errors are classified: 408/409/429/5xx, connection errors and timeouts are retried up to
     `max_retries` times with exponential backoff (`backoff_s * 2**k`, jitter x[0.75, 1.25] from a
     seeded random.Random, capped at `max_backoff_s`), or exactly the server's `Retry-After`
     (seconds, milliseconds via `retry-after-ms`, or an HTTP date; capped at `max_retry_after_s`);
     anything else (400 incl. context length, 401, 403, 404 unknown model, 422, a malformed body)
     fails at once. Failures come back as statuses, never as exceptions: `api_error` with
     error "<status code>: <message>", or `timeout` when the last attempt timed out;
  4. the answer is parsed: `finish_reason == "length"` -> `truncated` (text kept), `message.refusal`
     or `finish_reason == "content_filter"` -> `refusal`, else `ok`; `choices[0].logprobs.content[i]
     .top_logprobs` -> `token_logprobs[i] = {token: logprob}`; `usage` -> dict of ints;
  5. the answer is checked (`judges.model.backend.checked_response`): one larger than `max_response_bytes`
     (default 1 MB), or with a logprob that is NaN, infinite or above 0 (e.g. 800, which would
     overflow exp), becomes `api_error` ("response too large: ..." / "invalid response: ..."): a
     failed judgment, never a score, never cached, so a rerun asks again. A client built here also
     refuses the body on the wire: a Content-Length above the cap, or more bytes than the cap while
     reading, stops the download (no retry: the same request would get the same answer);
  6. ok/truncated responses are written to the cache.
A judge's backend (one given a `label`, the judge's name) with no cache of its own uses the ledger
installed for the command at call time (`judges.model.ledger`): its cache, and its counts under the label.
`probe()` asks the endpoint once whether it answers at all (fail fast before a long job).

`stats`: {"calls": network attempts made, "cache_hits", "retries", "failed": responses returned with
a status other than ok}. The SDK's own retries are off (`max_retries=0`): this loop is the only one.

An async client (and its connection pool) belongs to one event loop. A client built here is rebuilt when
the backend is next used from another loop (so `asyncio.run` per call works); a client passed in is
not, so drive such a backend from one loop, e.g. through `run_sync`, which runs every coroutine on one
shared background loop.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from common.text import printable
from judges.model.backend import MAX_RESPONSE_BYTES, ChatRequest, ChatResponse, checked_response
from judges.model import ledger as ledgers
from judges.model.cache import JudgeCache

from judges.model.openai_wire import ERROR_CHARS, capped_http_client, classify_error, parse_completion, with_cause


from judges.model.backend import run_sync  # noqa: E402,F401 - re-exported; one shared loop for every judge


# -- rate limiting -----------------------------------------------------------------------------------------
# Where requests to one endpoint are limited: None, each backend limits itself (its semaphore and
# bucket); else a function (identity, requests_per_second, max_concurrency, hold_s) -> a gate with async
# `acquire() -> lease` and `release(lease)`, shared by every backend of that endpoint, which takes back a
# lease not returned within hold_s seconds (its holder died). The Ray backend sets it in the driver and in
# every worker, so the limits hold across the cluster, not per process (trainers/ray/gates.py).
_GATE_PROVIDER = None
GATE_HOLD_MARGIN_S = 30.0  # a lease outlives the request timeout by this much before it counts as lost


def share_endpoint_limits(provider) -> None:
    """Route every OpenAIBackend's concurrency and rate limit through `provider` (None: each its own)."""
    global _GATE_PROVIDER
    _GATE_PROVIDER = provider


class TokenBucket:
    """A token bucket (GCRA form): `rate` sends per second with bursts of at most `burst`.

    Reservations are made synchronously inside the event loop, so no lock is needed and the bucket
    works on whatever loop awaits it.
    """

    def __init__(self, rate: float, burst: int = 1):
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1 (got {rate}, {burst})")
        self.interval = 1.0 / rate
        self.tolerance = (burst - 1) * self.interval
        self._theoretical_arrival = 0.0

    def reserve(self, now: float) -> float:
        """Reserve one send at or after `now`; returns how long to wait before sending."""
        arrival = max(self._theoretical_arrival, now)
        send_at = max(now, arrival - self.tolerance)
        self._theoretical_arrival = arrival + self.interval
        return send_at - now

    async def acquire(self) -> None:
        """Wait for a token."""
        wait = self.reserve(time.monotonic())
        if wait > 0:
            await asyncio.sleep(wait)


async def _awaited(value):
    """`value`, awaited when it is awaitable (a ledger behind a Ray actor answers with awaitables)."""
    return await value if asyncio.iscoroutine(value) or asyncio.isfuture(value) else value


# -- the backend -----------------------------------------------------------------------------------------------
def _check_settings(max_concurrency: int, max_retries: int, timeout_s: float, max_response_bytes: int) -> None:
    """ValueError naming the first setting out of range."""
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency!r}")
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries!r}")
    if max_response_bytes < 1:
        raise ValueError(f"max_response_bytes must be >= 1, got {max_response_bytes!r}")


class OpenAIBackend:
    """A `ChatBackend` over an OpenAI-compatible endpoint (see the module docstring).

    client: an `openai.AsyncOpenAI` or any object shaped like it; None builds
    `openai.AsyncOpenAI(base_url=base_url, api_key=os.environ.get(api_key_env) or "EMPTY",
    max_retries=0, timeout=timeout_s)`.
    identity: f"openai:{model}@{base_url or client.base_url}" (cache keys, calibrator binding).
    seed: seeds the backoff jitter.
    max_response_bytes: the largest answer accepted (on the wire for a client built here, and as text
    plus logprobs for any client); a larger one is an api_error, never cached.
    """

    def __init__(self, client: Any = None, *, model: str, base_url: str | None = None,
                 api_key_env: str = "OPENAI_API_KEY", max_concurrency: int = 8,
                 requests_per_second: float | None = None, timeout_s: float = 60.0, max_retries: int = 4,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0, max_retry_after_s: float = 60.0,
                 seed: int = 0, cache: JudgeCache | None = None, max_response_bytes: int = MAX_RESPONSE_BYTES,
                 label: str | None = None):
        _check_settings(max_concurrency, max_retries, timeout_s, max_response_bytes)
        self._owns_client = client is None
        self.max_response_bytes = int(max_response_bytes)
        self._client_settings = {"base_url": base_url, "api_key_env": api_key_env, "timeout_s": timeout_s}
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self.client = client if client is not None else self._build_client()
        self.model = model
        self.base_url = str(base_url or getattr(self.client, "base_url", "") or "").rstrip("/")
        self.identity = f"openai:{model}@{self.base_url}"
        # a judge's backend is labelled with the judge's name: only those use the installed ledger (an agent
        # played by an endpoint samples; its answers are not judgments to read back)
        self.label = label
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.cache = cache
        self.requests_per_second = requests_per_second
        self.bucket = TokenBucket(requests_per_second) if requests_per_second else None
        self._gate = None
        self._shared_gate()  # made now where a provider is set, so the process that builds a judge owns it
        self.stats = {"calls": 0, "cache_hits": 0, "retries": 0, "failed": 0}
        self._rng = random.Random(seed)
        self._semaphore: asyncio.Semaphore | None = None
        self._semaphore_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"OpenAIBackend({self.identity!r}, max_concurrency={self.max_concurrency})"

    def __getstate__(self) -> dict:
        """What travels to another process (a Ray worker): the settings, never a live client, loop or
        semaphore; a client built here is built again there. A client passed in cannot travel."""
        if not self._owns_client:
            raise TypeError(f"{self!r} was given its client, which cannot be sent to another process; "
                            "let the backend build its own (client=None)")
        state = dict(self.__dict__)
        state.update(client=None, _client_loop=None, _semaphore=None, _semaphore_loop=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.client = self._build_client()

    def _build_client(self) -> Any:
        """An openai.AsyncOpenAI from this backend's settings (the SDK's own retries off)."""
        import openai  # the project's only openai import

        settings = self._client_settings
        return openai.AsyncOpenAI(base_url=settings["base_url"],
                                  api_key=os.environ.get(settings["api_key_env"]) or "EMPTY", max_retries=0,
                                  timeout=settings["timeout_s"],
                                  http_client=capped_http_client(openai, self.max_response_bytes))

    def _client_for_running_loop(self) -> Any:
        """The client; one built here is rebuilt when the backend is driven from a new event loop (an async
        connection pool cannot outlive its loop, e.g. across asyncio.run calls). A client passed in is
        used as is."""
        loop = asyncio.get_running_loop()
        if self._owns_client and self._client_loop is not None and self._client_loop is not loop:
            self.client = self._build_client()
        self._client_loop = loop
        return self.client

    def _slots(self) -> asyncio.Semaphore:
        """The concurrency semaphore of the running loop (rebuilt if the backend moves to another loop)."""
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._semaphore_loop is not loop:
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
            self._semaphore_loop = loop
        return self._semaphore

    def _request_arguments(self, request: ChatRequest) -> dict[str, Any]:
        """Keyword arguments of chat.completions.create for `request`."""
        arguments: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in request.messages],
                                     "max_tokens": request.max_tokens, "temperature": request.temperature}
        if request.seed is not None:
            arguments["seed"] = request.seed
        if request.logprobs:
            arguments["logprobs"] = True
            if request.top_logprobs:
                arguments["top_logprobs"] = request.top_logprobs
        if request.logit_bias:  # OpenAI's wire form: token id (as a string) -> bias
            arguments["logit_bias"] = {str(token): bias for token, bias in request.logit_bias}
        return arguments

    def _shared_gate(self):
        """The gate this endpoint's requests share with other processes (None: the limits are local)."""
        if self._gate is None and _GATE_PROVIDER is not None:
            # a slot is held for one attempt, which the timeout bounds: a lease older than that is a lost one
            self._gate = _GATE_PROVIDER(self.identity, self.requests_per_second, self.max_concurrency,
                                        self.timeout_s + GATE_HOLD_MARGIN_S)
        return self._gate

    async def _attempt(self, request: ChatRequest) -> Any:
        """One network call: a concurrency slot, a rate token, the call under the timeout (slot and
        token from the shared gate when one is set: `share_endpoint_limits`)."""
        gate = self._shared_gate()
        if gate is not None:
            lease = await gate.acquire()
            try:
                self.stats["calls"] += 1
                create = self._client_for_running_loop().chat.completions.create(**self._request_arguments(request))
                return await asyncio.wait_for(create, timeout=self.timeout_s)
            finally:
                await gate.release(lease)
        async with self._slots():
            if self.bucket is not None:
                await self.bucket.acquire()
            self.stats["calls"] += 1
            create = self._client_for_running_loop().chat.completions.create(**self._request_arguments(request))
            return await asyncio.wait_for(create, timeout=self.timeout_s)

    def _retry_delay(self, retry_number: int, retry_after: float | None) -> float:
        """Seconds before retry number `retry_number` (1-based)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s)
        delay = self.backoff_s * 2 ** (retry_number - 1) * (0.75 + 0.5 * self._rng.random())
        return min(delay, self.max_backoff_s)

    async def _complete_uncached(self, request: ChatRequest) -> ChatResponse:
        """Call with retries; failures become statuses."""
        start = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            try:
                completion = await self._attempt(request)
            except Exception as exc:  # noqa: BLE001 - every endpoint failure becomes a status
                failure = classify_error(exc)
                if failure.retryable and attempts <= self.max_retries:
                    self.stats["retries"] += 1
                    await asyncio.sleep(self._retry_delay(attempts, failure.retry_after))
                    continue
                return ChatResponse(failure.status, error=failure.error, latency=time.monotonic() - start,
                                    attempts=attempts)
            try:
                response = parse_completion(completion, latency=time.monotonic() - start, attempts=attempts)
                return checked_response(response, self.max_response_bytes)
            except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError) as exc:
                error = printable(f"malformed response: {type(exc).__name__}: {exc}", ERROR_CHARS)
                return ChatResponse("api_error", error=error, latency=time.monotonic() - start, attempts=attempts)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        """One request, one response (cache first); never raises for endpoint failures.

        Raises judges.model.cache.CacheMiss when the cache is in replay_strict mode and has no entry.
        """
        # read at call time: a command installs its ledger after some judges are built
        ledger = ledgers.active() if self.cache is None and self.label is not None else None
        cached = await self._lookup(request, ledger)
        if cached is not None:
            self.stats["cache_hits"] += 1
            return cached
        try:
            response = await self._complete_uncached(request)
        except BaseException:  # cancelled: whoever waits on this request in the ledger asks it again
            if ledger is not None:
                ledger.abandon(request, self.identity)
            raise
        if response.status != "ok":
            self.stats["failed"] += 1
        if self.cache is not None:
            self.cache.store(request, self.identity, response)
        elif ledger is not None:
            await _awaited(ledger.record(request, self.identity, self.label, response))
        return response

    async def _lookup(self, request: ChatRequest, ledger) -> ChatResponse | None:
        """The cached answer from this backend's cache, else from the installed ledger (None: ask)."""
        if self.cache is not None:
            return self.cache.lookup(request, self.identity)
        if ledger is not None:
            return await _awaited(ledger.lookup(request, self.identity, self.label))
        return None

    async def probe(self, timeout_s: float = 10.0) -> str | None:
        """Whether the endpoint answers at all: None, or the error (one line). Lists its models (no tokens
        spent, nothing a judgment could reuse); an endpoint without that route (404) is asked for one token.
        No retries: a probe is there to fail fast."""
        client = self._client_for_running_loop()
        try:
            page = await asyncio.wait_for(client.models.list(), timeout=min(timeout_s, self.timeout_s))
            return self._unlisted_model(page)
        except Exception as exc:  # noqa: BLE001 - every failure is the probe's answer
            failure = classify_error(exc)
            if not failure.error.startswith("404:"):
                return with_cause(failure.error, exc)
        try:
            create = client.chat.completions.create(model=self.model, max_tokens=1,
                                                    messages=[{"role": "user", "content": "Say OK."}])
            await asyncio.wait_for(create, timeout=min(timeout_s, self.timeout_s))
            return None
        except Exception as exc:  # noqa: BLE001
            return with_cause(classify_error(exc).error, exc)

    def _unlisted_model(self, page) -> str | None:
        """A 404-style error when the endpoint lists its models and this judge's model is not among them
        (vLLM, SGLang, Ollama and hosted APIs list every name they serve, LoRA adapters included); None
        when it is listed or the listing is empty (an endpoint that lists nothing says nothing)."""
        served = [str(getattr(model, "id", "")) for model in (getattr(page, "data", None) or [])]
        served = [name for name in served if name]
        if not served or self.model in served:
            return None
        shown = ", ".join(served[:8]) + (f" and {len(served) - 8} more" if len(served) > 8 else "")
        return printable(f"404: model {self.model!r} is not served there (it serves {shown})", ERROR_CHARS)

    async def complete_many(self, requests: Sequence[ChatRequest],
                            progress: Callable[[int, int], None] | None = None) -> list[ChatResponse]:
        """All `requests` concurrently (at most max_concurrency in flight), answers in order.

        progress(done, total) is called after each response.
        """
        total = len(requests)
        done = 0

        async def one(request: ChatRequest) -> ChatResponse:
            nonlocal done
            response = await self.complete(request)
            done += 1
            if progress is not None:
                progress(done, total)
            return response

        return list(await asyncio.gather(*(one(request) for request in requests)))

    async def aclose(self) -> None:
        """Close the client if this backend built it."""
        if self._owns_client and hasattr(self.client, "close"):
            await self.client.close()
