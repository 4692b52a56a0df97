"""Bradley-Terry reward-model training, readable top to bottom (what `marl rm train` runs).

    summary = train_reward_model(RewardTrainConfig(pairs="pairs.jsonl", base="MODEL_DIR", out="RM_DIR"))

The model is `AutoModelForSequenceClassification(num_labels=1)` on the base causal LM's weights: a new
scalar head reads the hidden state of each sequence's last token (the model TRL's RewardTrainer
trains). A pair's two answers are rendered as conversations with the base tokenizer's chat template
(`judges.model.reward_model.render_conversation`, the rendering the `reward_model` judge scores
with), and the loss is the Bradley-Terry negative log-likelihood

    loss = -mean(log sigmoid(r_chosen - r_rejected)) + center * mean((r_chosen + r_rejected) ** 2)

(the second term is TRL's optional `center_rewards_coefficient`, off by default). One optimiser:
fused AdamW with a linear decay to 0 and gradients clipped at norm 1, TRL's defaults. A seeded share of the pairs is held out;
its pairwise accuracy (ties count half) and loss are reported after every epoch. Pairs whose
rendering is longer than `max_length` tokens are left out and counted (as TRL filters them).
`epochs=0` trains nothing and saves the base with its seeded, untrained head (and its reward centre):
the baseline a trained reward model is compared with, through the same judge and report.

The output directory is written atomically: everything (the W&B run included) goes to a temporary
sibling that is renamed into place when training has finished, so a failed or interrupted run leaves
nothing behind and never a half-written reward model. It holds the model, the tokenizer and
`marl_reward_model.json` (the base, the tokenizer's fingerprint, the settings, the held-out figures
and `reward_center`, the mean reward of the training answers, which the judge's [0, 1] score is
centred on).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from common.chat import check_model_dir
from common.files import write_directory_atomically, write_text_atomically
from judges.model.reward_model import METADATA_FILE, render_conversation, tokenizer_fingerprint
from trainers.policy.loading import ModelLoadError, check_model_folder, load_model
from trainers.records.tracking import make_tracker
from trainers.reward.pairs import PairsError, PreferencePair, read_pairs, split_pairs

CENTER_SAMPLE = 256  # training pairs whose rewards set the judge's centre (both answers of each)


@dataclass
class RewardTrainConfig:
    """Everything one reward-model training run needs (the flags of `marl rm train`)."""

    pairs: str
    base: str
    out: str
    epochs: int = 1
    lr: float = 1e-4  # TRL's RewardConfig default
    batch_size: int = 8  # pairs per step (each step scores 2 x batch_size sequences)
    max_length: int | None = None  # tokens; default: min(1024, the base model's context)
    eval_fraction: float = 0.1
    seed: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # gradient clipping, as transformers' Trainer (and so TRL) does by default
    center_coefficient: float = 0.0
    lora_r: int = 0  # > 0: train LoRA adapters (and the head), merged into the saved model
    threads: int = 1
    log_every: int = 10
    tracker: str = "wandb"
    project: str = "marl"
    overwrite: bool = False


# -- 1. the loss ---------------------------------------------------------------------------------------------
def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, center_coefficient: float = 0.0) -> torch.Tensor:
    """-mean log sigmoid(r_chosen - r_rejected), plus the optional centring term (see the module doc)."""
    loss = -F.logsigmoid(chosen - rejected).mean()
    if center_coefficient:
        loss = loss + center_coefficient * ((chosen + rejected) ** 2).mean()
    return loss


def pairwise_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> float:
    """Share of pairs whose chosen answer gets the higher reward (a tie counts half)."""
    return float(((chosen > rejected).float() + 0.5 * (chosen == rejected).float()).mean())


# -- 2. the model and the data ---------------------------------------------------------------------------------
def load_base(config: RewardTrainConfig):
    """(model, tokenizer): the base directory as a one-output sequence classifier (seeded head)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if (problem := check_model_dir(config.base)) is not None:
        raise PairsError(f"--base {config.base}: {problem.removeprefix(f'{Path(config.base)}: ')}")
    tokenizer = AutoTokenizer.from_pretrained(config.base)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    try:  # a chat template that fails: one line now, not a traceback from the first pair rendered
        render_conversation(tokenizer, "1+2=", "3")
    except Exception as error:  # noqa: BLE001 - jinja raises many kinds; all mean "this template fails"
        raise PairsError(f"--base {config.base}: its chat template fails to render a pair ({type(error).__name__}: "
                         f"{' '.join(str(error).split())[:200]}); fix chat_template.jinja (or tokenizer_config.json's "
                         "chat_template), or remove it to score plain text") from None
    torch.manual_seed(config.seed)  # the new head's initial weights
    try:  # safetensors weights only, checked first (common/model_files.py); the head alone may be new
        check_model_folder(config.base)
        model = load_model(config.base, torch.float32, AutoModelForSequenceClassification, new_head=True,
                           what="a reward model", num_labels=1)
    except (ModelLoadError, FileNotFoundError) as error:
        raise PairsError(f"--base {config.base}: {str(error).removeprefix(f'{Path(config.base)}: ')}") from None
    model.config.pad_token_id = tokenizer.pad_token_id
    if config.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=2 * config.lora_r, target_modules="all-linear",
                                                 task_type="SEQ_CLS"))
    for module in model.modules():  # as TRL's disable_dropout: the two answers of a pair see the same network
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model, tokenizer


def encode_pairs(tokenizer, pairs: list[PreferencePair], max_length: int) -> tuple[list[tuple[list, list]], int]:
    """((chosen ids, rejected ids) per pair that fits in max_length tokens, how many did not fit)."""
    encoded, dropped = [], 0
    for pair in pairs:
        rows = [tokenizer(render_conversation(tokenizer, pair.prompt, answer), add_special_tokens=False)["input_ids"]
                for answer in (pair.chosen, pair.rejected)]
        if max(len(row) for row in rows) > max_length:
            dropped += 1
            continue
        encoded.append((rows[0], rows[1]))
    return encoded, dropped


def rewards_of(model, rows: list[list[int]], pad_id: int) -> torch.Tensor:
    """One forward over right-padded rows: the reward of each (a float32 vector)."""
    device = next(model.parameters()).device
    width = max(len(row) for row in rows)
    input_ids = torch.tensor([row + [pad_id] * (width - len(row)) for row in rows], device=device)
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows], device=device)
    return model(input_ids=input_ids, attention_mask=mask).logits[:, 0].float()


def pair_rewards(model, batch: list[tuple[list, list]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen rewards, rejected rewards) of a batch of encoded pairs, in one forward (as TRL concatenates)."""
    rewards = rewards_of(model, [c for c, _ in batch] + [r for _, r in batch], pad_id)
    return rewards[:len(batch)], rewards[len(batch):]


# -- 3. evaluation ---------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate_pairs(model, encoded: list[tuple[list, list]], pad_id: int, batch_size: int) -> dict:
    """Held-out pairwise accuracy, loss and mean margin (empty set: an empty dict)."""
    if not encoded:
        return {}
    was_training = model.training
    model.eval()
    chosen, rejected = [], []
    for start in range(0, len(encoded), batch_size):
        c, r = pair_rewards(model, encoded[start:start + batch_size], pad_id)
        chosen.append(c)
        rejected.append(r)
    model.train(was_training)
    chosen, rejected = torch.cat(chosen), torch.cat(rejected)
    return {"accuracy": pairwise_accuracy(chosen, rejected), "loss": float(bradley_terry_loss(chosen, rejected)),
            "margin": float((chosen - rejected).mean()), "pairs": len(encoded)}


@torch.no_grad()
def reward_center(model, encoded: list[tuple[list, list]], pad_id: int, batch_size: int, seed: int) -> float:
    """Mean reward of the answers of up to CENTER_SAMPLE training pairs (the judge's score centre)."""
    sample = random.Random(seed).sample(encoded, min(CENTER_SAMPLE, len(encoded)))
    total = 0.0
    model.eval()
    for start in range(0, len(sample), batch_size):
        chosen, rejected = pair_rewards(model, sample[start:start + batch_size], pad_id)
        total += float(chosen.sum() + rejected.sum())
    return total / (2 * len(sample))


# -- 4. the training loop --------------------------------------------------------------------------------------
def train_epoch(model, optimizer, scheduler, encoded, config: RewardTrainConfig, pad_id: int, rng: random.Random,
                state: dict, tracker, log) -> None:
    """One shuffled pass over the training pairs: a Bradley-Terry step per batch, logged every log_every."""
    order = list(encoded)
    rng.shuffle(order)
    model.train()
    for start in range(0, len(order), config.batch_size):
        chosen, rejected = pair_rewards(model, order[start:start + config.batch_size], pad_id)
        loss = bradley_terry_loss(chosen, rejected, config.center_coefficient)
        if not torch.isfinite(loss):  # diverged: stop now, before anything is written
            raise PairsError(f"training diverged at step {state['step'] + 1} (loss {float(loss.detach())}); "
                             f"lower --lr (now {config.lr:g})")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] += 1
        row = {"rm/step": state["step"], "rm/epoch": state["epoch"], "rm/loss": float(loss.detach()),
               "rm/accuracy": pairwise_accuracy(chosen, rejected), "rm/lr": scheduler.get_last_lr()[0]}
        tracker.log(row)
        if state["step"] % config.log_every == 0 or state["step"] == state["total"]:
            log(_progress_line(state, row))


def _progress_line(state: dict, row: dict) -> str:
    elapsed = time.perf_counter() - state["started"]
    per_step = elapsed / max(1, state["step"])
    return (f"rm step {state['step']}/{state['total']} (epoch {state['epoch']}/{state['epochs']}) | "
            f"loss {row['rm/loss']:.3f} | batch accuracy {row['rm/accuracy']:.2f} | {per_step:.3f} s/step | "
            f"eta {per_step * (state['total'] - state['step']):.0f}s")


def _optimizer(model, config: RewardTrainConfig, total_steps: int):
    # fused AdamW (one kernel for every tensor): what transformers' Trainer, and so TRL, uses by default
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                  weight_decay=config.weight_decay, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / max(1, total_steps)))
    return optimizer, scheduler


def check_config(config: RewardTrainConfig) -> None:
    """PairsError (one line) for a setting out of range or an --out in the way, before anything is loaded."""
    checks = [("--epochs", config.epochs, 0, 10_000, "each epoch passes over every training pair"),
              ("--batch-size", config.batch_size, 1, 4096, "a step scores 2 x batch-size answers in one forward"),
              ("--log-every", config.log_every, 1, None, ""), ("--threads", config.threads, 1, 1024,
                                                               "more threads than any machine has cores"),
              ("--lora-r", config.lora_r, 0, 4096, "a rank past the model's width adds nothing"),
              ("--seed", config.seed, 0, 2**32 - 1, "a seed is a 32-bit number: torch's generator takes no more")]
    for flag, value, low, high, why in checks:
        shown = str(value) if len(str(value)) <= 40 else f"{str(value)[:40]}..."  # a 4,000-digit --epochs is cut
        if value < low:
            raise PairsError(f"{flag} {shown}: expected {low} or more")
        if high is not None and value > high:
            raise PairsError(f"{flag} {shown}: at most {high:,} ({why})")
    if not (math.isfinite(config.lr) and config.lr > 0):
        raise PairsError(f"--lr {config.lr}: expected a number > 0, e.g. --lr 1e-4")
    if not (math.isfinite(config.center_coefficient) and config.center_coefficient >= 0):
        raise PairsError(f"--center-coefficient {config.center_coefficient}: expected a number >= 0, e.g. 0.01 "
                         "(a negative one rewards large rewards)")
    if not 0 <= config.eval_fraction < 1:
        raise PairsError(f"--eval-fraction {config.eval_fraction}: expected a number in [0, 1), e.g. 0.1")
    if config.max_length is not None and config.max_length < 2:
        raise PairsError(f"--max-length {config.max_length}: expected 2 or more tokens")
    out = Path(config.out)
    if out.exists() and not out.is_dir():
        raise PairsError(f"--out {out}: is a file; give a directory path for the reward model")
    if out.is_dir() and any(out.iterdir()) and not config.overwrite:
        raise PairsError(f"--out {out}: exists and is not empty; choose another directory or pass --overwrite "
                         "(the old one is replaced only when training has finished)")


def train_reward_model(config: RewardTrainConfig, log=print) -> dict:
    """Train a Bradley-Terry reward model (steps 1-4 above) and write it to config.out; its summary.

    PairsError (one line) for bad pairs, settings or directories, before anything is written.
    """
    check_config(config)
    pairs = read_pairs(config.pairs)
    train_pairs, held_out_pairs = split_pairs(pairs, config.eval_fraction, config.seed)
    torch.set_num_threads(config.threads)
    model, tokenizer = load_base(config)
    context = getattr(model.config, "max_position_embeddings", None) or 1024
    max_length = config.max_length or min(1024, context)
    if max_length > context:
        raise PairsError(f"--max-length {max_length}: longer than the base model's context ({context} tokens)")
    train_set, dropped = encode_pairs(tokenizer, train_pairs, max_length)
    held_out, dropped_held = encode_pairs(tokenizer, held_out_pairs, max_length)
    if not train_set:
        raise PairsError(f"{config.pairs}: every training pair is longer than --max-length {max_length} tokens")
    summary: dict = {}

    def write(tmp: Path) -> None:
        summary.update(_train_into(tmp, model, tokenizer, train_set, held_out, config, max_length, log))
        summary.update(pairs=len(pairs), train_pairs=len(train_set), held_out_pairs=len(held_out),
                       dropped_too_long=dropped + dropped_held)
        _save(tmp, model, tokenizer, config, summary)

    log(f"reward model: {len(train_set)} training pairs, {len(held_out)} held out"
        + (f", {dropped + dropped_held} left out (longer than {max_length} tokens)" if dropped + dropped_held else ""))
    write_directory_atomically(Path(config.out), write)
    return summary


def _train_into(tmp: Path, model, tokenizer, train_set, held_out, config: RewardTrainConfig, max_length: int,
                log) -> dict:
    pad_id = tokenizer.pad_token_id
    steps_per_epoch = math.ceil(len(train_set) / config.batch_size)
    optimizer, scheduler = _optimizer(model, config, steps_per_epoch * config.epochs)
    rng = random.Random(config.seed)
    state = {"step": 0, "epoch": 0, "epochs": config.epochs, "total": steps_per_epoch * config.epochs,
             "started": time.perf_counter()}
    before = evaluate_pairs(model, held_out, pad_id, config.batch_size)
    epochs, seconds = [], []
    with make_tracker(config.tracker, tmp, project=config.project, name=Path(config.out).name,
                      config={**asdict(config), "max_length": max_length}) as tracker:
        for epoch in range(1, config.epochs + 1):
            state["epoch"] = epoch
            started = time.perf_counter()
            train_epoch(model, optimizer, scheduler, train_set, config, pad_id, rng, state, tracker, log)
            seconds.append(time.perf_counter() - started)
            result = evaluate_pairs(model, held_out, pad_id, config.batch_size)
            epochs.append({"epoch": epoch, "seconds": seconds[-1], **result})
            tracker.log({"rm/step": state["step"], "rm/epoch": epoch, "rm/epoch_seconds": seconds[-1],
                         **{f"rm/eval_{k}": v for k, v in result.items() if k != "pairs"}})
            log(f"epoch {epoch}/{config.epochs}: {seconds[-1]:.1f}s"
                + (f", held-out accuracy {result['accuracy']:.3f} on {result['pairs']} pairs (loss {result['loss']:.3f})"
                   if result else ", no held-out pairs"))
        last = epochs[-1] if epochs else {"epoch": 0, "seconds": 0.0, **before}  # 0 epochs: the untrained baseline
        summary = {"held_out_before": before, "held_out": last if held_out else {}, "epochs": epochs,
                   "seconds_per_epoch": sum(seconds) / len(seconds) if seconds else None, "steps": state["step"],
                   "max_length": max_length,
                   "reward_center": reward_center(model, train_set, pad_id, config.batch_size, config.seed)}
        tracker.summary({k: v for k, v in summary.items() if k != "epochs"})
    return summary


def _save(tmp: Path, model, tokenizer, config: RewardTrainConfig, summary: dict) -> None:
    """The trained model (LoRA merged), its tokenizer and the training record, into the temporary directory."""
    if config.lora_r > 0:
        model = model.merge_and_unload()
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    record = {"kind": "bradley_terry", "base": str(Path(config.base).resolve()),
              "tokenizer_sha256": tokenizer_fingerprint(tmp), "max_length": summary.get("max_length"),
              "settings": asdict(config), **summary}
    write_text_atomically(tmp / METADATA_FILE, json.dumps(record, indent=2, allow_nan=False, default=str) + "\n")
