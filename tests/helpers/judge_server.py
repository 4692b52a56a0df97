"""A tiny OpenAI-compatible HTTP server on 127.0.0.1 with a programmable script (a test helper).

It speaks enough of the Chat Completions wire format for the official `openai` client:
`POST /v1/chat/completions` and `GET /v1/models`. Each chat request takes the next behaviour from a
queue (the script); when the queue is empty the `default` behaviour answers. A behaviour is a tuple:

    ("ok", text[, logprobs])             200, finish_reason "stop"; logprobs: [(token, {alt: logprob})]
    ("status", code[, headers[, msg]])   an OpenAI-style error body with that HTTP status (and headers)
    ("sleep", seconds[, behaviour])      wait (interruptible at shutdown), then the behaviour (default ok)
    ("malformed",)                       200 with a body that is not JSON
    ("length"[, text])                   200, finish_reason "length" (a truncated answer)
    ("refusal"[, text])                  200, message.refusal set, content null
    ("chunked", text)                    200 like "ok", but sent chunked, with no Content-Length
    ("raw", code, body[, headers])       that status with `body` (bytes) as it is: a non-JSON error page

Logprobs may be NaN or infinite: they are written as the bare `NaN` / `Infinity` tokens that Python's
json (and so the openai client) reads back, as a faulty server would send them.

`default` may also be a callable(request_json) -> behaviour. `models`, when given, makes requests for
any other model a 404 `model_not_found` (as real endpoints do). `latency_s` is added to every chat
request. Counters: `requests`, `in_flight`, `max_in_flight`, and `bodies` (the parsed requests).
`fail(behaviour)` makes every chat request answer `behaviour` (ahead of the script) until `fail(None)`:
an endpoint that goes down and comes back on the test's command. `GET /v1/models` is not counted;
`models_failure`, when set to a behaviour, is how it answers (a probe that fails).

    with JudgeServer(default=("ok", "[[A]]"), latency_s=0.05) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x")

Bounded: it binds to loopback only, on a free port, and stops (waking sleeping handlers) at exit.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Behaviour = tuple
DEFAULT_TEXT = "The first answer is better.\n[[A]]"


def _error_body(code: int, message: str) -> dict[str, Any]:
    """An OpenAI-style error object."""
    kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
             404: "not_found_error", 429: "rate_limit_error"}
    return {"error": {"message": message, "type": kinds.get(code, "server_error"), "param": None,
                      "code": str(code)}}


def _logprobs_payload(logprobs: Sequence[tuple[str, dict[str, float]]] | None) -> dict[str, Any] | None:
    """The wire form of `[(token, {alternative: logprob})]` (the chosen token's logprob is looked up)."""
    if logprobs is None:
        return None
    content = []
    for token, alternatives in logprobs:
        top = [{"token": alt, "logprob": lp, "bytes": list(alt.encode())} for alt, lp in alternatives.items()]
        content.append({"token": token, "logprob": alternatives.get(token, 0.0), "bytes": list(token.encode()),
                        "top_logprobs": top})
    return {"content": content, "refusal": None}


def completion_body(model: str, text: str | None, *, finish_reason: str = "stop", refusal: str | None = None,
                    logprobs: Sequence[tuple[str, dict[str, float]]] | None = None) -> dict[str, Any]:
    """A complete `chat.completion` object."""
    completion_tokens = len((text or refusal or "").split())
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
        "model": model, "system_fingerprint": "fp_judge_server",
        "choices": [{"index": 0, "finish_reason": finish_reason, "logprobs": _logprobs_payload(logprobs),
                     "message": {"role": "assistant", "content": text, "refusal": refusal}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": completion_tokens,
                  "total_tokens": 10 + completion_tokens},
    }


class _Server(ThreadingHTTPServer):
    """A threading HTTP server with handler threads that never block shutdown and a deep listen queue."""

    daemon_threads = True
    request_queue_size = 256  # the default (5) drops connections when 64 clients connect at once


class JudgeServer:
    """A scripted OpenAI-compatible server on a free loopback port (use as a context manager)."""

    def __init__(self, script: Iterable[Behaviour] = (), *, default: Behaviour | Callable = ("ok", DEFAULT_TEXT),
                 latency_s: float = 0.0, models: Sequence[str] | None = None):
        self.script: deque[Behaviour] = deque(script)
        self.default = default
        self.latency_s = latency_s
        self.models = tuple(models) if models is not None else None
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict[str, Any]] = []
        self.failing: Behaviour | None = None
        self.models_failure: Behaviour | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL to give an OpenAI client: http://127.0.0.1:PORT/v1."""
        assert self._httpd is not None, "the server is not running"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def push(self, *behaviours: Behaviour) -> None:
        """Append behaviours to the script."""
        with self._lock:
            self.script.extend(behaviours)

    def fail(self, behaviour: Behaviour | None) -> None:
        """Answer every chat request with `behaviour` from now on (None: answer normally again)."""
        with self._lock:
            self.failing = behaviour

    def reset_counters(self) -> None:
        """Zero the request counters (the script is kept)."""
        with self._lock:
            self.requests, self.max_in_flight = 0, self.in_flight
            self.bodies.clear()

    def __enter__(self) -> "JudgeServer":
        self._httpd = _Server(("127.0.0.1", 0), _make_handler(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="judge-server", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- called from handler threads ---------------------------------------------------------------------
    def _enter_request(self, body: dict[str, Any]) -> Behaviour:
        """Count the request and pick its behaviour."""
        with self._lock:
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.bodies.append(body)
            if self.failing is not None:
                return self.failing
            if self.script:
                return self.script.popleft()
        return self.default(body) if callable(self.default) else self.default

    def _leave_request(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _sleep(self, seconds: float) -> None:
        """Sleep, but wake up at once when the server stops."""
        self._stopping.wait(seconds)

    def respond(self, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, payload) for one chat request."""
        behaviour = self._enter_request(body)
        try:
            if self.latency_s:
                self._sleep(self.latency_s)
            model = str(body.get("model", ""))
            if self.models is not None and model not in self.models:
                message = f"The model `{model}` does not exist or you do not have access to it."
                payload = _error_body(404, message)
                payload["error"]["code"] = "model_not_found"
                return 404, {}, json.dumps(payload).encode()
            return self._render(behaviour, model)
        finally:
            self._leave_request()

    def _render(self, behaviour: Behaviour, model: str) -> tuple[int, dict[str, str], bytes]:
        """Turn one behaviour into an HTTP answer."""
        kind, args = behaviour[0], behaviour[1:]
        if kind == "sleep":
            self._sleep(float(args[0]))
            return self._render(args[1] if len(args) > 1 else ("ok", DEFAULT_TEXT), model)
        if kind == "ok":
            payload = completion_body(model, args[0] if args else DEFAULT_TEXT,
                                      logprobs=args[1] if len(args) > 1 else None)
        elif kind == "length":
            payload = completion_body(model, args[0] if args else "The first answer is", finish_reason="length")
        elif kind == "refusal":
            payload = completion_body(model, None, refusal=args[0] if args else "I can't help with that.")
        elif kind == "status":
            code = int(args[0])
            headers = dict(args[1]) if len(args) > 1 else {}
            message = args[2] if len(args) > 2 else f"scripted error {code}"
            return code, headers, json.dumps(_error_body(code, message)).encode()
        elif kind == "malformed":
            return 200, {}, b'{"id": "chatcmpl-broken", "choices": [{"message": '
        elif kind == "chunked":
            return 200, {"Transfer-Encoding": "chunked"}, json.dumps(completion_body(model, args[0])).encode()
        elif kind == "raw":
            return int(args[0]), dict(args[2]) if len(args) > 2 else {}, bytes(args[1])
        else:
            raise ValueError(f"unknown behaviour {behaviour!r}")
        return 200, {}, json.dumps(payload).encode()


def _make_handler(server: JudgeServer) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to `server`."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out as separate writes

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

        def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            chunked = headers.get("Transfer-Encoding") == "chunked"
            if not chunked:
                self.send_header("Content-Length", str(len(payload)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if not chunked:
                self.wfile.write(payload)
                return
            for start in range(0, len(payload), 65536):
                piece = payload[start:start + 65536]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/v1/models":
                self._send(404, {}, json.dumps(_error_body(404, "not found")).encode())
                return
            if server.models_failure is not None:
                self._send(*server._render(server.models_failure, ""))
                return
            names = server.models or ()  # a server that answers any model lists none (a probe then checks nothing)
            data = [{"id": name, "object": "model", "created": 0, "owned_by": "judge-server"} for name in names]
            self._send(200, {}, json.dumps({"object": "list", "data": data}).encode())

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, {}, json.dumps(_error_body(404, f"no route {self.path}")).encode())
                return
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                self._send(400, {}, json.dumps(_error_body(400, "request body is not JSON")).encode())
                return
            try:
                self._send(*server.respond(body))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout); nothing to answer

    return Handler


def write_judged_relay(scenarios, url: str, tmp_path):
    """relay.yaml with a process reward from an openai judge at `url` (main stage only), written into
    tmp_path; returns its path."""
    import yaml

    spec = yaml.safe_load((scenarios / "relay.yaml").read_text())
    spec["judges"] = [{"name": "critic", "backend": "openai", "model": "judge", "base_url": url,
                       "api_key_env": "NO_SUCH_KEY", "timeout_s": 5}]
    spec["rewards"]["process"] = [{"kind": "critic"}]
    spec["train"]["stages"] = ["main"]
    path = tmp_path / "judged_relay.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path
