"""The generation side of `marl serve`: token-id completions and runtime LoRA adapters, as vLLM serves them.

    POST /v1/completions          {model, prompt: [ids] | [[ids], ...] | text, n, max_tokens, temperature,
                                   top_p, seed, logprobs (0 or 1), stop_token_ids, return_tokens_as_token_ids}
    POST /v1/load_lora_adapter    {lora_name, lora_path}: a saved peft adapter directory on this machine
    POST /v1/unload_lora_adapter  {lora_name}

This is the subset of vLLM's OpenAI-compatible server that `trainers.engine.http.HttpEngine` speaks,
so the HTTP engine is tested on a CPU against a real server. `model` is the served base model's name
or a loaded adapter's; the reply names the model that answered. Generation is marl's own sampler
(`sample_completions`) on the base with that adapter alone: a request seeded `s` draws its tokens from
the keyed stream `s` (`keyed_uniforms`), so the same prompt and seed give the same tokens here and in
the in-process engine, whichever requests share the batch. Every generated token, the end token
included, comes with its logprob; `return_tokens_as_token_ids` spells tokens `token_id:N`.

Runtime adapters are off unless the server was started with `--enable-lora` (as vLLM needs
`--enable-lora` and VLLM_ALLOW_RUNTIME_LORA_UPDATING): loading reads a directory named by the client.
Only safetensors weights are read (never a pickle), and an adapter trained on another base is refused
with the reason. A name is loaded once: loading it again is an error, as in vLLM.

The server's bounds (`marl serve --max-prompt-tokens`, `--max-new-tokens`; trainers/engine/connections.py)
are checked here too: a prompt over the first, or a `max_tokens` over the second, is a 400 naming the
flag (never a silently shortened answer), as is a prompt plus `max_tokens` over the model's context.
A text prompt is measured in bytes before it is tokenised (`CompletionService.check_text`): one longer
than --max-prompt-tokens tokens of the model's longest could spell is refused untokenised, where a 900 KB
prompt cost a worker 1.4 s of tokenising before its 400.

Concurrent completion requests are batched: whoever gets the model runs every waiting request with
the same model and sampling settings in one `sample_completions` call (keyed rows do not depend on
their batch, so batching changes no token).
"""

from __future__ import annotations

import threading
import time
import uuid
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from judges.model.local_backend import BatchQueue, RequestError, checked_number, settle
from trainers.policy.adapters import AdapterBase, AdapterBaseError

MAX_PROMPTS = 256  # prompts x n in one request
MAX_BATCH_ROWS = 64  # completions decoded in one sample_completions call (waiting requests are chunked)
MAX_N = 64
FALLBACK_CONTEXT = 4096  # the prompt bound when a model's config names no context length


def _bad(message: str) -> RequestError:
    return RequestError(400, "invalid_request_error", message)


def cap_error(name: str, value, cap: int) -> RequestError:
    """The 400 for a max_tokens over the server's cap (refused, never cut: the client asked for that many)."""
    return _bad(f"{name} must be at most {cap}, got {value!r}: the cap on new tokens of this server "
                "(marl serve --max-new-tokens)")


def check_lengths(prompt_tokens: int, max_tokens: int, name: str, service: CompletionService) -> None:
    """A 400 RequestError when a prompt is over the server's prompt bound, or it plus `max_tokens` is over
    the model's context."""
    if prompt_tokens > service.max_prompt_tokens:
        raise _bad(f"the prompt is {prompt_tokens} tokens; this server takes at most {service.max_prompt_tokens} "
                   "(marl serve --max-prompt-tokens; default the model's context)")
    if service.context and prompt_tokens + max_tokens > service.context:
        raise _bad(f"a prompt of {prompt_tokens} tokens plus {name}={max_tokens} is more than the model's "
                   f"context of {service.context} tokens; shorten the prompt or lower {name}")


def longest_token_bytes(tokenizer) -> int:
    """The most bytes of (normalised) text one token of `tokenizer` spells: its longest vocabulary entry,
    special tokens included, in UTF-8. Byte-level and sentencepiece spellings (Ġ, ▁) only overstate it. (A
    tokenizer fusing a run of unknown characters into one <unk>, with no byte fallback, could spell more; the
    causal LMs marl serves are byte-level or fall back to bytes.)"""
    return max((len(token.encode("utf-8", "surrogatepass")) for token in tokenizer.get_vocab()), default=1)


def _integer(payload: dict, name: str, default: int, low: int, high: int) -> int:
    value = payload.get(name)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return value


@dataclass(eq=False)
class _Job:
    """One prompt of a request, waiting for the model; `key` is its group (what may share a batch)."""

    model: str
    ids: list[int]
    key: tuple  # (model, n, max_tokens, temperature, top_p, greedy, stop ids, seeded)
    seed: int | None
    done: threading.Event = field(default_factory=threading.Event)
    rows: list[tuple[list[int], list[float], bool]] = field(default_factory=list)  # (tokens, logprobs, stopped) x n
    error: BaseException | None = None


class CompletionService:
    """Token-id completions and runtime LoRA adapters over a `LocalModel`'s model (see the module docstring)."""

    def __init__(self, local_model, model_dir: str | Path, *, enable_lora: bool = False,
                 max_prompt_tokens: int | None = None, max_new_tokens: int = 4096):
        self.local = local_model
        self.context = getattr(local_model.model.config, "max_position_embeddings", None)  # GPT-2: n_positions
        self.max_prompt_tokens = max_prompt_tokens or self.context or FALLBACK_CONTEXT
        self.max_new_tokens = max_new_tokens
        backend = getattr(local_model.tokenizer, "backend_tokenizer", None)  # a fast tokenizer's normaliser
        self.normalizer = backend.normalizer if backend is not None else None
        # a slow tokenizer's normalising is unknown: NFKC folds up to 4 bytes into 1 (U+1D400 to "A")
        folds = 4 if backend is None else 1
        self.prompt_bytes = self.max_prompt_tokens * longest_token_bytes(local_model.tokenizer) * folds
        self.model_dir, self.enable_lora = Path(model_dir), enable_lora
        self.adapters = None  # trainers.policy.adapters.AdapterBase, once an adapter is loaded
        self.names: dict[str, object] = {}  # loaded adapter name -> AdapterPolicy
        self.loaded_from: dict[str, str] = {}
        self.batches = BatchQueue(local_model.lock, self._execute)

    def check_text(self, text: str) -> None:
        """A 400 for a text prompt too long for max_prompt_tokens whatever it tokenises to, before it is
        tokenised: its (normalised) UTF-8 bytes are more than that many of the model's longest tokens spell."""
        if len(text) * 4 <= self.prompt_bytes:  # 4 bytes a character at most: fits, no need to measure
            return
        if self.normalizer is not None:  # what the tokenizer's model sees (NFC may fold 3 bytes into 1)
            text = self.normalizer.normalize_str(text)
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.prompt_bytes:
            raise _bad(f"the prompt is {size} bytes, more than {self.max_prompt_tokens} tokens of this model can "
                       f"spell (at most {self.prompt_bytes} bytes); this server takes at most "
                       f"{self.max_prompt_tokens} tokens (marl serve --max-prompt-tokens; default the model's context)")

    # -- adapters -----------------------------------------------------------------------------------

    def models(self) -> dict:
        """The /v1/models listing: the base, then every loaded adapter (its `parent` the base), as vLLM lists them."""
        listing = self.local.models()
        listing["data"] += [{"id": name, "object": "model", "owned_by": "marl", "parent": self.local.name,
                             "root": self.loaded_from[name]} for name in self.names]
        return listing

    def load_adapter(self, payload: dict) -> str:
        """Load the adapter directory `lora_path` as `lora_name` (a RequestError says why it cannot be)."""
        name, directory = self._adapter_request(payload, "lora_path")
        directory = Path(directory)
        if not (directory / "adapter_config.json").is_file():
            raise _bad(f"lora_path {directory}: not a LoRA adapter directory (no adapter_config.json)")
        if not (directory / "adapter_model.safetensors").is_file():
            raise _bad(f"lora_path {directory}: no adapter_model.safetensors (only safetensors weights are "
                       "loaded, never a pickle)")

        with self.local.lock:  # loading changes the model every request runs on; names are checked under it too
            if name in self.names or name == self.local.name:
                raise _bad(f"the adapter {name!r} is already loaded; a name is loaded once (publish a new "
                           "version under a new name, or unload it first)")
            try:
                if self.adapters is None:
                    self.adapters = AdapterBase(self.local.model, self.model_dir, self.local.tokenizer)
                self.names[name] = self.adapters.load(name, directory, trainable=False)
            except (AdapterBaseError, ValueError, OSError) as error:
                raise _bad(f"lora_path {directory}: {' '.join(str(error).split())[:300]}") from None
            finally:
                if self.adapters is not None and self.adapters.peft is None:  # the first load failed: no peft yet
                    self.adapters = None
            self.local.forward_context = self._base_only  # chat requests: the base, adapters off
            self.loaded_from[name] = str(directory)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload_adapter(self, payload: dict) -> str:
        """Drop the adapter `lora_name` (404 when none of that name is loaded)."""
        name, _ = self._adapter_request(payload, None)
        with self.local.lock:
            if name not in self.names:
                raise RequestError(404, "not_found_error", f"the adapter {name!r} cannot be found (loaded: "
                                                           f"{', '.join(self.names) or 'none'})")
            del self.names[name], self.loaded_from[name]
            with warnings.catch_warnings():  # peft says which adapter it made active instead: no news here
                warnings.simplefilter("ignore", UserWarning)
                self.adapters.peft.delete_adapter(name)
            self.adapters.active = None
        return f"Success: LoRA adapter '{name}' removed successfully."

    def _adapter_request(self, payload: dict, path_field: str | None) -> tuple[str, str | None]:
        if not self.enable_lora:
            raise _bad("runtime LoRA adapters are off on this server; start it with marl serve MODEL --enable-lora")
        name = payload.get("lora_name")
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise _bad("lora_name must be a non-empty string of at most 200 characters")
        path = payload.get(path_field) if path_field else None
        if path_field and (not isinstance(path, str) or not path):
            raise _bad(f"{path_field} must be the path of an adapter directory on the server's machine")
        return name, path

    def _base_only(self):
        """The chat endpoint's context: the base model with every loaded adapter switched off."""
        return self.adapters.peft.disable_adapter()

    # -- completions --------------------------------------------------------------------------------

    def complete(self, payload: dict) -> dict:
        """One /v1/completions answer (a RequestError for a bad request)."""
        model = payload.get("model") or self.local.name
        if not isinstance(model, str):
            raise _bad(f"model must be a string, got {model!r:.60}")
        if model != self.local.name and model not in self.names:
            raise RequestError(404, "not_found_error", f"model {model!r} not found; this server serves "
                                                       f"{', '.join([self.local.name, *self.names])}")
        prompts = self._prompts(payload.get("prompt"))
        n = _integer(payload, "n", 1, 1, MAX_N)
        if len(prompts) * n > MAX_PROMPTS:
            raise _bad(f"{len(prompts)} prompts x n={n} is more than {MAX_PROMPTS} completions in one request")
        vocabulary = int(self.local.model.config.vocab_size)
        stops = payload.get("stop_token_ids") or []
        if not isinstance(stops, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocabulary
                                                  for t in stops):
            raise _bad(f"stop_token_ids must be a list of token ids (0 to {vocabulary - 1})")
        if payload.get("logprobs") is not None and payload.get("logprobs") not in (0, 1):
            raise _bad(f"logprobs must be 0 or 1, got {payload.get('logprobs')!r}: marl serve returns the sampled "
                       "token's logprob only (/v1/chat/completions has top_logprobs)")
        temperature = checked_number(payload, "temperature", 1.0, 0.0, 100.0)
        asked = payload.get("max_tokens")
        if isinstance(asked, int) and not isinstance(asked, bool) and asked > self.max_new_tokens:
            raise cap_error("max_tokens", asked, self.max_new_tokens)
        max_tokens = _integer(payload, "max_tokens", 16, 1, self.max_new_tokens)
        check_lengths(max(len(ids) for ids in prompts), max_tokens, "max_tokens", self)
        key = (model, n, max_tokens, temperature,
               checked_number(payload, "top_p", 1.0, 1e-6, 1.0), temperature == 0,
               tuple(sorted({*stops, *self.local.stop_ids})))
        seed = _integer(payload, "seed", 0, 0, 2 ** 63 - 1) if payload.get("seed") is not None else None
        jobs = [_Job(model, ids, (*key, seed is not None), seed) for ids in prompts]  # seeded rows batch apart
        self._run(jobs)
        return self._answer(payload, model, jobs, n)

    def _prompts(self, prompt) -> list[list[int]]:
        """The request's prompts as token-id lists (a text prompt is tokenised without special tokens)."""
        vocabulary = int(self.local.model.config.vocab_size)
        if isinstance(prompt, str):
            self.check_text(prompt)
            prompt = [self.local.tokenizer(prompt, add_special_tokens=False)["input_ids"]]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt or not all(
                isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool)
                                                      and 0 <= t < vocabulary for t in ids) for ids in prompt):
            raise _bad(f"prompt must be a text, a non-empty list of token ids (0 to {vocabulary - 1}), or a list "
                       "of such lists")
        if len(prompt) > MAX_PROMPTS:
            raise _bad(f"{len(prompt)} prompts in one request; at most {MAX_PROMPTS}")
        return prompt

    def _run(self, jobs: list[_Job]) -> None:
        """Queue `jobs` and wait (batched with whatever else waits); the first failure is raised."""
        self.batches.run(jobs)
        failed = next((job.error for job in jobs if job.error is not None), None)
        if failed is not None:
            raise failed

    def _execute(self, batch: list[_Job]) -> None:
        """Every queued job, one `sample_completions` call per group (the model lock is held)."""
        groups: dict[tuple, list[_Job]] = {}
        for waiting in batch:
            groups.setdefault(waiting.key, []).append(waiting)
        for group in groups.values():
            rows = max(1, MAX_BATCH_ROWS // group[0].key[1])  # n completions per job
            for start in range(0, len(group), rows):
                settle(group[start:start + rows], self._generate)

    def _generate(self, jobs: list[_Job]) -> None:
        """One `sample_completions` call over a group of jobs (the model lock is held)."""
        import torch

        from trainers.policy.loading import model_device
        from trainers.policy.generation import encode_ids, sample_completions

        model, n, max_tokens, temperature, top_p, greedy, stops, _ = jobs[0].key
        if model != self.local.name and model not in self.names:  # unloaded while the request waited
            raise RequestError(404, "not_found_error", f"model {model!r} was unloaded before it could answer")
        policy = self.names.get(model, self.local.model)  # the base: every adapter is off (forward_context)
        ids, mask = encode_ids([job.ids for job in jobs], self.local.tokenizer.pad_token_id)
        seeded = not greedy and all(job.seed is not None for job in jobs)
        generator = None if seeded else torch.Generator(device=model_device(self.local.model)).manual_seed(
            time.time_ns() % 2 ** 63)  # an unseeded request: a fresh draw, on the model's device
        with self.local.forward_context() if policy is self.local.model else nullcontext():
            out = sample_completions(policy, ids, mask, group_size=n, max_new_tokens=max_tokens,
                                     temperature=temperature if not greedy else 1.0, top_p=top_p,
                                     greedy=greedy, eos_token_id=list(stops),
                                     pad_token_id=self.local.tokenizer.pad_token_id, generator=generator,
                                     row_keys=[job.seed for job in jobs] if seeded else None)
        for row, (tokens, logprobs, mask_row, truncated) in enumerate(zip(
                out.completion_ids.tolist(), out.logprobs.tolist(), out.completion_mask.tolist(),
                out.truncated.tolist())):
            length = sum(mask_row)
            jobs[row // n].rows.append((tokens[:length], logprobs[:length], not truncated))

    def _answer(self, payload: dict, model: str, jobs: list[_Job], n: int) -> dict:
        as_ids, with_logprobs = bool(payload.get("return_tokens_as_token_ids")), payload.get("logprobs") is not None
        decode, choices, generated = self.local.tokenizer.decode, [], 0
        for prompt_index, job in enumerate(jobs):
            for member, (tokens, logprobs, stopped) in enumerate(job.rows):
                generated += len(tokens)
                text_tokens = tokens[:-1] if stopped else tokens  # the text stops before the end token
                choice = {"index": prompt_index * n + member, "text": decode(text_tokens, skip_special_tokens=True),
                          "logprobs": None, "finish_reason": "stop" if stopped else "length", "stop_reason": None}
                if with_logprobs:
                    spelled = [f"token_id:{t}" if as_ids else decode([t]) for t in tokens]
                    choice["logprobs"] = {"tokens": spelled, "token_logprobs": logprobs,
                                          "top_logprobs": [{s: lp} for s, lp in zip(spelled, logprobs)],
                                          "text_offset": [0] * len(tokens)}
                choices.append(choice)
        prompt_tokens = sum(len(job.ids) for job in jobs)
        return {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "text_completion", "created": int(time.time()),
                "model": model, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                          "total_tokens": prompt_tokens + generated}}
