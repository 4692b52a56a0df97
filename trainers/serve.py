"""`marl serve MODEL_DIR --port N`: a local transformers model behind an OpenAI-compatible API.

    GET  /v1/models             -> the one served model
    POST /v1/chat/completions   -> {model, messages, max_tokens, temperature, top_p, seed, logprobs, top_logprobs}

Any OpenAI client (and marl's judges) can then use the model as a judge or as a frozen opponent:
`OpenAI(base_url="http://127.0.0.1:N/v1", api_key="EMPTY")`. The prompt is the tokenizer's chat
template when it has one, else the messages' contents joined by newlines (the tiny character models
have no template). temperature 0 means greedy. With `logprobs`, every generated token comes with
its logprob and `top_logprobs` alternatives, from the distribution it was drawn from.

The model engine is `judges.local_backend.LocalModel` (also usable as a judge backend without HTTP).
Requests are served one at a time (one model, one CPU thread); the server binds 127.0.0.1 unless
told otherwise. Errors are OpenAI-shaped: 400 for a bad request, 404 for an unknown model.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from judges.local_backend import LocalModel, RequestError


def _handler(server: LocalModel):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: one line per request is noise for a judge endpoint
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, kind: str, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def do_GET(self):
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, server.models())
            else:
                self._error(404, "not_found_error", f"no route {self.path}")

        def do_POST(self):
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                return self._error(404, "not_found_error", f"no route {self.path}")
            try:
                length = int(self.headers.get("Content-Length", 0))
                payload = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(payload, dict):
                    raise RequestError(400, "invalid_request_error", "the body must be a JSON object")
                self._send(200, server.chat(payload))
            except json.JSONDecodeError as error:
                self._error(400, "invalid_request_error", f"the body is not JSON: {error}")
            except RequestError as error:
                self._error(error.status, error.kind, str(error))
            except (TypeError, ValueError) as error:
                self._error(400, "invalid_request_error", str(error))

    return Handler


def make_http_server(model_dir: str | Path, host: str = "127.0.0.1", port: int = 8000,
                     name: str | None = None) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) for the model; port 0 picks a free port."""
    return ThreadingHTTPServer((host, port), _handler(LocalModel(model_dir, name)))


def serve(model_dir: str | Path, host: str = "127.0.0.1", port: int = 8000, name: str | None = None) -> None:
    """Serve until interrupted, printing the base URL."""
    httpd = make_http_server(model_dir, host, port, name)
    model = name or Path(model_dir).name
    print(f"serving {model} at http://{host}:{httpd.server_address[1]}/v1 (Ctrl-C stops)", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
