"""The contract between model judges and whatever answers their prompts (plain data, no openai import).

A `ChatBackend` turns one `ChatRequest` into one `ChatResponse`, asynchronously. Backends:
`judges.model.openai_backend.OpenAIBackend` (any OpenAI-compatible endpoint through `openai.AsyncOpenAI`,
or any object shaped like it, such as `judges.model.simulated.SimulatedClient`), and a local transformers
model served by `marl serve`. A response never raises for a model-side problem: failures come back
as a status (`api_error`, `timeout`, `truncated`, `refusal`), which judges turn into failed
Judgments (masked downstream, never scored 0).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import threading
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

RESPONSE_STATUSES = ("ok", "api_error", "timeout", "truncated", "refusal")
T = TypeVar("T")
MAX_RESPONSE_BYTES = 1_000_000  # the default cap on one answer (its HTTP body, or its text and logprobs)
LOGPROB_TOLERANCE = 1e-3  # a logprob a little above 0 is rounding noise (fp16 log_softmax); more is invalid


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion request.

    messages: ({"role": "system"|"user"|"assistant", "content": str}, ...).
    logprobs / top_logprobs: ask for the top alternatives of every generated token.
    seed: passed to the endpoint (best effort on hosted models).
    sample: which of several samples of the same prompt this is (never sent): at temperature > 0 each
    sample is its own cache entry, so asking for k samples gets k answers, not one answer k times.
    logit_bias: ((token id, bias), ...) added to those tokens' logits (OpenAI's `logit_bias`); the
    logprobs verdict boosts its label tokens with it where the token ids are known.
    verdict: the verdict mode the answer will be read in (`text` or `logprobs`, judges.model.verdict;
    never sent): part of the cache key, so one mode never reads an answer asked for the other.
    """

    messages: tuple[dict[str, str], ...]
    max_tokens: int = 512
    temperature: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0
    seed: int | None = None
    sample: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    verdict: str = "text"

    def key(self, backend_identity: str) -> str:
        """A content hash of the whole request and the backend's identity (the cache key). The sample
        index counts only at temperature > 0 (greedy samples are one answer), and only when it is not 0,
        so the keys of single-sample requests are those of caches written before it existed; likewise an
        empty logit_bias and the text verdict mode leave the key as it was before they existed."""
        fields = asdict(self)
        if fields.pop("sample") and self.temperature > 0:
            fields["sample"] = self.sample
        if not fields["logit_bias"]:
            del fields["logit_bias"]
        if fields["verdict"] == "text":
            del fields["verdict"]
        blob = json.dumps({"backend": backend_identity, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class ChatResponse:
    """What came back.

    status: one of RESPONSE_STATUSES; text is meaningful only when ok (or truncated).
    token_logprobs: per generated token, {token: logprob} of its top alternatives (None if absent).
    """

    status: str
    text: str = ""
    finish_reason: str | None = None
    token_logprobs: tuple[dict[str, float], ...] | None = None
    usage: dict[str, int] = field(default_factory=dict)
    latency: float = 0.0
    cached: bool = False
    error: str = ""
    attempts: int = 1

    def to_json(self) -> dict[str, Any]:
        """Plain data for the cache."""
        data = asdict(self)
        data["token_logprobs"] = list(self.token_logprobs) if self.token_logprobs is not None else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ChatResponse":
        """Inverse of to_json."""
        logprobs = data.get("token_logprobs")
        return cls(**{**data, "token_logprobs": tuple(logprobs) if logprobs is not None else None})


def response_size(response: ChatResponse) -> int:
    """About how many bytes the answer holds: its UTF-8 text plus its logprob tables."""
    size = len(response.text.encode("utf-8", "replace"))
    for alternatives in response.token_logprobs or ():
        size += sum(len(token.encode("utf-8", "replace")) + 8 for token in alternatives)
    return size


def _logprob_problem(token_logprobs) -> str | None:
    """Why the logprob tables cannot be probabilities (non-finite or above 0), or None when they can."""
    for position, alternatives in enumerate(token_logprobs or ()):
        for token, logprob in alternatives.items():
            if not isinstance(logprob, int | float) or isinstance(logprob, bool) or not math.isfinite(logprob):
                return f"logprob {logprob!r} of token {token!r} at position {position} is not a finite number"
            if logprob > LOGPROB_TOLERANCE:
                return (f"logprob {logprob!r} of token {token!r} at position {position} is above 0 "
                        "(a probability above 1)")
    return None


def response_problem(response: ChatResponse, max_bytes: int | None = MAX_RESPONSE_BYTES) -> str | None:
    """Why an answer must not be used as one (too large, or logprobs that are not probabilities), or None.

    Only answers with content (ok, truncated) are checked; failures already carry their reason.
    """
    if response.status not in ("ok", "truncated"):
        return None
    if max_bytes is not None and (size := response_size(response)) > max_bytes:
        return f"response too large: {size} bytes > the cap of {max_bytes} bytes (max_response_bytes)"
    problem = _logprob_problem(response.token_logprobs)
    return f"invalid response: {problem}" if problem else None


def checked_response(response: ChatResponse, max_bytes: int | None = MAX_RESPONSE_BYTES) -> ChatResponse:
    """`response`, or an api_error response saying why it cannot be used (never cached, never a score)."""
    problem = response_problem(response, max_bytes)
    if problem is None:
        return response
    return ChatResponse("api_error", error=problem, finish_reason=response.finish_reason, usage=response.usage,
                        latency=response.latency, cached=response.cached, attempts=response.attempts)


@runtime_checkable
class ChatBackend(Protocol):
    """Answers chat requests. `identity` names the model and endpoint (cache keys, calibrator binding)."""

    identity: str

    async def complete(self, request: ChatRequest) -> ChatResponse:
        """One request, one response; never raises for endpoint failures (see ChatResponse.status)."""
        ...


# -- running coroutines from sync code --------------------------------------------------------------------
_background_lock = threading.Lock()
_background_loop: asyncio.AbstractEventLoop | None = None


def _shared_loop() -> asyncio.AbstractEventLoop:
    """The background event loop used by run_sync (started on first use, a daemon thread)."""
    global _background_loop
    with _background_lock:
        if _background_loop is None or _background_loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="judges-run-sync", daemon=True).start()
            _background_loop = loop
        return _background_loop


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to completion from synchronous code and return its result.

    Every call runs on the same background event loop, so a backend (and its HTTP connection pool)
    can be used across many calls. Do not call it from a coroutine running on that loop.
    """
    loop = _shared_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coroutine.close()
        raise RuntimeError("run_sync was called from its own event loop; await the coroutine instead")
    future = asyncio.run_coroutine_threadsafe(coroutine, loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise
