"""A local transformers model as a judge backend (and the engine behind `marl serve`).

`LocalModel(model_dir)` loads any Hugging Face causal-LM directory and answers OpenAI-shaped chat
payloads (`chat(payload) -> dict`); `LocalBackend(model_dir)` is the `ChatBackend` over it, running
generation in a worker thread so judges can await it. torch and transformers are imported here, lazily
on first use of this module's classes; nothing else in `judges` needs them.

The prompt is `judges.model.chat.render_chat` (the tokenizer's chat template when it has one, else
the messages' contents joined by newlines), the rendering the trainers give an agent's turn, and
generation stops at any of the model's end tokens (`stop_token_ids`), which the text never contains.
temperature 0 means greedy; with logprobs, every generated token comes with its logprob and
`top_logprobs` alternatives from the distribution it was drawn from. A token the sampler filtered
out (top_p) has logprob -inf, which JSON cannot carry: it is sent as -9999.0, the floor OpenAI and
vLLM use. `LocalBackend` checks every answer like the HTTP backend (`checked_response`).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path

from judges.model.backend import ChatRequest, ChatResponse, checked_response
from judges.model.chat import ensure_pad_token, render_chat, stop_token_ids

LOGPROB_FLOOR = -9999.0  # what OpenAI-compatible servers send for a probability of 0


def _seed_torch(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def _load(model_dir: str | Path, *, device: str = "cpu", dtype=None):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_dir)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a Hugging Face model directory (no config.json)")
    tokenizer = ensure_pad_token(AutoTokenizer.from_pretrained(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32).to(device).eval()
    return model, tokenizer


class RequestError(Exception):
    """A client error: (HTTP status, OpenAI error type, message)."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind = status, kind


MAX_TOKENS_LIMIT = 4096  # one request cannot hold the single model thread for an unbounded generation
MAX_TOP_LOGPROBS = 20  # the OpenAI API's own limit


def _plain(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _number(payload: dict, name: str, default: float, low: float, high: float) -> float:
    """payload[name] as a finite number in [low, high], else a 400 RequestError naming the range."""
    value = payload.get(name)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int | float) or not (low <= value <= high):
        raise RequestError(400, "invalid_request_error", f"{name} must be a number in [{_plain(low)}, "
                                                         f"{_plain(high)}], got {value!r}")
    return float(value)


def _sampling(payload: dict) -> tuple[int, float, float]:
    """(max_tokens, temperature, top_p) of a request, each checked (a 400 RequestError when out of range)."""
    tokens_key = "max_tokens" if payload.get("max_tokens") is not None else "max_completion_tokens"
    max_tokens = _number(payload, tokens_key, 16, 1, MAX_TOKENS_LIMIT)
    if not max_tokens.is_integer():
        raise RequestError(400, "invalid_request_error", f"{tokens_key} must be an integer, got {max_tokens!r}")
    _number(payload, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    temperature = _number(payload, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(payload, "top_p", 1.0, 1e-6, 1.0)
    return int(max_tokens), temperature, top_p


class LocalModel:
    """Holds the model and answers chat-completion payloads (independent of HTTP)."""

    def __init__(self, model_dir: str | Path, name: str | None = None):
        self.model, self.tokenizer = _load(model_dir)
        self.stop_ids = stop_token_ids(self.model, self.tokenizer)  # every end token (eos list, end of turn)
        self.name = name or Path(model_dir).name
        self.lock = threading.Lock()

    def models(self) -> dict:
        """The /v1/models listing."""
        return {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "marl"}]}

    def _prompt_ids(self, messages: list[dict]):
        import torch

        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise RequestError(400, "invalid_request_error", "messages must be a non-empty list of "
                                                             "{role, content} objects with string content")
        # the one rendering the trainers use for an agent's turn too (judges/model/chat.py)
        ids = self.tokenizer(render_chat(self.tokenizer, messages), add_special_tokens=False)["input_ids"]
        if not ids:
            raise RequestError(400, "invalid_request_error", "the prompt tokenised to nothing")
        return torch.tensor([ids])

    def chat(self, payload: dict) -> dict:
        """One chat completion, OpenAI-shaped."""
        if payload.get("model") not in (None, self.name):
            raise RequestError(404, "not_found_error", f"model {payload.get('model')!r} not found; "
                                                       f"this server serves {self.name!r}")
        ids = self._prompt_ids(payload.get("messages"))
        max_tokens, temperature, top_p = _sampling(payload)
        with self.lock:
            if payload.get("seed") is not None:
                _seed_torch(int(_number(payload, "seed", 0, -2 ** 63, 2 ** 63 - 1)))
            tokens, steps = self._generate(ids, max_tokens, temperature, top_p)
        return self._completion(tokens, steps, ids.size(1), payload)

    def _generate(self, ids, max_tokens, temperature, top_p):
        import torch
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 \
            else dict(do_sample=False)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                      pad_token_id=self.tokenizer.pad_token_id,
                                      eos_token_id=self.stop_ids, output_scores=True,
                                      return_dict_in_generate=True, **sampling)
        tokens = out.sequences[0, ids.size(1):].tolist()
        steps = [torch.log_softmax(score[0].float(), dim=-1) for score in out.scores]
        return tokens, steps

    def _completion(self, tokens, steps, prompt_tokens, payload) -> dict:
        end = next((i for i, token in enumerate(tokens) if token in self.stop_ids), None)
        finish = "length" if end is None else "stop"
        kept = tokens if end is None else tokens[:end]  # the text stops before the end token
        choice = {"index": 0, "finish_reason": finish, "logprobs": None,
                  "message": {"role": "assistant", "content": self.tokenizer.decode(kept, skip_special_tokens=True)}}
        if payload.get("logprobs"):
            choice["logprobs"] = {"content": self._logprobs(kept, steps, int(payload.get("top_logprobs") or 0))}
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name, "choices": [choice],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens),
                          "total_tokens": prompt_tokens + len(tokens)}}

    def _logprobs(self, tokens, steps, top) -> list[dict]:
        import torch

        content = []
        for token, logprobs in zip(tokens, steps):
            best = torch.topk(logprobs, k=min(max(top, 0), logprobs.numel()))
            content.append({"token": self.tokenizer.decode([token]), "logprob": _floored(logprobs[token].item()),
                            "bytes": None,
                            "top_logprobs": [{"token": self.tokenizer.decode([i]), "logprob": _floored(v), "bytes": None}
                                             for v, i in zip(best.values.tolist(), best.indices.tolist())]})
        return content




def _floored(logprob: float) -> float:
    """A JSON-safe logprob: -inf becomes LOGPROB_FLOOR (NaN stays NaN, for the check to refuse)."""
    return max(logprob, LOGPROB_FLOOR) if logprob == logprob else logprob


class LocalBackend:
    """`ChatBackend` over a LocalModel; one request at a time in a worker thread."""

    def __init__(self, model_dir: str | Path, name: str | None = None):
        self.model = LocalModel(model_dir, name)
        self.identity = f"local:{self.model.name}@{Path(model_dir).resolve()}"

    async def complete(self, request: ChatRequest) -> ChatResponse:
        """Generate; a client error becomes an api_error response, never an exception."""
        payload = {"messages": list(request.messages), "max_tokens": request.max_tokens,
                   "temperature": request.temperature, "seed": request.seed, "logprobs": request.logprobs,
                   "top_logprobs": request.top_logprobs}
        started = time.perf_counter()
        try:
            answer = await asyncio.to_thread(self.model.chat, payload)
        except RequestError as error:
            return ChatResponse("api_error", error=f"{error.status}: {error}", latency=time.perf_counter() - started)
        choice = answer["choices"][0]
        content = (choice.get("logprobs") or {}).get("content")
        logprobs = tuple({t["token"]: t["logprob"] for t in token["top_logprobs"]} for token in content) \
            if content else None
        status = "truncated" if choice["finish_reason"] == "length" else "ok"
        return checked_response(ChatResponse(status, text=choice["message"]["content"], finish_reason=choice["finish_reason"],
                            token_logprobs=logprobs, usage=answer["usage"], latency=time.perf_counter() - started))
