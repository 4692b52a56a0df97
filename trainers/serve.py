"""`marl serve MODEL_DIR --port N`: a local transformers model behind an OpenAI-compatible API.

    GET  /v1/models             -> the one served model
    POST /v1/chat/completions   -> {model, messages, max_tokens, temperature, top_p, seed, logprobs, top_logprobs}

Any OpenAI client (and marl's judges) can then use the model as a judge or as a frozen opponent:
`OpenAI(base_url="http://127.0.0.1:N/v1", api_key="EMPTY")`. The prompt is the tokenizer's chat
template when it has one, else the messages' contents joined by newlines (the tiny character models
have no template). temperature 0 means greedy. With `logprobs`, every generated token comes with
its logprob and `top_logprobs` alternatives, from the distribution it was drawn from.

Requests are served one at a time (one model, one CPU thread); the server binds 127.0.0.1 unless
told otherwise. Errors are OpenAI-shaped: 400 for a bad request, 404 for an unknown model.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from trainers.tinylm import load_policy


class RequestError(Exception):
    """A client error: (HTTP status, OpenAI error type, message)."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind = status, kind


class ModelServer:
    """Holds the model and answers chat-completion payloads (independent of HTTP, for tests)."""

    def __init__(self, model_dir: str | Path, name: str | None = None):
        self.model, self.tokenizer = load_policy(model_dir)
        self.name = name or Path(model_dir).name
        self.lock = threading.Lock()

    def models(self) -> dict:
        """The /v1/models listing."""
        return {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "marl"}]}

    def _prompt_ids(self, messages: list[dict]) -> torch.Tensor:
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise RequestError(400, "invalid_request_error", "messages must be a non-empty list of "
                                                             "{role, content} objects with string content")
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = "\n".join(m["content"] for m in messages)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise RequestError(400, "invalid_request_error", "the prompt tokenised to nothing")
        return torch.tensor([ids])

    def chat(self, payload: dict) -> dict:
        """One chat completion, OpenAI-shaped."""
        if payload.get("model") not in (None, self.name):
            raise RequestError(404, "not_found_error", f"model {payload.get('model')!r} not found; "
                                                       f"this server serves {self.name!r}")
        ids = self._prompt_ids(payload.get("messages"))
        max_tokens = int(payload.get("max_tokens") or payload.get("max_completion_tokens") or 16)
        temperature = float(payload.get("temperature", 1.0) or 0.0)
        with self.lock:
            if payload.get("seed") is not None:
                torch.manual_seed(int(payload["seed"]))
            tokens, steps = self._generate(ids, max_tokens, temperature, float(payload.get("top_p", 1.0) or 1.0))
        return self._completion(tokens, steps, ids.size(1), payload)

    @torch.no_grad()
    def _generate(self, ids, max_tokens, temperature, top_p):
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 \
            else dict(do_sample=False)
        out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                  pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id,
                                  output_scores=True, return_dict_in_generate=True, **sampling)
        tokens = out.sequences[0, ids.size(1):].tolist()
        steps = [torch.log_softmax(score[0].float(), dim=-1) for score in out.scores]
        return tokens, steps

    def _completion(self, tokens, steps, prompt_tokens, payload) -> dict:
        eos = self.tokenizer.eos_token_id
        finish = "stop" if eos in tokens else "length"
        kept = tokens[:tokens.index(eos)] if eos in tokens else tokens
        choice = {"index": 0, "finish_reason": finish, "logprobs": None,
                  "message": {"role": "assistant", "content": self.tokenizer.decode(kept, skip_special_tokens=True)}}
        if payload.get("logprobs"):
            choice["logprobs"] = {"content": self._logprobs(kept, steps, int(payload.get("top_logprobs") or 0))}
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name, "choices": [choice],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens),
                          "total_tokens": prompt_tokens + len(tokens)}}

    def _logprobs(self, tokens, steps, top) -> list[dict]:
        content = []
        for token, logprobs in zip(tokens, steps):
            best = torch.topk(logprobs, k=min(max(top, 0), logprobs.numel()))
            content.append({"token": self.tokenizer.decode([token]), "logprob": logprobs[token].item(), "bytes": None,
                            "top_logprobs": [{"token": self.tokenizer.decode([i]), "logprob": v, "bytes": None}
                                             for v, i in zip(best.values.tolist(), best.indices.tolist())]})
        return content


def _handler(server: ModelServer):
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
    return ThreadingHTTPServer((host, port), _handler(ModelServer(model_dir, name)))


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
