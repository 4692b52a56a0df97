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
ones). The server binds 127.0.0.1 unless told otherwise. Errors are OpenAI-shaped: 400 for a bad
request, 404 for an unknown model, 500 when the model produced logprobs that are not numbers (bodies
are strict JSON: never NaN or Infinity).

The address is checked before anything is loaded: a port outside 0-65535 is one line and exit 2, and
the socket is bound before the model is read, so a port in use fails at once, not after loading.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from judges.model.local_backend import LocalModel, RequestError
from trainers.engine.serving import CompletionService


MAX_BODY_BYTES = 32 * 2 ** 20  # a request body larger than this is refused before it is read
REQUEST_TIMEOUT_S = 120  # seconds a connection may stay silent

ROUTES = {"chat/completions": "chat", "completions": "complete", "load_lora_adapter": "load_adapter",
          "unload_lora_adapter": "unload_adapter"}  # POST path (after /v1/) -> the method answering it


def _route(path: str) -> str | None:
    """The ROUTES method of a POST path (`/v1/completions`, or without `/v1`), None when there is none."""
    path = path.split("?", 1)[0].strip("/")
    return ROUTES.get(path[3:] if path.startswith("v1/") else path)


def _handler(holder: dict):
    """A request handler class serving holder["model"] and holder["service"] (set once the model is loaded)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S  # a client that stops sending (a short body) frees its thread after this

        def log_message(self, *args):  # quiet: one line per request is noise for a judge endpoint
            pass

        def _send(self, status: int, body: dict) -> None:
            try:
                data = json.dumps(body, allow_nan=False).encode()
            except ValueError:  # a broken model's NaN logprobs: say so rather than send invalid JSON
                status = 500
                data = json.dumps({"error": {"message": "the model produced a logprob that is not a finite number",
                                             "type": "server_error", "code": 500}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, kind: str, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def _send_text(self, text: str) -> None:  # vLLM answers an adapter load or unload with plain text
            data = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, holder["service"].models())
            else:
                self._error(404, "not_found_error", f"no route {self.path}")

        def do_POST(self):
            route = _route(self.path)
            if route is None:
                return self._error(404, "not_found_error", f"no route {self.path}")
            try:
                length = int(self.headers.get("Content-Length", 0))
                if not 0 <= length <= MAX_BODY_BYTES:
                    return self._error(413 if length > 0 else 400, "invalid_request_error",
                                       f"Content-Length {length}: a body is 0 to {MAX_BODY_BYTES} bytes")
                payload = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(payload, dict):
                    raise RequestError(400, "invalid_request_error", "the body must be a JSON object")
                if route == "chat":
                    self._send(200, holder["model"].chat(payload))
                elif route == "complete":
                    self._send(200, holder["service"].complete(payload))
                else:
                    self._send_text(getattr(holder["service"], route)(payload))
            except json.JSONDecodeError as error:
                self._error(400, "invalid_request_error", f"the body is not JSON: {error}")
            except RequestError as error:
                self._error(error.status, error.kind, str(error))
            except (TypeError, ValueError) as error:
                self._error(400, "invalid_request_error", str(error))
            except Exception as error:  # noqa: BLE001 - one bad request never kills the server or prints a traceback
                self._error(500, "server_error", f"{type(error).__name__}: {error}")

    return Handler


class ModelLoadError(Exception):
    """The model directory exists but the model cannot be loaded from it (the message says why)."""


def check_port(port) -> int:
    """The port as an int; ValueError saying the range when it is not a TCP port (0 picks a free one)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"--port {port}: a TCP port is 0-65535 (0 picks a free one), e.g. --port 8000")
    return port


class _Server(ThreadingHTTPServer):
    """The HTTP server, with one line instead of a traceback when a request fails outside the handler's
    own error replies, and nothing at all when the client just went away (a port probe, a Ctrl-C)."""

    request_queue_size = 256  # the listen backlog: a rollout engine opens one connection per row at once

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        print(f"marl serve: a request from {client_address[0]}:{client_address[1]} failed "
              f"({type(error).__name__}: {error})", file=sys.stderr, flush=True)


def make_http_server(model_dir: str | Path, host: str = "127.0.0.1", port: int = 8000,
                     name: str | None = None, *, enable_lora: bool = False, device: str = "cpu",
                     dtype=None) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) for the model; port 0 picks a free port. `enable_lora` allows
    runtime LoRA adapters (/v1/load_lora_adapter), which read a directory the client names.

    ValueError for a port out of range, OSError when the address cannot be bound (checked before the
    model is loaded), FileNotFoundError when model_dir is not a model directory, ModelLoadError when
    its files cannot be loaded (a broken config.json, missing weights).
    """
    holder: dict = {}
    httpd = _Server((host, check_port(port)), _handler(holder))
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
    holder["service"] = httpd.service = CompletionService(holder["model"], model_dir, enable_lora=enable_lora)
    return httpd


def serve(model_dir: str | Path, host: str = "127.0.0.1", port: int = 8000, name: str | None = None, *,
          enable_lora: bool = False, device: str = "cpu", dtype=None) -> None:
    """Serve until interrupted, printing the base URL (`enable_lora`: runtime LoRA adapters, see make_http_server).

    Raises what make_http_server raises, before serving: ValueError (a port out of range),
    ModelLoadError, FileNotFoundError, or OSError (the address cannot be bound).
    """
    httpd = make_http_server(model_dir, host, port, name, enable_lora=enable_lora, device=device, dtype=dtype)
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
