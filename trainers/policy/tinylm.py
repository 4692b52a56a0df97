"""The embedded default policy: a small Qwen2-architecture chat model built and warmed up on this machine.

No model hub is reachable, so the default model is made locally, as a user's pretrained model would
be laid out: a byte-level BPE tokenizer with ChatML tokens and chat template, trained with
`tokenizers` on the scenario's own texts and the general text the project ships
(trainers/policy/tokenizer.py); a Qwen2 config of about 1.7M parameters (RoPE, grouped-query
attention, tied embeddings, a context of 2048 tokens); and an SFT warm-up on the task's expert
demonstrations, rendered with the chat template exactly as an agent's turn is when it acts
(trainers/policy/prompts.py), that stops once sampled accuracy reaches a target (so that RL has room
to improve) or after a fixed number of steps.

The result is a standard directory (`save_pretrained`: config.json, generation_config.json listing
<|im_end|> and <|endoftext|> as eos, model.safetensors, the tokenizer with its chat template) that
plain `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load with no marl
code. It is cached under a key of the recipe, the demonstrations and the build code itself (the
source of every module below that shapes what is built), so a cache built by older code is never
reused. The first build takes a minute or two; later runs load it instantly. Any local Hugging Face
causal-LM directory loads through the same `load_policy`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from filelock import FileLock, Timeout

from common.files import write_directory_atomically
from trainers.policy.loading import load_policy  # noqa: F401 - moved to loading.py; kept for callers
from trainers.policy.tokenizer import GENERAL_TEXT, build_bpe_tokenizer, end_ids

_HERE = Path(__file__).resolve().parent
# the modules whose code decides what a build produces: any change to them is a new cache key
BUILD_SOURCES = (_HERE / "tinylm.py", _HERE / "tokenizer.py", _HERE / "prompts.py",
                 Path(__import__("common.chat", fromlist=["chat"]).__file__))


def build_code_version() -> str:
    """Hash of the build code's source (BUILD_SOURCES): part of every cache key."""
    digest = hashlib.sha256()
    for path in BUILD_SOURCES:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class TinyLMRecipe:
    """Everything about the tiny model's shape and warm-up; with its demonstrations and the build
    code's version it names the cache directory (`cache_key`)."""

    vocab_size: int = 1024
    """most BPE tokens (the 3 ChatML specials included); a small corpus stops with fewer"""
    hidden_size: int = 128
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_positions: int = 2048
    """the model's context in tokens (RoPE: nothing is learnt per position, so this costs nothing)"""
    seed: int = 0
    """seed of the weight init and of the SFT batch order"""
    sft_lr: float = 1e-3
    sft_warmup_steps: int = 100
    sft_batch_size: int = 64
    sft_max_steps: int = 3000
    sft_eval_every: int = 50
    sft_target_accuracy: float = 0.30
    """stop SFT once sampled accuracy (temperature 1) on the probe set reaches this"""


Demonstration = tuple  # (observation, message, TurnStyle): an expert turn, rendered by the build


def cache_key(recipe: TinyLMRecipe, demonstrations: Sequence[Demonstration]) -> str:
    """Short stable hash of the recipe, the demonstrations and the build code's version."""
    blob = json.dumps({"code": build_code_version(), "recipe": asdict(recipe),
                       "demonstrations": [[obs, msg, style.role, style.mode] for obs, msg, style in demonstrations]},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    """$MARL_CACHE, else ~/.cache/marl."""
    return Path(os.environ.get("MARL_CACHE", Path.home() / ".cache" / "marl"))


def tokenizer_texts(demonstrations: Sequence[Demonstration]) -> list[str]:
    """The tokenizer's corpus: the general text, the chat roles' names, and every demonstration's
    role, observation and message (each distinct text once)."""
    texts = list(GENERAL_TEXT) + ["system\nuser\nassistant\n"]
    for observation, message, style in demonstrations:
        texts += [style.role, observation, message]
    return list(dict.fromkeys(text for text in texts if text))


def build_tiny_tokenizer(recipe: TinyLMRecipe, demonstrations: Sequence[Demonstration]):
    """The BPE chat tokenizer of a tiny model (trainers/policy/tokenizer.py) on `tokenizer_texts`."""
    return build_bpe_tokenizer(tokenizer_texts(demonstrations), recipe.vocab_size)


def init_tiny_model(recipe: TinyLMRecipe, tokenizer):
    """A freshly initialised Qwen2ForCausalLM (fp32, tied embeddings) seeded by the recipe, whose
    generation config stops at <|im_end|> and <|endoftext|>."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=recipe.hidden_size,
                         num_hidden_layers=recipe.num_layers, num_attention_heads=recipe.num_heads,
                         num_key_value_heads=recipe.num_kv_heads, intermediate_size=recipe.intermediate_size,
                         max_position_embeddings=recipe.max_positions, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(recipe.seed)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config = GenerationConfig(eos_token_id=end_ids(tokenizer), pad_token_id=tokenizer.pad_token_id)
    return model


def _sft_batch(tokenizer, pairs: Sequence[tuple]) -> tuple[torch.Tensor, ...]:
    """Right-padded prompt+answer+end ids, attention mask, and labels on answer+end only.

    A demonstration is (prompt, answer), ended by eos, or (prompt, answer, end id): a chat model's
    end-of-turn token (trainers/policy/prompts.py:demonstration), the token it stops at when acting.
    """
    rows, label_rows = [], []
    for prompt, answer, *end in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [end[0] if end else tokenizer.eos_token_id]
        rows.append(p + a)
        label_rows.append([-100] * len(p) + a)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    for i, (row, lab) in enumerate(zip(rows, label_rows)):
        ids[i, :len(row)], mask[i, :len(row)], labels[i, :len(lab)] = torch.tensor(row), 1, torch.tensor(lab)
    return ids, mask, labels


@dataclass
class ProbeResult:
    """What a warm-up probe found: a figure for the history, whether SFT may stop, and the words logged."""

    value: float
    reached: bool
    text: str


def sft_warmup(model, tokenizer, demonstrations: Sequence[tuple], recipe: TinyLMRecipe,
               accuracy_fn: Callable[[object], float | ProbeResult] | None = None,
               log: Callable[[str], None] = print, time_budget_s: float | None = None) -> dict:
    """Supervised warm-up on (prompt, answer[, end id]) demonstrations, loss on the answer and its end
    token only (eos unless the demonstration names one). Prompts are used as given: the warm-up stage
    renders them as the model sees them when acting (trainers/policy/prompts.py).

    AdamW over `model.parameters()` with linear warm-up then constant lr: a LoRA learner's model is an
    AdapterPolicy (trainers/policy/adapters.py), whose parameters are its adapter's alone, so only the
    adapter trains and the frozen base stays bit-identical. Every `sft_eval_every` steps
    `accuracy_fn(model)` is called (sampled accuracy, or format compliance, on a probe set); training
    stops once it reaches the recipe's target (or, when it returns a ProbeResult, once that says
    `reached`). With `time_budget_s`, training also stops at the first probe (or step, without one)
    past that many seconds. Returns a small report (steps, final loss, accuracy history, seconds,
    whether the target was reached and whether the budget ran out).
    """
    if not demonstrations:
        raise ValueError("sft_warmup needs at least one demonstration")
    generator = torch.Generator().manual_seed(recipe.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, recipe.sft_warmup_steps)))
    history, loss, started, step = [], float("nan"), time.perf_counter(), 0
    reached = out_of_time = False
    for step in range(1, recipe.sft_max_steps + 1):
        model.train()
        pick = torch.randint(len(demonstrations), (recipe.sft_batch_size,), generator=generator).tolist()
        ids, mask, labels = _sft_batch(tokenizer, [demonstrations[i] for i in pick])
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        loss = out.loss.item()
        if accuracy_fn is None and step % recipe.sft_eval_every == 0:
            log(f"  sft step {step:4d}/{recipe.sft_max_steps}  loss {loss:.3f}  "
                f"{(time.perf_counter() - started) / step:.2f} s/step")
        if accuracy_fn is not None and step % recipe.sft_eval_every == 0:
            model.eval()
            probe = accuracy_fn(model)
            if not isinstance(probe, ProbeResult):
                probe = ProbeResult(probe, probe >= recipe.sft_target_accuracy, f"sampled accuracy {probe:.3f}")
            history.append({"step": step, "loss": loss, "accuracy": probe.value})
            log(f"  sft step {step:4d}  loss {loss:.3f}  {probe.text}")
            if probe.reached:
                reached = True
                break
        if time_budget_s is not None and time.perf_counter() - started > time_budget_s and \
                (accuracy_fn is None or step % recipe.sft_eval_every == 0):
            out_of_time = True
            break
    model.eval()
    return {"steps": step, "final_loss": loss, "history": history, "seconds": time.perf_counter() - started,
            "reached": reached, "out_of_time": out_of_time}


def save_atomically(model, tokenizer, target: Path, extra: dict) -> None:
    """Write model + tokenizer + a JSON report into a temp dir, then rename it into place (when another
    process built the same model first, its copy is kept)."""
    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        (directory / "marl_build.json").write_text(json.dumps(extra, indent=2))

    write_directory_atomically(target, write, keep_existing=True)


class CacheDirError(FileNotFoundError):
    """The tiny-model cache folder cannot be used (a file is in the way, or it cannot be created)."""


def _check_cache_folder(folder: Path) -> None:
    """Create `folder`, or CacheDirError naming what is in the way and how to choose another one."""
    how = "pass --cache-dir FOLDER or set MARL_CACHE (default ~/.cache/marl)"
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise CacheDirError(f"tiny-model cache {folder.parent}: {blocker} is a file, not a folder; {how}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CacheDirError(f"tiny-model cache {folder.parent}: cannot create {folder}: "
                            f"{error.strerror or error}; {how}") from None


def build_or_load_tiny_model(recipe: TinyLMRecipe, demonstrations: Sequence[Demonstration],
                             probe_accuracy: Callable[[object, object], float] | None = None,
                             cache_dir: str | Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Return the directory of the tiny model for `recipe` and its (observation, message, TurnStyle)
    demonstrations, building it first if it is not cached.

    The build trains the tokenizer on the demonstrations' texts and the general text, renders each
    demonstration as the agent's turn is rendered when it acts (`prompts.demonstration`: the chat
    template, the role as the system message, ended by <|im_end|>), and SFTs a fresh model on them.
    `probe_accuracy(model, tokenizer)` is the sampled accuracy the SFT stops on (None: the recipe's
    step budget). Deterministic for a key (seeded init and batch order) and written atomically.
    """
    if not demonstrations:
        raise ValueError("the tiny model needs at least one demonstration to warm up on")
    target = Path(cache_dir or default_cache_dir()) / "models" / f"tinylm-{cache_key(recipe, demonstrations)}"
    if (target / "marl_build.json").exists():
        log(f"tiny model: cached at {target}")
        return target
    _check_cache_folder(target.parent)  # before the build (a minute), not at its end
    # One build per model and machine: a second process asking for the same model while it is being
    # built (two runs started together, pytest-xdist workers) waits for it and loads it.
    with _build_lock(target, log):
        if (target / "marl_build.json").exists():
            log(f"tiny model: cached at {target} (built by another process meanwhile)")
            return target
        return _build_tiny_model(recipe, demonstrations, probe_accuracy, target, log)


@contextlib.contextmanager
def _build_lock(target: Path, log: Callable[[str], None]):
    """Hold an inter-process lock file beside `target` (the well-kept `filelock` package, which
    transformers' hub client depends on), saying so when another process holds it."""
    lock = FileLock(str(target.parent / f".{target.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log(f"tiny model: another process is building {target.name}; waiting for it")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _build_tiny_model(recipe: TinyLMRecipe, demonstrations: Sequence[Demonstration],
                      probe_accuracy: Callable[[object, object], float] | None, target: Path,
                      log: Callable[[str], None]) -> Path:
    """Build, warm up and save the tiny model of `recipe` at `target` (see build_or_load_tiny_model)."""
    from trainers.policy.prompts import demonstration

    log(f"tiny model: building {target.name} (first run only; one to six minutes on a 2-core CPU)")
    tokenizer = build_tiny_tokenizer(recipe, demonstrations)
    model = init_tiny_model(recipe, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"tiny model: Qwen2 architecture, {n_params:,} parameters, BPE vocabulary of {len(tokenizer)}, "
        f"SFT warm-up on {len(demonstrations)} demonstrations")
    rendered = [demonstration(tokenizer, observation, message, style) for observation, message, style in demonstrations]
    probe = (lambda m: probe_accuracy(m, tokenizer)) if probe_accuracy else None
    report = sft_warmup(model, tokenizer, rendered, recipe, probe, log)
    save_atomically(model, tokenizer, target, {"recipe": asdict(recipe), "build_code": build_code_version(),
                                               "parameters": n_params, "vocabulary": len(tokenizer),
                                               "demonstrations": len(demonstrations), "sft": report})
    log(f"tiny model: saved after {report['steps']} SFT steps in {report['seconds']:.0f}s")
    return target
