"""The HTTP engine: generation on an OpenAI-compatible server (vLLM, or `marl serve --enable-lora`).

    marl serve BASE_MODEL --enable-lora --port 8000
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE_MODEL --enable-lora --max-lora-rank 16 --port 8000

Each trained actor is a LoRA adapter on the served base. Before an actor's batch is sent, its
adapter's weights are hashed; when they changed since the last publication (an RL update, a warm-up
SFT step, a restored checkpoint: whatever changed them), the adapter is saved once under
`<adapters_dir>/<name>` and loaded into the server as `<actor>-<tag>-v<version>` (`adapter_name`),
and the previous version is unloaded. A request names the adapter version it wants, and the reply
must name it back: a server that lacks it, or answers for another model, is a StaleAdapterError,
never a silent sample. Prompts go out as token ids, one request per row seeded with the row's key,
all at once (the server batches them); the reply's tokens come back as `token_id:N` with their
logprobs, which the learner compares with its own (trainers/engine/correction.py).

Full-weight sync (a trained model without train.lora) is not supported: that is one line at setup.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainers.engine.base import EngineError, SamplingSettings, StaleAdapterError, adapter_name

MAX_CONCURRENT = 64  # requests in flight at once
LOGPROB_FLOOR = -9999.0  # what OpenAI-compatible servers send for a probability of 0
TRANSPORT_ATTEMPTS = 3  # tries of a request whose connection failed (not of one the server answered)


def _adapter_digest(policy) -> str:
    """sha256 of an adapter's weights (its state dict, names and bytes), what says whether it changed."""
    digest = hashlib.sha256()
    for name, tensor in sorted(policy.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class HttpEngine:
    """`RolloutEngine` over a generation server (see the module docstring)."""

    kind = "http"
    offpolicy = True  # another process's forward: the learner corrects for the mismatch (train.tis_cap)

    def __init__(self, base_url: str, adapters_dir: str | Path, *, timeout: float = 300.0, tag: str | None = None,
                 log=print):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.adapters_dir, self.log = Path(adapters_dir).resolve(), log
        self.tag = tag or secrets.token_hex(3)
        self.client = httpx.Client(base_url=self.base_url, timeout=timeout)
        self.published: dict[str, tuple[int, str, str]] = {}  # actor -> (version, digest, served name)
        self.served = served_models(self.base_url, timeout, self.client)

    # -- publishing adapters ------------------------------------------------------------------------

    def publish(self, actor: str, policy) -> str:
        """The served name of `actor`'s adapter at its current weights, publishing them first if they changed."""
        if not hasattr(policy, "save_pretrained") or not hasattr(policy, "owner"):
            raise EngineError(f"actor {actor!r}: the HTTP engine serves LoRA adapters only (set train.lora); "
                              "full-weight sync to a generation server is not supported yet")
        digest = _adapter_digest(policy)
        version, known, name = self.published.get(actor, (-1, None, None))
        if digest == known:
            return name
        version += 1
        fresh = adapter_name(actor, self.tag, version)
        directory = self.adapters_dir / fresh
        scratch = directory.with_name(directory.name + ".partial")
        shutil.rmtree(scratch, ignore_errors=True)
        policy.save_pretrained(scratch)
        scratch.replace(directory)  # written whole before the server may read it
        self._post("/load_lora_adapter", {"lora_name": fresh, "lora_path": str(directory)}, "load adapter")
        self.published[actor] = (version, digest, fresh)
        if name is not None:
            self._unload(name)
        return fresh

    def _unload(self, name: str) -> None:
        try:
            self._post("/unload_lora_adapter", {"lora_name": name}, "unload adapter")
        except EngineError as error:  # a leftover adapter costs server memory, not correctness
            self.log(f"warning: {error}")
        shutil.rmtree(self.adapters_dir / name, ignore_errors=True)

    def _post(self, path: str, body: dict, what: str):
        for attempt in range(TRANSPORT_ATTEMPTS):  # a reset connection is tried again: a request is seeded
            try:
                reply = self.client.post(path, json=body)
                break
            except Exception as error:  # noqa: BLE001
                if attempt + 1 == TRANSPORT_ATTEMPTS or not _transient(error):
                    raise EngineError(f"{what} at {self.base_url}{path}: {type(error).__name__}: {error}") from None
                time.sleep(0.5 * 2 ** attempt)
        if reply.status_code == 404 and path == "/completions":
            raise StaleAdapterError(f"{self.base_url} does not serve {body.get('model')!r} ({_message(reply)}): the "
                                    "adapter version this step asked for is not loaded; nothing was sampled with "
                                    "other weights")
        if reply.status_code >= 400:
            hint = " (start marl serve with --enable-lora; vLLM with --enable-lora and " \
                   "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)" if "lora" in path else ""
            raise EngineError(f"{what} at {self.base_url}{path}: HTTP {reply.status_code}: {_message(reply)}{hint}")
        return reply

    # -- generating ---------------------------------------------------------------------------------

    def generate(self, actor: str, policy, prompt_ids, prompt_mask, settings: SamplingSettings,
                 keys: Sequence[int] | None = None, generator=None):
        """One completion per prompt from the server, with the actor's current adapter version."""
        import torch

        from trainers.policy.loading import model_device

        name = self.publish(actor, policy)
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids.cpu(), prompt_mask.cpu())]
        if keys is None and not settings.greedy:
            device = generator.device if generator is not None else "cpu"
            keys = torch.randint(0, 2 ** 62, (len(prompts),), generator=generator, device=device).tolist()
        bodies = [{"model": name, "prompt": ids, "n": 1, "max_tokens": settings.max_new_tokens,
                   "temperature": 0.0 if settings.greedy else settings.temperature, "top_p": settings.top_p,
                   "logprobs": 1, "stop_token_ids": list(settings.stop_ids), "return_tokens_as_token_ids": True,
                   "skip_special_tokens": False, **({} if settings.greedy else {"seed": int(keys[row])})}
                  for row, ids in enumerate(prompts)]
        with ThreadPoolExecutor(max_workers=min(MAX_CONCURRENT, len(bodies))) as pool:
            replies = list(pool.map(lambda body: self._post("/completions", body, "generate"), bodies))
        rows = [self._row(reply, name, settings) for reply in replies]
        device = model_device(policy)  # where the learner trains: the rows go there, as in-process ones do
        return self._completions(prompt_ids.to(device), prompt_mask.to(device), rows, settings,
                                 self.published[actor][0])

    def _row(self, reply, name: str, settings: SamplingSettings) -> tuple[list[int], list[float], bool]:
        """(tokens, logprobs, ended) of one reply, checked: it names the asked adapter and carries token ids;
        anything else the server sent is one EngineError line."""
        try:
            reply = reply.json()
            return self._parsed_row(reply, name, settings)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
            raise EngineError(f"{self.base_url}/completions: a reply marl cannot read ({type(error).__name__}: "
                              f"{' '.join(str(error).split())[:160]})") from None

    def _parsed_row(self, reply: dict, name: str, settings: SamplingSettings) -> tuple[list[int], list[float], bool]:
        if reply.get("model") != name:
            raise StaleAdapterError(f"asked {self.base_url} for adapter {name!r}, and the reply came from "
                                    f"{reply.get('model')!r}: refusing a sample from other weights")
        choice = reply["choices"][0]
        spelled = (choice.get("logprobs") or {}).get("tokens")
        if spelled is None or not all(isinstance(t, str) and t.startswith("token_id:") for t in spelled):
            raise EngineError(f"{self.base_url}: the reply has no token ids (the server must honour "
                              "return_tokens_as_token_ids and logprobs, as vLLM and marl serve do)")
        tokens = [int(t.split(":", 1)[1]) for t in spelled]
        # a logprob the server did not send, or sent as its floor (-9999, -inf: a probability it rounded to 0),
        # is unknown (NaN): the learner weighs such a token 1, never by an infinite ratio
        logprobs = [float(lp) if isinstance(lp, int | float) and LOGPROB_FLOOR < lp <= 0 else float("nan")
                    for lp in choice["logprobs"]["token_logprobs"]]
        if len(logprobs) != len(tokens):
            raise EngineError(f"{self.base_url}: {len(tokens)} tokens but {len(logprobs)} logprobs in one reply")
        ended = choice.get("finish_reason") == "stop"
        if ended and (not tokens or tokens[-1] not in settings.stop_ids):  # a server that drops the end token:
            stop = choice.get("stop_reason")                                 # put it back, its logprob unknown
            tokens.append(stop if isinstance(stop, int) else settings.stop_ids[0])
            logprobs.append(float("nan"))
        return tokens, logprobs, ended

    @staticmethod
    def _completions(prompt_ids, prompt_mask, rows, settings: SamplingSettings, version: int):
        """The rows as a Completions batch (right-padded; entropy unknown: NaN)."""
        import torch

        from trainers.policy.generation import Completions

        width = max(1, max(len(tokens) for tokens, _, _ in rows))
        n, device = len(rows), prompt_ids.device
        ids = torch.full((n, width), settings.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        logprobs = torch.zeros((n, width))
        for row, (tokens, values, _) in enumerate(rows):
            ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[row, :len(tokens)] = 1
            logprobs[row, :len(values)] = torch.tensor(values)
        return Completions(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids.to(device),
                           completion_mask=mask.to(device), logprobs=logprobs.to(device),
                           truncated=torch.tensor([not ended for _, _, ended in rows], device=device),
                           entropy=torch.full((n, width), float("nan"), device=device),
                           prompt_index=torch.arange(n, device=device),
                           version=torch.full((n,), version, dtype=torch.long, device=device))

    def close(self) -> None:
        """Unload every adapter this engine published, and close the connection."""
        for _, _, name in self.published.values():
            self._unload(name)
        self.published.clear()
        self.client.close()


def _transient(error: Exception) -> bool:
    """A connection that failed on the way (reset, refused mid-run, timed out connecting): worth a retry."""
    import httpx

    return isinstance(error, (httpx.TransportError,)) and not isinstance(error, httpx.ReadTimeout)


def _message(reply) -> str:
    try:
        body = reply.json()
        text = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
        text = text or body.get("message") if isinstance(body, dict) else None
    except ValueError:
        text = None
    return " ".join(str(text or reply.text).split())[:300]


def served_models(base_url: str, timeout: float = 30.0, client=None) -> list[str]:
    """The server's model names (GET /models); an EngineError saying how to start one when none answers.
    `marl run` asks before it builds any model, so a server that is not there costs nothing."""
    import httpx

    try:
        if client is None:
            with httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout) as probe:
                reply = probe.get("/models")
        else:
            reply = client.get("/models")
        reply.raise_for_status()
        return [entry["id"] for entry in reply.json()["data"]]
    except Exception as error:  # noqa: BLE001 - any failure here means: no usable server at that address
        raise EngineError(f"train.engine.url {base_url}: no OpenAI-compatible server answers there "
                          f"({type(error).__name__}: {' '.join(str(error).split())[:160]}); start one first: "
                          "marl serve MODEL --enable-lora --port 8000 (or vllm serve MODEL --enable-lora)") from None


def attach_http_engine(actors: dict, spec, out: Path, log=print) -> HttpEngine | None:
    """With `train.engine.kind: http`, one HttpEngine generating for every LoRA actor (the others stay
    in-process); None otherwise. An unreachable server is an EngineError now, before any step."""
    if spec.kind != "http":
        return None
    engine = HttpEngine(spec.url, Path(spec.adapters_dir) if spec.adapters_dir else out / "engine_adapters",
                        timeout=spec.timeout_s, log=log)
    served = [name for name, actor in actors.items() if hasattr(getattr(actor, "model", None), "owner")]
    for name in served:
        actors[name].engine = engine
    log(f"engine: http at {engine.base_url} (serving {', '.join(engine.served) or 'nothing listed'}) for "
        f"{', '.join(served) or 'no actor'}; adapters published to {engine.adapters_dir} as "
        f"<actor>-{engine.tag}-v<N> when their weights change")
    return engine
