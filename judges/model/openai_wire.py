"""What crosses the wire to an OpenAI-compatible endpoint: the response size cap, the classification of
errors (retryable or terminal, Retry-After) and the parsing of a Chat Completion into a ChatResponse.

Used by `judges.model.openai_backend.OpenAIBackend`; no `openai` import here (the SDK module is passed
in where its HTTP client is needed).
"""

from __future__ import annotations

import asyncio
import email.utils
import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from common.text import printable
from judges.model.backend import ChatResponse

RETRYABLE_STATUS_CODES = frozenset({408, 409, 429})
ERROR_CHARS = 500  # of an error's text: the endpoint's own words are shown as one line of plain text


# -- the response size cap on the wire ---------------------------------------------------------------------
class ResponseTooLarge(Exception):
    """An endpoint sent (or announced) more bytes than the backend's `max_response_bytes`."""


def _httpx_module(openai_module: Any) -> Any:
    """The HTTP library the installed openai SDK is built on (httpx, or its fork httpx2)."""
    client_class = openai_module.DefaultAsyncHttpxClient
    base = next(c for c in client_class.__mro__ if c.__name__ == "AsyncClient")
    return importlib.import_module(base.__module__.split(".")[0])


def capped_http_client(openai_module: Any, max_bytes: int) -> Any:
    """An SDK-default async HTTP client whose responses stop at `max_bytes` (ResponseTooLarge).

    The cap is on the bytes received, so the answer is asked uncompressed (Accept-Encoding: identity):
    a compressed body could otherwise expand far past what was counted.
    """
    httpx = _httpx_module(openai_module)

    class CappedStream(httpx.AsyncByteStream):
        def __init__(self, inner):
            self.inner, self.received = inner, 0

        async def __aiter__(self):
            async for chunk in self.inner:
                self.received += len(chunk)
                if self.received > max_bytes:
                    raise ResponseTooLarge(f"response too large: more than {max_bytes} bytes "
                                           "(max_response_bytes); the download was stopped")
                yield chunk

        async def aclose(self):
            await self.inner.aclose()

    class CappedTransport(httpx.AsyncBaseTransport):
        def __init__(self):
            limits = getattr(openai_module, "DEFAULT_CONNECTION_LIMITS", None)  # the SDK's pool, not httpx's
            self.inner = httpx.AsyncHTTPTransport(limits=limits) if limits is not None else httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request):
            response = await self.inner.handle_async_request(request)
            announced = response.headers.get("content-length", "")
            if announced.isdigit() and int(announced) > max_bytes:
                await response.aclose()
                raise ResponseTooLarge(f"response too large: Content-Length {announced} bytes > the cap of "
                                       f"{max_bytes} bytes (max_response_bytes)")
            response.stream = CappedStream(response.stream)
            return response

        async def aclose(self):
            await self.inner.aclose()

    return openai_module.DefaultAsyncHttpxClient(transport=CappedTransport(), headers={"Accept-Encoding": "identity"})


def _too_large(exc: BaseException) -> ResponseTooLarge | None:
    """The ResponseTooLarge behind `exc` (the SDK may wrap it), or None."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ResponseTooLarge):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


# -- error classification ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Failure:
    """A classified exception: the status it ends in, whether to retry, the error text, Retry-After."""

    status: str
    retryable: bool
    error: str
    retry_after: float | None = None


def _header(headers: Any, name: str) -> str | None:
    """A header value from httpx-style or plain-dict headers, case-insensitively."""
    if headers is None:
        return None
    value = headers.get(name) if hasattr(headers, "get") else None
    if value is None and isinstance(headers, Mapping):
        value = next((v for k, v in headers.items() if str(k).lower() == name), None)
    return None if value is None else str(value)


def parse_retry_after(headers: Any, now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `Retry-After` as seconds or an HTTP date (None if absent)."""
    milliseconds = _header(headers, "retry-after-ms")
    if milliseconds is not None:
        try:
            return max(0.0, float(milliseconds) / 1000.0)
        except ValueError:
            pass
    value = _header(headers, "retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    current = datetime.now(timezone.utc).timestamp() if now is None else now
    return max(0.0, when.timestamp() - current)


def _error_message(exc: BaseException) -> str:
    """The server's message when the error carries one, else the exception text."""
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and inner.get("message"):
            return str(inner["message"])
    return str(getattr(exc, "message", None) or exc or type(exc).__name__)


def classify_error(exc: BaseException) -> Failure:
    """Retryable (408/409/429/5xx, connection, timeout) or terminal (everything else). The error text
    carries the server's words: it is made one line of plain text, at most ERROR_CHARS (escape sequences
    and control characters removed, common.text), as it is printed, logged and written into reports."""
    failure = _classify(exc)
    return replace(failure, error=printable(failure.error, ERROR_CHARS))


def _classify(exc: BaseException) -> Failure:
    name = type(exc).__name__
    if (too_large := _too_large(exc)) is not None:
        return Failure("api_error", False, str(too_large))
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) or "Timeout" in name:
        return Failure("timeout", True, f"timeout: {_error_message(exc)}")
    code = getattr(exc, "status_code", None)
    if isinstance(code, int):
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None) if response is not None else getattr(exc, "headers", None)
        retryable = code in RETRYABLE_STATUS_CODES or code >= 500
        return Failure("api_error", retryable, f"{code}: {_error_message(exc)}", parse_retry_after(headers))
    if "Connection" in name or isinstance(exc, (ConnectionError, OSError)):
        return Failure("api_error", True, f"connection: {_error_message(exc)}")
    if isinstance(exc, (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError)):
        return Failure("api_error", False, f"malformed response: {name}: {exc}")
    return Failure("api_error", False, f"{name}: {exc}")


# -- response parsing ----------------------------------------------------------------------------------------
def _field(obj: Any, name: str) -> Any:
    """obj.name, or obj[name] for dicts (None when missing)."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _token_logprobs(logprobs: Any) -> tuple[dict[str, float], ...] | None:
    """{token: logprob} of the top alternatives of each generated token (None when absent)."""
    content = _field(logprobs, "content") if logprobs is not None else None
    if content is None:
        return None
    rows = []
    for entry in content:
        top = _field(entry, "top_logprobs") or []
        row = {str(_field(alt, "token")): float(_field(alt, "logprob")) for alt in top}
        if not row:
            row = {str(_field(entry, "token")): float(_field(entry, "logprob"))}
        rows.append(row)
    return tuple(rows)


def _usage(usage: Any) -> dict[str, int]:
    if usage is None:
        return {}
    names = ("prompt_tokens", "completion_tokens", "total_tokens")
    return {name: int(_field(usage, name)) for name in names if _field(usage, name) is not None}


def parse_completion(completion: Any, *, latency: float = 0.0, attempts: int = 1) -> ChatResponse:
    """A ChatResponse from an SDK ChatCompletion (or any object/dict of that shape).

    Raises ValueError (or an attribute/type error) when the shape is wrong.
    """
    choices = _field(completion, "choices")
    if not choices:
        raise ValueError("the completion has no choices")
    choice = choices[0]
    message = _field(choice, "message")
    if message is None:
        raise ValueError("the first choice has no message")
    finish_reason = _field(choice, "finish_reason")
    refusal = _field(message, "refusal")
    text = _field(message, "content") or ""
    if not isinstance(text, str):
        raise TypeError(f"message content is {type(text).__name__}, not text")
    common = dict(text=text, finish_reason=finish_reason, token_logprobs=_token_logprobs(_field(choice, "logprobs")),
                  usage=_usage(_field(completion, "usage")), latency=latency, attempts=attempts)
    if refusal:
        return ChatResponse("refusal", error=printable(f"refusal: {refusal}", ERROR_CHARS), **common)
    if finish_reason == "content_filter":
        return ChatResponse("refusal", error="refusal: content_filter", **common)
    if finish_reason == "length":
        return ChatResponse("truncated", error="truncated: finish_reason length", **common)
    return ChatResponse("ok", **common)


def with_cause(error: str, exc: BaseException) -> str:
    """`error` and the root cause behind it when that says more (the SDK's "Connection error." hides
    "[Errno 111] Connection refused")."""
    cause = exc
    for _ in range(8):  # a chain is short; a cyclic one must not loop
        if (cause.__cause__ or cause.__context__) is None:
            break
        cause = cause.__cause__ or cause.__context__
    text = printable(cause, ERROR_CHARS)
    return printable(f"{error} ({text})" if cause is not exc and text and text not in error else error, ERROR_CHARS)
