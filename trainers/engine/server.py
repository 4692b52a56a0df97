"""A local transformers model behind an OpenAI-compatible API (the library of `marl serve`, trainers/cli/serve.py).

    GET  /v1/models             -> the served model (and, with --enable-lora, the adapters loaded at run time)
    POST /v1/chat/completions   -> {model, messages, max_tokens, temperature, top_p, seed, logprobs, top_logprobs,
                                    logit_bias}
    POST /v1/completions        -> token-id prompts, logprobs, a served adapter by name (trainers/engine/serving.py)
    POST /v1/load_lora_adapter, /v1/unload_lora_adapter   -> runtime LoRA adapters (only with --enable-lora)

The last three are the subset of vLLM's server that the HTTP rollout engine speaks
(trainers/engine/http.py): `marl run` with `train.engine.kind: http` generates through them.

Any OpenAI client (and marl's judges) can then use the model as a judge or as a frozen opponent:
`OpenAI(base_url="http://127.0.0.1:N/v1", api_key="EMPTY")`. The prompt is rendered by
`common.chat.render_chat`, the function training renders an agent's turn with: the tokenizer's
chat template when it has one, else the messages' contents joined by newlines (the tiny character
models have no template). To ask a trained agent what it was trained on, send its role as the system
message and its observation as the user message (a plain-text model: the observation alone).
Generation stops at any of the model's end tokens (generation_config eos list, end of turn); the
answer never contains them. temperature 0 means greedy. With `logprobs`, every generated token comes with
its logprob and `top_logprobs` (at most 20) alternatives, from the distribution it was drawn from, after
`logit_bias` ({"token id": bias in [-100, 100]}, OpenAI's form): so `max_tokens: 1` with `top_logprobs: 20`
is a judge's logprobs verdict (judges.model.verdict).

The model engine is `judges.model.local_backend.LocalModel` (also usable as a judge backend without HTTP).
Concurrent requests are batched: those that arrive while the model is busy wait, and the next turn runs
them all in one left-padded `generate` call (the server's `local_model.queued()` counts the waiting
ones). The server binds 127.0.0.1 unless told otherwise.

Every bound a client meets is a `ServeLimits` field and a `marl serve` flag (trainers/engine/limits.py;
trainers/engine/connections.py holds the connections, threads and timeouts). Errors are OpenAI-shaped JSON,
{"error": {"message", "type", "code"}}: 400 for a bad request (a Content-Length that is not one non-negative
integer, a body that is not UTF-8 JSON holding an object, a field of the wrong JSON type, a prompt over
--max-prompt-tokens, measured in bytes before it is tokenised and then in tokens, a max_tokens over
--max-new-tokens: refused, never cut short), 404 for an unknown model, 408 when the request did not arrive
within --read-timeout of its first byte or nothing came within --idle-timeout (or a connection that had
sent nothing made room for a new one at --max-connections), 411 without a Content-Length, 413 for one over
--max-body-bytes (the body is never read), 431 for headers over 64 KiB, 503 with Retry-After when the
workers, the queue, the connections or a client's own connections are full, 500 when the model produced
logprobs that are not numbers (answers are strict JSON, and so must requests be: never NaN or Infinity).

The address is checked before anything is loaded: a port outside 0-65535 is one line and exit 2, and
the socket is bound before the model is read, so a port in use fails at once, not after loading.
"""

from __future__ import annotations

import http.client
import io
import json
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from numbers import Real
from pathlib import Path

from common.chat import render_chat
from judges.model.local_backend import LocalModel, RequestError
from trainers.engine.connections import LINGER_S, BoundedHTTPServer, error_body, linger
from trainers.engine.limits import ServeLimits
from trainers.engine.serving import CompletionService, cap_error, check_lengths

ROUTES = {"chat/completions": "chat", "completions": "complete", "load_lora_adapter": "load_adapter",
          "unload_lora_adapter": "unload_adapter"}  # POST path (after /v1/) -> the method answering it
# the chat fields whose JSON type is checked here (None means the default); ranges are the model's checks
CHAT_TYPES = {"model": str, "messages": list, "max_tokens": Real, "max_completion_tokens": Real,
              "temperature": Real, "top_p": Real, "seed": int, "logprobs": bool, "top_logprobs": int,
              "logit_bias": dict, "n": int, "stream": bool}
TYPE_NAMES = {str: "a string", list: "a list", Real: "a number", int: "an integer", bool: "true or false",
              dict: "an object"}


def _bad(message: str, status: int = 400) -> RequestError:
    return RequestError(status, "invalid_request_error", message)


def _route(path: str) -> str | None:
    """The ROUTES method of a POST path (`/v1/completions`, or without `/v1`), None when there is none."""
    path = path.split("?", 1)[0].strip("/")
    return ROUTES.get(path[3:] if path.startswith("v1/") else path)


def content_length(headers, limit: int) -> int:
    """The body's size from a request's headers: RequestError 411 when it is not given (or chunked), 400
    when it is not one non-negative integer, 413 when it is over `limit` (the body is then never read)."""
    if headers.get("Transfer-Encoding") is not None:
        raise _bad("a body sent with Transfer-Encoding is not read; send it with a Content-Length", 411)
    values = [value.strip() for value in headers.get_all("Content-Length") or []]
    if not values:
        raise _bad("a POST needs a Content-Length header (the body's size in bytes)", 411)
    if len(set(values)) > 1:  # which one a proxy believed is anyone's guess: refuse both
        raise _bad("Content-Length is given more than once, with different values")
    text = values[0]
    if not (text.isascii() and text.isdigit()):  # int() would take "+5", " 5", "1_0" and other digits
        raise _bad(f"Content-Length {text[:40]!r} is not a byte count (a non-negative integer)")
    if len(text.lstrip("0")) > 18 or int(text) > limit:  # no int() of a 5000-digit string
        raise _bad(f"the body is {text[:40]} bytes; this server reads at most {limit} "
                   "(marl serve --max-body-bytes)", 413)
    return int(text)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_body(data: bytes) -> dict:
    """A request body as a JSON object (an empty body is {}); RequestError 400 saying what it is not."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _bad(f"the body is not UTF-8 text (byte {error.start} cannot be decoded)") from None
    try:
        payload = json.loads(text or "{}", parse_constant=_no_constant)
    except RecursionError:
        raise _bad("the body's JSON is nested too deeply") from None
    except json.JSONDecodeError as error:
        raise _bad(f"the body is not JSON: {error}") from None
    except ValueError as error:  # NaN or Infinity, an integer of more than 4300 digits
        raise _bad(f"the body is not strict JSON: {str(error).split(';')[0]}") from None
    if not isinstance(payload, dict):
        raise _bad("the body must be a JSON object")
    return payload


def check_chat(payload: dict, local: LocalModel, service: CompletionService) -> list[int] | None:
    """The server's own checks of a chat request, before the model's: JSON types, no streaming, one
    choice, max_tokens within the server's cap, and the rendered prompt within its bounds (in bytes
    before it is tokenised, then in tokens). The prompt's token ids, for the model to use as they are;
    None where the model's own checks answer (an unknown model, malformed messages, an empty prompt)."""
    for name, kind in CHAT_TYPES.items():
        value = payload.get(name)
        if value is not None and (isinstance(value, bool) != (kind is bool) or not isinstance(value, kind)):
            raise _bad(f"{name} must be {TYPE_NAMES[kind]}, got {json.dumps(value)[:60]}")
    if payload.get("stream"):
        raise _bad("stream: marl serve answers whole completions only; send stream: false")
    if payload.get("n") not in (None, 1):
        raise _bad(f"n must be 1 on /v1/chat/completions (one choice per request), got {payload['n']}")
    key = "max_tokens" if payload.get("max_tokens") is not None else "max_completion_tokens"
    max_tokens = payload.get(key)
    if max_tokens is not None and max_tokens > service.max_new_tokens:
        raise cap_error(key, max_tokens, service.max_new_tokens)
    messages = payload.get("messages")
    if payload.get("model") not in (None, local.name) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        return None  # the model's own 404 or 400 says what is wrong
    try:
        text = render_chat(local.tokenizer, messages)
    except Exception as error:  # noqa: BLE001 - a chat template raises what it likes for a bad conversation
        raise _bad(f"the messages cannot be rendered by the model's chat template "
                   f"({type(error).__name__}: {error})") from None
    service.check_text(text)
    ids = local.tokenizer(text, add_special_tokens=False)["input_ids"]
    asked = int(max_tokens) if max_tokens is not None and max_tokens >= 1 else 16  # 16: the model's default
    check_lengths(len(ids), asked, key, service)
    return ids or None


def _handler(holder: dict, limits: ServeLimits):
    """A request handler class serving holder["model"] and holder["service"] (set once the model is loaded)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = limits.read_timeout  # for each answer sent; every read shares one deadline (setup)

        def setup(self):
            super().setup()
            self.rfile.close()  # replaced by the head the accept loop read, then the socket under one deadline
            self.reader = self.server.reader()
            self.rfile = io.BufferedReader(self.reader)
            self.requestline, self.request_version, self.command = "", "HTTP/1.0", None  # until parsed
            self.answered = self.unread_body = False

        def handle(self):
            try:
                super().handle()  # one request (HTTP/1.0); a timeout is caught inside, and closes
            except http.client.HTTPException as error:  # the request line alone ran past MAX_HEADER_BYTES
                self.send_error(431, str(error))
            if self.reader.expired and not self.answered:
                self._error(408, "timeout_error", f"the request was not received within {limits.read_timeout:g} s "
                                                  "(marl serve --read-timeout)")

        def finish(self):
            super().finish()
            if self.unread_body:  # refused on its headers: let the client finish sending, then read our answer
                linger(self.connection, min(LINGER_S, limits.read_timeout))

        def log_message(self, *args):  # quiet: one line per request is noise for a judge endpoint
            pass

        def send_error(self, code, message=None, explain=None):
            """http.server's own refusals (a bad request line, headers too large, 501) as OpenAI JSON."""
            text = ": ".join(part for part in (message, explain) if part) or HTTPStatus(code).phrase
            self.unread_body = self.command == "POST"
            self._error(code, "invalid_request_error" if code < 500 else "server_error", text)

        def _send(self, status: int, body: dict) -> None:
            try:
                data = json.dumps(body, allow_nan=False).encode()
            except ValueError:  # a broken model's NaN logprobs: say so rather than send invalid JSON
                status = 500
                data = error_body(500, "the model produced a logprob that is not a finite number", "server_error")
            self._write(status, "application/json", data)

        def _write(self, status: int, content_type: str, data: bytes) -> None:
            self.answered = True
            self.connection.settimeout(limits.read_timeout)  # the reader left what remained of its deadline
            self.request_version = "HTTP/1.0"  # even to a request line http.server took for HTTP/0.9 (no status)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, kind: str, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def do_GET(self):
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, holder["service"].models())
            else:
                self._error(404, "not_found_error", f"no route {self.path}")

        def do_POST(self):
            self.unread_body = True  # until the body is read: a refusal on the headers alone lingers
            try:
                route = _route(self.path)
                if route is None:
                    raise RequestError(404, "not_found_error", f"no route {self.path}")
                payload = parse_body(self._body())
                if route == "chat":
                    ids = check_chat(payload, holder["model"], holder["service"])  # tokenised once, here
                    self._send(200, holder["model"].chat(payload, ids))
                elif route == "complete":
                    self._send(200, holder["service"].complete(payload))
                else:  # vLLM answers an adapter load or unload with plain text
                    self._write(200, "text/plain; charset=utf-8", getattr(holder["service"], route)(payload).encode())
            except RequestError as error:
                self._error(error.status, error.kind, str(error))
            except (TypeError, ValueError) as error:
                self._error(400, "invalid_request_error", str(error))
            except Exception as error:  # noqa: BLE001 - one bad request never kills the server or prints a traceback
                self._error(500, "server_error", f"{type(error).__name__}: {error}")

        def _body(self) -> bytes:
            """The request body, read within the request's deadline (RequestError 408 when it is not)."""
            length = content_length(self.headers, limits.max_body_bytes)
            self.reader.limit = self.reader.count + length  # the headers' bound lifted by the body's size
            self.unread_body = False
            try:
                data = self.rfile.read(length)
            except TimeoutError:
                raise RequestError(408, "timeout_error", f"the body was not received within "
                                                         f"{limits.read_timeout:g} s (marl serve --read-timeout)")
            if len(data) < length:
                raise _bad(f"the body ended after {len(data)} of the {length} bytes its Content-Length says")
            return data

    return Handler


class ModelLoadError(Exception):
    """The model directory exists but the model cannot be loaded from it (the message says why)."""


def check_port(port) -> int:
    """The port as an int; ValueError saying the range when it is not a TCP port (0 picks a free one)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"--port {port}: a TCP port is 0-65535 (0 picks a free one), e.g. --port 8000")
    return port


class _Server(BoundedHTTPServer):
    """The HTTP server, with one line instead of a traceback when a request fails outside the handler's
    own error replies, and nothing at all when the client just went away (a port probe, a Ctrl-C)."""

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        print(f"marl serve: a request from {client_address[0]}:{client_address[1]} failed "
              f"({type(error).__name__}: {error})", file=sys.stderr, flush=True)


def make_http_server(model_dir: str | Path, host: str = "127.0.0.1", port: int = 8000,
                     name: str | None = None, *, enable_lora: bool = False, device: str = "cpu",
                     dtype=None, limits: ServeLimits | None = None) -> BoundedHTTPServer:
    """An HTTP server (not yet serving) for the model; port 0 picks a free port. `enable_lora` allows
    runtime LoRA adapters (/v1/load_lora_adapter), which read a directory the client names; `limits`
    bounds what a client may send and hold (default ServeLimits()).

    ValueError for a port out of range, OSError when the address cannot be bound (checked before the
    model is loaded), FileNotFoundError when model_dir is not a model directory, ModelLoadError when
    its files cannot be loaded (a broken config.json, missing weights).
    """
    holder: dict = {}
    limits = limits or ServeLimits()
    httpd = _Server((host, check_port(port)), _handler(holder, limits), limits)
    httpd.local_model = None  # the LocalModel, once loaded (its batch queue, for whoever embeds the server)
    try:
        holder["model"] = LocalModel(model_dir, name, device=device, dtype=dtype)
    except FileNotFoundError:
        httpd.server_close()
        raise
    except Exception as error:  # noqa: BLE001 - transformers raises many kinds; all mean "cannot load"
        httpd.server_close()
        message = " ".join(str(error).split())[:300]
        raise ModelLoadError(f"{model_dir}: cannot load the model ({type(error).__name__}: {message})") from None
    except BaseException:
        httpd.server_close()
        raise

    httpd.local_model = holder["model"]
    holder["service"] = httpd.service = CompletionService(
        holder["model"], model_dir, enable_lora=enable_lora, max_prompt_tokens=limits.max_prompt_tokens,
        max_new_tokens=limits.max_new_tokens)
    return httpd


def serve(model_dir: str | Path, host: str = "127.0.0.1", port: int = 8000, name: str | None = None, *,
          enable_lora: bool = False, device: str = "cpu", dtype=None, limits: ServeLimits | None = None) -> None:
    """Serve until interrupted, printing the base URL (`enable_lora`, `limits`: see make_http_server).

    Raises what make_http_server raises, before serving: ValueError (a port out of range),
    ModelLoadError, FileNotFoundError, or OSError (the address cannot be bound).
    """
    httpd = make_http_server(model_dir, host, port, name, enable_lora=enable_lora, device=device, dtype=dtype,
                             limits=limits)
    model = name or Path(model_dir).name
    lora = "; runtime LoRA adapters on" if enable_lora else ""
    if enable_lora and host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: --enable-lora on {host}: any client that reaches this address can make the server read "
              "an adapter directory it names; bind 127.0.0.1 unless the network is yours", flush=True)
    print(f"serving {model} at http://{host}:{httpd.server_address[1]}/v1{lora} (Ctrl-C stops)", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
