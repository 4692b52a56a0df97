"""A local transformers model as a judge backend (and the engine behind `marl serve`).

`LocalModel(model_dir)` loads any Hugging Face causal-LM directory and answers OpenAI-shaped chat
payloads (`chat(payload) -> dict`); `LocalBackend(model_dir)` is the `ChatBackend` over it, running
generation in a worker thread so judges can await it. torch and transformers are imported here, lazily
on first use of this module's classes; nothing else in `judges` needs them.

The prompt is `common.chat.render_chat` (the tokenizer's chat template when it has one, else
the messages' contents joined by newlines), the rendering the trainers give an agent's turn, and
generation stops at any of the model's end tokens (`stop_token_ids`), which the text never contains.
temperature 0 means greedy; with logprobs, every generated token comes with its logprob and
`top_logprobs` alternatives from the distribution it was drawn from (computed in float64, so a label's
probability reads back exactly), `logit_bias` added to it where asked. A token the sampler filtered
out (top_p) has logprob -inf, which JSON cannot carry: it is sent as -9999.0, the floor OpenAI and
vLLM use. `LocalBackend` checks every answer like the HTTP backend (`checked_response`).

Requests are batched: every request that arrives while the model is busy waits in a queue, and the
next free turn runs all of them in one `generate` call (left-padded rows; greedy requests together,
unseeded sampled ones by temperature and top_p, a seeded sampled one alone so its seed reproduces it).
So N concurrent requests take fewer forwards than N, from HTTP (`marl serve`) and from `LocalBackend`,
which hands the requests of one event-loop turn (a judge's `asyncio.gather`) over together.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from judges.model.backend import ChatRequest, ChatResponse, checked_response
from common.chat import ensure_pad_token, render_chat, stop_token_ids
from common.model_files import model_folder_problem, shape_problem

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
    # special files, pickle-only or truncated weights, no tokenizer, a config that does not fit the weights:
    # said before a loader reads them (the caller names the directory, so the problem is given without it)
    if (problem := model_folder_problem(path) or shape_problem(path)) is not None:
        raise ValueError(problem.removeprefix(f"{path}: "))
    tokenizer = ensure_pad_token(AutoTokenizer.from_pretrained(path))
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32, use_safetensors=True,
                                                       output_loading_info=True)
    if info.get("missing_keys"):  # transformers would fill them with random numbers and serve those
        raise ValueError(f"config.json does not match the weights: its model has {sorted(info['missing_keys'])[0]}, "
                         "which the weights do not hold; use the config.json saved with these weights")
    return model.to(device).eval(), tokenizer


class RequestError(Exception):
    """A client error: (HTTP status, OpenAI error type, message)."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind = status, kind


MAX_TOKENS_LIMIT = 4096  # one request cannot hold the single model thread for an unbounded generation
MAX_TOP_LOGPROBS = 20  # the OpenAI API's own limit
MAX_BATCH_ROWS = 32  # requests run in one generate call at most
MAX_LOGIT_BIAS = 100.0  # the OpenAI API's range is [-100, 100]


def _plain(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def checked_number(payload: dict, name: str, default: float, low: float, high: float) -> float:
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
    max_tokens = checked_number(payload, tokens_key, 16, 1, MAX_TOKENS_LIMIT)
    if not max_tokens.is_integer():
        raise RequestError(400, "invalid_request_error", f"{tokens_key} must be an integer, got {max_tokens!r}")
    checked_number(payload, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    temperature = checked_number(payload, "temperature", 1.0, 0.0, 2.0)
    top_p = checked_number(payload, "top_p", 1.0, 1e-6, 1.0)
    return int(max_tokens), temperature, top_p


def _logit_bias(payload: dict, vocabulary: int) -> dict[int, float]:
    """{token id: bias} of a request's `logit_bias` ({"id": number}), else a 400 RequestError saying why."""
    raw = payload.get("logit_bias") or {}
    if not isinstance(raw, dict):
        raise RequestError(400, "invalid_request_error", "logit_bias must be an object of token id -> bias")
    bias = {}
    for key, value in raw.items():
        token = int(key) if isinstance(key, str) and key.strip().lstrip("-").isdigit() else None
        if token is None or not 0 <= token < vocabulary:
            raise RequestError(400, "invalid_request_error", f"logit_bias: {key!r} is not a token id of this model "
                                                             f"(0 to {vocabulary - 1})")
        bias[token] = checked_number({"logit_bias": value}, "logit_bias", 0, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
    return bias


@dataclass(eq=False)
class _Job:
    """One request on its way through the batch queue: what to generate, then what came out."""

    ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    bias: dict[int, float]
    top_logprobs: int | None  # None: no logprobs asked
    done: threading.Event = field(default_factory=threading.Event)
    tokens: list[int] = field(default_factory=list)  # generated, up to and including the first end token
    content: list[dict] | None = None  # the OpenAI logprobs content of the kept tokens
    error: BaseException | None = None

    def group(self) -> tuple:
        """Jobs with equal groups may share one generate call."""
        if self.temperature == 0:
            return ("greedy",)
        if self.seed is not None:  # a seed reproduces a draw only when nothing else shares the generator
            return ("seeded", id(self))
        return ("sample", self.temperature, self.top_p)


class BatchQueue:
    """Requests wait here while the model is busy; whoever takes the model's `lock` next runs everything
    queued by then in one `execute(batch)` call. A job has a `done` threading.Event that execute sets."""

    def __init__(self, lock: threading.Lock, execute):
        self.lock, self.execute = lock, execute
        self._queue: list = []
        self._queue_lock = threading.Lock()

    def waiting(self) -> int:
        """How many jobs wait for the model."""
        with self._queue_lock:
            return len(self._queue)

    def run(self, jobs: list) -> None:
        """Queue `jobs` and wait for them; whoever gets the model next runs everything queued by then."""
        with self._queue_lock:
            self._queue.extend(jobs)
        for job in jobs:
            while not job.done.is_set():
                with self.lock:
                    if job.done.is_set():  # another caller's turn ran it
                        break
                    with self._queue_lock:
                        batch, self._queue = self._queue, []
                    self.execute(batch)


def settle(jobs: list, work) -> None:
    """`work(jobs)`, then every job done: a failure is each waiting job's `error`, never lost, never raised here."""
    try:
        work(jobs)
    except BaseException as error:  # noqa: BLE001 - each waiting request gets the failure
        for job in jobs:
            job.error = error
    finally:
        for job in jobs:
            job.done.set()


class LocalModel:
    """Holds the model and answers chat-completion payloads (independent of HTTP), batching concurrent ones."""

    def __init__(self, model_dir: str | Path, name: str | None = None, *, device: str = "cpu", dtype=None):
        self.model, self.tokenizer = _load(model_dir, device=device, dtype=dtype)
        self.stop_ids = stop_token_ids(self.model, self.tokenizer)  # every end token (eos list, end of turn)
        self.name = name or Path(model_dir).name
        self.lock = threading.Lock()  # held while the model runs; whoever holds it serves the whole queue
        # entered around every chat generation: the server switches runtime LoRA adapters off in it, so
        # a chat request is the base model's answer (trainers/engine/serving.py)
        self.forward_context = contextlib.nullcontext
        self.batches = BatchQueue(self.lock, self._execute)

    def models(self) -> dict:
        """The /v1/models listing."""
        return {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "marl"}]}

    def queued(self) -> int:
        """How many requests wait for the model."""
        return self.batches.waiting()

    def _prompt_ids(self, messages: list[dict]):
        import torch

        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise RequestError(400, "invalid_request_error", "messages must be a non-empty list of "
                                                             "{role, content} objects with string content")
        # the one rendering the trainers use for an agent's turn too (common/chat.py)
        ids = self.tokenizer(render_chat(self.tokenizer, messages), add_special_tokens=False)["input_ids"]
        if not ids:
            raise RequestError(400, "invalid_request_error", "the prompt tokenised to nothing")
        return torch.tensor([ids])

    def _job(self, payload: dict, ids: list[int] | None = None) -> _Job:
        """The request checked and tokenised (a RequestError before it reaches the queue); `ids`: its
        prompt's token ids, when the caller has tokenised it already (`marl serve`, to check its length)."""
        if payload.get("model") not in (None, self.name):
            raise RequestError(404, "not_found_error", f"model {payload.get('model')!r} not found; "
                                                       f"this server serves {self.name!r}")
        if ids is None:
            ids = self._prompt_ids(payload.get("messages"))[0].tolist()
        max_tokens, temperature, top_p = _sampling(payload)
        seed = int(checked_number(payload, "seed", 0, -2 ** 63, 2 ** 63 - 1)) if payload.get("seed") is not None else None
        bias = _logit_bias(payload, int(self.model.config.vocab_size))
        top = int(payload.get("top_logprobs") or 0) if payload.get("logprobs") else None
        return _Job(ids, max_tokens, temperature, top_p, seed, bias, top)

    def chat(self, payload: dict, prompt_ids: list[int] | None = None) -> dict:
        """One chat completion, OpenAI-shaped (a RequestError for a bad request); `prompt_ids`: the rendered
        prompt's token ids, when the caller has them (else the payload's messages are rendered here)."""
        answer = self.chat_many([payload], [prompt_ids])[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def chat_many(self, payloads: list[dict], prompt_ids: list | None = None) -> list:
        """A completion per payload, in order, all queued at once (so they share generate calls); a bad
        payload's entry is its RequestError, and a failure of the model is raised. `prompt_ids`, where
        given, holds each payload's prompt token ids or None (then its messages are rendered here)."""
        answers: list = [None] * len(payloads)
        jobs: list[tuple[int, _Job]] = []
        for index, payload in enumerate(payloads):
            try:
                jobs.append((index, self._job(payload, prompt_ids[index] if prompt_ids else None)))
            except RequestError as error:
                answers[index] = error
        self.batches.run([job for _, job in jobs])
        for index, job in jobs:
            if job.error is not None:
                raise job.error
            answers[index] = self._completion(job, payloads[index])
        return answers

    def _execute(self, batch: list[_Job]) -> None:
        """Run the queued jobs, those of one group together (at most MAX_BATCH_ROWS per generate call)."""
        groups: dict[tuple, list[_Job]] = {}
        for job in batch:
            groups.setdefault(job.group(), []).append(job)
        for jobs in groups.values():
            for start in range(0, len(jobs), MAX_BATCH_ROWS):
                settle(jobs[start:start + MAX_BATCH_ROWS], self._generate)

    def _generate(self, jobs: list[_Job]) -> None:
        """One generate call over `jobs` (left-padded rows), each job's tokens and logprobs filled in."""
        import torch

        width, pad = max(len(job.ids) for job in jobs), self.tokenizer.pad_token_id
        device = next(self.model.parameters()).device  # `marl serve --device cuda` puts the model on a GPU
        ids = torch.tensor([[pad] * (width - len(job.ids)) + job.ids for job in jobs], device=device)
        mask = torch.tensor([[0] * (width - len(job.ids)) + [1] * len(job.ids) for job in jobs], device=device)
        first = jobs[0]
        sampling = dict(do_sample=True, temperature=first.temperature, top_p=first.top_p, top_k=0) \
            if first.temperature > 0 else dict(do_sample=False)
        if first.seed is not None:
            _seed_torch(first.seed)
        if any(job.bias for job in jobs):
            sampling["logits_processor"] = _bias_processor(jobs, int(self.model.config.vocab_size))
        with torch.no_grad(), self.forward_context():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(j.max_tokens for j in jobs),
                                      pad_token_id=pad, eos_token_id=self.stop_ids, output_scores=True,
                                      return_dict_in_generate=True, **sampling)
        for row, job in enumerate(jobs):
            tokens = out.sequences[row, width:].tolist()[:job.max_tokens]
            end = next((i for i, token in enumerate(tokens) if token in self.stop_ids), None)
            job.tokens = tokens if end is None else tokens[:end + 1]  # a finished row is padded after its end
            if job.top_logprobs is not None:
                kept = job.tokens if end is None else job.tokens[:end]
                job.content = self._logprobs(kept, [score[row] for score in out.scores[:len(kept)]], job.top_logprobs)

    def _completion(self, job: _Job, payload: dict) -> dict:
        ended = bool(job.tokens) and job.tokens[-1] in self.stop_ids
        kept = job.tokens[:-1] if ended else job.tokens  # the text stops before the end token
        choice = {"index": 0, "finish_reason": "stop" if ended else "length", "logprobs": None,
                  "message": {"role": "assistant", "content": self.tokenizer.decode(kept, skip_special_tokens=True)}}
        if job.content is not None:
            choice["logprobs"] = {"content": job.content}
        prompt_tokens = len(job.ids)
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name, "choices": [choice],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(job.tokens),
                          "total_tokens": prompt_tokens + len(job.tokens)}}

    def _logprobs(self, tokens, scores, top) -> list[dict]:
        """The OpenAI logprobs content of `tokens`, from the (processed) scores each was drawn from; the
        softmax runs in float64, so summing label probabilities loses nothing to rounding."""
        import torch

        content = []
        for token, score in zip(tokens, scores):
            logprobs = torch.log_softmax(score.double(), dim=-1)
            best = torch.topk(logprobs, k=min(max(top, 0), logprobs.numel()))
            content.append({"token": self.tokenizer.decode([token]), "logprob": _floored(logprobs[token].item()),
                            "bytes": None,
                            "top_logprobs": [{"token": self.tokenizer.decode([i]), "logprob": _floored(v), "bytes": None}
                                             for v, i in zip(best.values.tolist(), best.indices.tolist())]})
        return content


def _floored(logprob: float) -> float:
    """A JSON-safe logprob: -inf becomes LOGPROB_FLOOR (NaN stays NaN, for the check to refuse)."""
    return max(logprob, LOGPROB_FLOOR) if logprob == logprob else logprob


def _bias_processor(jobs: list[_Job], vocabulary: int):
    """A logits processor adding each row's logit_bias to its scores (zeros for rows without one)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    bias = torch.zeros(len(jobs), vocabulary)
    for row, job in enumerate(jobs):
        for token, value in job.bias.items():
            bias[row, token] = value

    class RowBias(LogitsProcessor):
        def __call__(self, input_ids, scores):
            return scores + bias[:, :scores.shape[-1]].to(scores.device, scores.dtype)

    return LogitsProcessorList([RowBias()])


class LocalBackend:
    """`ChatBackend` over a LocalModel, generating in a worker thread. The requests one event-loop turn
    brings (a judge's `asyncio.gather`) go to the model together, so they share generate calls."""

    def __init__(self, model_dir: str | Path, name: str | None = None):
        self.model = LocalModel(model_dir, name)
        self.identity = f"local:{self.model.name}@{Path(model_dir).resolve()}"
        self._pending: dict = {}  # event loop -> [(payload, future)] waiting for this turn's hand-over

    @property
    def tokenizer(self):
        """The model's tokenizer (the logprobs verdict checks its labels with it, judges.model.verdict)."""
        return self.model.tokenizer

    async def complete(self, request: ChatRequest) -> ChatResponse:
        """Generate; a client error becomes an api_error response, never an exception."""
        payload = {"messages": list(request.messages), "max_tokens": request.max_tokens,
                   "temperature": request.temperature, "seed": request.seed, "logprobs": request.logprobs,
                   "top_logprobs": request.top_logprobs,
                   "logit_bias": {str(token): bias for token, bias in request.logit_bias}}
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        waiting = self._pending.setdefault(loop, [])
        waiting.append((payload, future))
        if len(waiting) == 1:  # the first of this turn hands the whole turn's requests over, once they are in
            loop.call_soon(self._hand_over, loop)
        answer = await future
        if isinstance(answer, RequestError):
            return ChatResponse("api_error", error=f"{answer.status}: {answer}", latency=time.perf_counter() - started)
        choice = answer["choices"][0]
        content = (choice.get("logprobs") or {}).get("content")
        logprobs = tuple({t["token"]: t["logprob"] for t in token["top_logprobs"]} for token in content) \
            if content is not None else None
        status = "truncated" if choice["finish_reason"] == "length" else "ok"
        return checked_response(ChatResponse(status, text=choice["message"]["content"], finish_reason=choice["finish_reason"],
                            token_logprobs=logprobs, usage=answer["usage"], latency=time.perf_counter() - started))

    def _hand_over(self, loop) -> None:
        """Send the requests gathered in this turn to the model in one chat_many call (a worker thread)."""
        waiting = self._pending.pop(loop, [])
        work = loop.run_in_executor(None, self.model.chat_many, [payload for payload, _ in waiting])

        def deliver(done) -> None:
            error = asyncio.CancelledError() if done.cancelled() else done.exception()
            for index, (_, future) in enumerate(waiting):
                if not future.done():
                    future.set_exception(error) if error is not None else future.set_result(done.result()[index])

        work.add_done_callback(deliver)
