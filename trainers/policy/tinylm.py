"""The embedded default policy: a tiny character-level Llama built and warmed up on this machine.

No model hub is reachable, so the default model is made locally: a character tokenizer built with
`tokenizers`, a Llama config of about 1.6M parameters, and an SFT warm-up on the task's expert
demonstrations that stops once sampled accuracy reaches a target (so that RL has room to improve).
The result is saved with `save_pretrained` under a cache directory keyed by the hash of its recipe:
the first build takes about a minute, later runs load it instantly. Any local Hugging Face
causal-LM directory loads through the same `load_policy`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from marl.addition import ALPHABET
from trainers.policy.loading import load_policy  # noqa: F401 - moved to loading.py; kept for callers

RECIPE_VERSION = 1  # bump when the build code changes what a recipe produces
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


@dataclass(frozen=True)
class TinyLMRecipe:
    """Everything that determines the tiny model; its hash names the cache directory."""

    alphabet: str = ALPHABET
    """characters the tokenizer knows, one token each (plus <pad> <bos> <eos> <unk>)"""
    hidden_size: int = 128
    num_layers: int = 6
    num_heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 32
    """longest prompt + completion in tokens"""
    seed: int = 0
    """seed of the weight init and of the SFT batch order"""
    sft_lr: float = 1e-3
    sft_warmup_steps: int = 100
    sft_batch_size: int = 64
    sft_max_steps: int = 3000
    sft_eval_every: int = 50
    sft_target_accuracy: float = 0.30
    """stop SFT once sampled accuracy (temperature 1) on the probe set reaches this"""

    def key(self) -> str:
        """Short stable hash of the recipe (and of the build code's version)."""
        blob = json.dumps({"v": RECIPE_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    """$MARL_CACHE, else ~/.cache/marl."""
    return Path(os.environ.get("MARL_CACHE", Path.home() / ".cache" / "marl"))


def build_char_tokenizer(alphabet: str):
    """A character-level fast tokenizer: one token per character, left padding, no BOS added."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet {alphabet!r} repeats a character")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(alphabet)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", padding_side="left")


def init_tiny_model(recipe: TinyLMRecipe, vocab_size: int, pad_id: int, bos_id: int, eos_id: int):
    """A freshly initialised LlamaForCausalLM (fp32, untied embeddings) seeded by the recipe."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=recipe.hidden_size,
                         num_hidden_layers=recipe.num_layers, num_attention_heads=recipe.num_heads,
                         intermediate_size=recipe.intermediate_size, max_position_embeddings=recipe.max_positions,
                         pad_token_id=pad_id, bos_token_id=bos_id, eos_token_id=eos_id, tie_word_embeddings=False)
    torch.manual_seed(recipe.seed)
    return LlamaForCausalLM(config).float()


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


def sft_warmup(model, tokenizer, demonstrations: Sequence[tuple], recipe: TinyLMRecipe,
               accuracy_fn: Callable[[object], float] | None = None,
               log: Callable[[str], None] = print) -> dict:
    """Supervised warm-up on (prompt, answer[, end id]) demonstrations, loss on the answer and its end
    token only (eos unless the demonstration names one). Prompts are used as given: the warm-up stage
    renders them as the model sees them when acting (trainers/policy/prompts.py).

    AdamW over `model.parameters()` with linear warm-up then constant lr: a LoRA learner's model is an
    AdapterPolicy (trainers/policy/adapters.py), whose parameters are its adapter's alone, so only the
    adapter trains and the frozen base stays bit-identical. Every `sft_eval_every` steps
    `accuracy_fn(model)` is called (sampled accuracy, or format compliance, on a probe set); training
    stops once it reaches the recipe's target. Returns a small report (steps, final loss, accuracy
    history, seconds).
    """
    if not demonstrations:
        raise ValueError("sft_warmup needs at least one demonstration")
    generator = torch.Generator().manual_seed(recipe.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, recipe.sft_warmup_steps)))
    history, loss, started, step = [], float("nan"), time.perf_counter(), 0
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
            accuracy = accuracy_fn(model)
            history.append({"step": step, "loss": loss, "accuracy": accuracy})
            log(f"  sft step {step:4d}  loss {loss:.3f}  sampled accuracy {accuracy:.3f}")
            if accuracy >= recipe.sft_target_accuracy:
                break
    model.eval()
    return {"steps": step, "final_loss": loss, "history": history, "seconds": time.perf_counter() - started}


def save_atomically(model, tokenizer, target: Path, extra: dict) -> None:
    """Write model + tokenizer + a JSON report into a temp dir, then rename it into place (when another
    process built the same model first, its copy is kept)."""
    from trainers.runs.atomic import write_directory_atomically

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


def build_or_load_tiny_model(recipe: TinyLMRecipe, demonstrations: Sequence[tuple[str, str]],
                             probe_accuracy: Callable[[object, object], float] | None = None,
                             cache_dir: str | Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Return the directory of the tiny model for `recipe`, building it first if it is not cached.

    `probe_accuracy(model, tokenizer)` is the sampled accuracy the SFT warm-up stops on. The build is
    deterministic for a recipe (one thread, seeded init and batch order) and written atomically.
    """
    target = Path(cache_dir or default_cache_dir()) / "models" / f"tinylm-{recipe.key()}"
    if (target / "marl_build.json").exists():
        log(f"tiny model: cached at {target}")
        return target
    _check_cache_folder(target.parent)  # before the build (a minute), not at its end
    log(f"tiny model: building {target.name} (first run only, about a minute)")
    tokenizer = build_char_tokenizer(recipe.alphabet)
    model = init_tiny_model(recipe, len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id,
                            tokenizer.eos_token_id)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"tiny model: {n_params:,} parameters, SFT warm-up on {len(demonstrations)} demonstrations")
    probe = (lambda m: probe_accuracy(m, tokenizer)) if probe_accuracy else None
    report = sft_warmup(model, tokenizer, demonstrations, recipe, probe, log)
    save_atomically(model, tokenizer, target, {"recipe": asdict(recipe), "parameters": n_params, "sft": report})
    log(f"tiny model: saved after {report['steps']} SFT steps in {report['seconds']:.0f}s")
    return target
