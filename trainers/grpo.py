"""The GRPO core, top to bottom: advantages, the clipped policy loss, then the trainer.

1. `group_advantages(rewards, group_size, scale)`: (r - group mean) / (Bessel std + 1e-4).
2. `policy_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, ...)`: token-level ratio,
   clipped surrogate, k3 KL to a reference multiplied by the ratio, and the four aggregations.
   Both are pure tensor functions, numerically identical to TRL 1.16's GRPOTrainer (checked against
   TRL's own `_compute_loss` in tests/test_grpo_trl_equivalence.py).
3. `GRPOConfig` and `GRPOTrainer.step()`: sample groups -> score (failures masked) -> safeguards ->
   advantages -> `mu` updates of the compacted batch -> metrics. The update itself (optimizer, lr
   schedule, spike guard, KL reference, exact batch compaction) is `trainers.learner.PolicyLearner`,
   which the multi-agent trainer uses for each of its policies too.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from marl.types import Task
from trainers.safeguards import (DifficultyBuckets, apply_floor_reward, collapse_alarm, diversity_penalties,
                                 group_self_bleu)
from trainers.sampling import Completions, decode_completions, encode_prompts, sample_completions

LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")
SCALE_MODES = ("group", "batch", "none")
STD_EPS = 1e-4  # TRL adds 1e-4 (not 1e-8) to the std before dividing


def _nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Bessel-corrected standard deviation ignoring NaNs (NaN where fewer than two values)."""
    keep = dict(dim=dim, keepdim=True) if dim is not None else {}
    mean = torch.nanmean(x, **keep)
    var = torch.nanmean((x - mean) ** 2, **keep)
    count = (~torch.isnan(x)).sum(**keep)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(var, float("nan")))
    std = torch.sqrt(var * correction)
    return std.squeeze(dim) if dim is not None else std.reshape(())


def group_advantages(rewards, group_size: int, scale: str = "group") -> torch.Tensor:
    """Group-relative advantages for rewards grouped contiguously, G = group_size per prompt.

    `scale="group"`: (r - group mean) / (group std + 1e-4); `"batch"`: (r - group mean) /
    (batch std + 1e-4); `"none"`: r - group mean. Std is Bessel-corrected. A NaN reward (a masked
    judge or reward failure) is left out of every statistic and gets advantage 0, as in TRL 1.16.
    """
    rewards = torch.as_tensor(rewards)
    if not torch.is_floating_point(rewards):
        rewards = rewards.to(torch.float32)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"group_size={group_size} must be >= 1 and divide len(rewards)={rewards.numel()} "
            "(rewards are grouped contiguously, G per prompt)"
        )
    if scale not in SCALE_MODES:
        raise ValueError(f"scale={scale!r} is not one of {SCALE_MODES}")
    grouped = rewards.view(-1, group_size)
    group_mean = torch.nanmean(grouped, dim=1).repeat_interleave(group_size)
    advantages = rewards - group_mean
    if scale == "group":
        std = _nanstd(grouped, dim=1).repeat_interleave(group_size) if group_size > 1 else torch.zeros_like(rewards)
        advantages = advantages / (std + STD_EPS)
    elif scale == "batch":
        std = _nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = advantages / (std + STD_EPS)
    return torch.nan_to_num(advantages, nan=0.0)


def zero_std_group_fraction(rewards, group_size: int) -> float:
    """Fraction of groups whose (non-NaN) rewards are all equal: they carry no GRPO signal."""
    grouped = torch.as_tensor(rewards, dtype=torch.float64).view(-1, group_size)
    if group_size == 1:
        return 1.0
    std = torch.nan_to_num(_nanstd(grouped, dim=1), nan=0.0)
    return torch.isclose(std, torch.zeros_like(std)).double().mean().item()


@dataclass
class LossStats:
    """Detached diagnostics of one `policy_loss` call (masked token means over the batch)."""

    kl: float | None
    clip_fraction: float
    low_clip_fraction: float
    high_clip_fraction: float


def _check_loss_inputs(logprobs, old_logprobs, ref_logprobs, advantages, mask, beta):
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    shape = tuple(logprobs.shape)
    named = {"old_logprobs": old_logprobs, "mask": mask}
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("ref_logprobs is required when beta != 0 (pass the reference model's logprobs)")
        named["ref_logprobs"] = ref_logprobs
    for name, tensor in named.items():
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but logprobs has shape {shape}; both must be (B, T)")
    if tuple(advantages.shape) not in ((shape[0],), (shape[0], 1)):
        raise ValueError(f"advantages must be (B,) = ({shape[0]},), got shape {tuple(advantages.shape)}")
    for name, tensor in (("logprobs", logprobs), ("advantages", advantages)):
        if not torch.is_floating_point(tensor):
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")


def _aggregate(per_token_loss, mask, loss_type, max_completion_length, row_weights):
    """Reduce (B, T) token losses to one scalar exactly as TRL 1.16 does for one optimizer step.

    With row_weights w, row r counts as w_r identical rows (numerators and normalisers alike).
    """
    if row_weights is None:
        row_weights = torch.ones(per_token_loss.size(0), dtype=per_token_loss.dtype)
    row_weights = row_weights.to(per_token_loss.dtype)
    row_sums = (per_token_loss * mask).sum(-1)
    if loss_type == "grpo":
        return (row_weights * row_sums / mask.sum(-1).clamp(min=1.0)).sum() / row_weights.sum()
    if loss_type == "dr_grpo":
        length = max_completion_length if max_completion_length is not None else mask.size(1)
        return (row_weights * row_sums).sum() / (row_weights.sum() * length)
    # dapo: TRL normalises by the completion tokens of the whole generation batch; for one optimizer
    # step over that batch this is mask.sum(), which is also bnpo's normaliser.
    return (row_weights * row_sums).sum() / (row_weights * mask.sum(-1)).sum().clamp(min=1.0)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "dapo",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    max_completion_length: int | None = None,
    row_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """Clipped GRPO surrogate with optional k3 KL, aggregated as TRL 1.16 for one optimizer step.

    logprobs, old_logprobs, ref_logprobs, mask: (B, T); advantages: (B,). `old_logprobs=None` means
    on-policy (the detached current logprobs, ratio 1). `ref_logprobs` is only read when beta != 0.
    Per token: ratio = exp(logp - old), loss = -min(ratio*A, clip(ratio, 1-eps_low, 1+eps_high)*A)
    + beta * ratio * (exp(ref - logp) - (ref - logp) - 1). Aggregation: `dapo`/`bnpo` sum/mask.sum(),
    `grpo` mean of per-sequence means, `dr_grpo` sum/(B * max_completion_length, default T).
    `row_weights` (B,), optional: row r stands for w_r identical rows (the trainer merges duplicate
    completions); the result equals the loss of the batch with every row repeated w_r times.
    Returns the scalar loss and detached `LossStats`.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r} is not one of {LOSS_TYPES}")
    _check_loss_inputs(logprobs, old_logprobs, ref_logprobs, advantages, mask, beta)
    mask = mask.to(logprobs.dtype)
    old_logprobs = logprobs.detach() if old_logprobs is None else old_logprobs
    advantages = advantages.reshape(-1, 1).to(logprobs.dtype)

    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    per_token_kl = None
    if beta != 0.0:
        delta = ref_logprobs - logprobs
        per_token_kl = (torch.exp(delta) - delta - 1) * ratio
        per_token_loss = per_token_loss + beta * per_token_kl
    if row_weights is not None and tuple(row_weights.shape) != (logprobs.size(0),):
        raise ValueError(f"row_weights must be (B,) = ({logprobs.size(0)},), got shape {tuple(row_weights.shape)}")
    loss = _aggregate(per_token_loss, mask, loss_type, max_completion_length, row_weights)
    stats_mask = mask if row_weights is None else mask * row_weights.to(mask.dtype)[:, None]
    return loss, _loss_stats(ratio.detach(), advantages, stats_mask, per_token_kl, epsilon_low, epsilon_high)


def _loss_stats(ratio, advantages, mask, per_token_kl, epsilon_low, epsilon_high) -> LossStats:
    tokens = mask.sum().clamp(min=1.0)

    def masked_mean(x):
        return ((x.to(mask.dtype) * mask).sum() / tokens).item()

    low = (ratio < 1 - epsilon_low) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    kl = masked_mean(per_token_kl.detach()) if per_token_kl is not None else None
    return LossStats(kl=kl, clip_fraction=masked_mean(low | high), low_clip_fraction=masked_mean(low),
                     high_clip_fraction=masked_mean(high))


# --------------------------------------------------------------------------------------------------
# The trainer: configuration, then one step = sample -> score -> safeguards -> advantages -> update.
# --------------------------------------------------------------------------------------------------


@dataclass
class GRPOConfig:
    """Every knob of the GRPO core, with defaults that train the tiny model on this CPU."""

    steps: int = 30
    """optimizer steps of the run (each plays prompts_per_step x group_size completions)"""
    prompts_per_step: int = 8
    """prompts per step, all drawn from one difficulty bucket"""
    group_size: int = 8
    """G: completions per prompt; advantages are relative within a group"""
    max_new_tokens: int = 8
    """longest completion; rows stop at EOS before that"""
    temperature: float = 1.0
    """sampling temperature; logprobs are taken at logits / temperature, as in TRL"""
    top_p: float = 1.0
    """nucleus sampling mass (1 = off)"""
    lr: float = 5e-5
    """AdamW learning rate (5e-5 suits the tiny model; >= 2e-4 degrades it)"""
    lr_schedule: str = "constant"
    """constant | linear | cosine (decay to 0 over `steps`, after `warmup_steps`)"""
    warmup_steps: int = 0
    """linear lr warm-up steps"""
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    """gradient clipping by global norm"""
    loss_type: str = "dapo"
    """dapo | grpo | dr_grpo | bnpo, with TRL 1.16's aggregation"""
    scale_rewards: str = "group"
    """group | batch | none: how advantages are scaled"""
    beta: float = 0.0
    """KL coefficient to a frozen reference copy (no reference is built when 0)"""
    epsilon_low: float = 0.2
    """lower clip: ratio >= 1 - epsilon_low"""
    epsilon_high: float = 0.2
    """upper clip: ratio <= 1 + epsilon_high (DAPO's clip-higher uses 0.28)"""
    mu: int = 1
    """policy updates per generated batch (old logprobs are the detached current ones when 1)"""
    spike_factor: float = 10.0
    """skip a step whose grad norm exceeds spike_factor x its running median (0 disables)"""
    spike_window: int = 20
    """steps in the running median of the spike guard"""
    spike_on_loss: bool = False
    """also skip a step whose |loss| exceeds spike_factor x its running median (off: see learner.SpikeGuard)"""
    floor_reward: float = 0.05
    """reward given to the most complete member of an all-failed group (0 disables)"""
    diversity_threshold: float = 0.8
    """pairwise BLEU above which a completion counts as a near-duplicate in its group"""
    diversity_penalty: float = 0.0
    """amount subtracted from a near-duplicate's reward (0 disables)"""
    collapse_threshold: float = 0.9
    """group Self-BLEU above which a collapse alarm is counted"""
    buckets: int = 3
    """difficulty buckets; every batch is drawn from one bucket (1 = uniform sampling)"""
    bucket_ema: float = 0.1
    """weight of a new observation in each task's pass-rate EMA"""
    seed: int = 0
    """seeds the sampler, the task order and torch (runs are reproducible for a seed)"""
    threads: int = 1
    """torch intra-op threads (1 is usually fastest on a small shared CPU)"""

    def __post_init__(self):
        checks = [
            (self.loss_type in LOSS_TYPES, f"loss_type={self.loss_type!r} must be one of {LOSS_TYPES}"),
            (self.scale_rewards in SCALE_MODES, f"scale_rewards={self.scale_rewards!r} must be one of {SCALE_MODES}"),
            (self.lr_schedule in ("constant", "linear", "cosine"),
             f"lr_schedule={self.lr_schedule!r} must be constant, linear or cosine"),
            (self.group_size >= 2, f"group_size={self.group_size} must be >= 2 (advantages compare group members)"),
            (self.prompts_per_step >= 1, f"prompts_per_step={self.prompts_per_step} must be >= 1"),
            (self.mu >= 1, f"mu={self.mu} must be >= 1"),
            (self.temperature > 0, f"temperature={self.temperature} must be > 0"),
            (self.threads >= 1, f"threads={self.threads} must be >= 1"),
            (self.beta >= 0, f"beta={self.beta} must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"GRPOConfig: {message}")


RewardFn = Callable[[Task, str], float]
ProgressFn = Callable[[Task, str], float]


def score_completions(reward_fn: RewardFn, tasks: Sequence[Task], texts: Sequence[str]) -> tuple[list[float], int]:
    """Call the reward function per completion; a raise or a non-finite value becomes NaN (masked).

    Returns the rewards and how many were masked. A masked sample gets advantage 0 and is left out
    of the group statistics, so a broken reward never looks like a bad policy.
    """
    rewards, masked = [], 0
    for task, text in zip(tasks, texts):
        try:
            value = float(reward_fn(task, text))
        except Exception:  # noqa: BLE001 - any reward failure is masked and counted, never scored 0
            value = float("nan")
        if not math.isfinite(value):
            value, masked = float("nan"), masked + 1
        rewards.append(value)
    return rewards, masked


class GRPOTrainer:
    """Single-policy GRPO on a list of tasks and a per-completion reward function.

    `step()` runs one optimizer step and returns its metrics: sample G completions for each prompt of
    a batch drawn from one difficulty bucket, score them (failures masked), apply the safeguards
    (floor reward, diversity penalty), compute group advantages and run `mu` clipped-surrogate updates.
    The whole state (model, optimizer, schedule, RNGs, sampler, guards, step) round-trips through
    `state_dict()` / `load_state_dict()`; see trainers/checkpoint.py for atomic files on disk.
    """

    def __init__(self, model, tokenizer, tasks: Sequence[Task], reward_fn: RewardFn,
                 config: GRPOConfig | None = None, *, progress_fn: ProgressFn | None = None):
        from trainers.learner import PolicyLearner

        self.config = config = config or GRPOConfig()
        if not tasks:
            raise ValueError("GRPOTrainer needs at least one task")
        torch.set_num_threads(config.threads)
        random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.model = model.eval()  # eval mode: no dropout, so sampling and training forwards agree
        self.tokenizer, self.reward_fn, self.progress_fn = tokenizer, reward_fn, progress_fn
        self.tasks = {task.id: task for task in tasks}
        self.learner = PolicyLearner(model, config)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.buckets = DifficultyBuckets([t.id for t in tasks], [heuristic_difficulty(t) for t in tasks],
                                         n_buckets=min(config.buckets, len(tasks)), ema=config.bucket_ema,
                                         seed=config.seed)
        self.step_count = 0
        self.totals = {"masked_rewards": 0, "floored_groups": 0, "collapse_alarms": 0}

    @property
    def reference(self):
        """The frozen KL reference (None when beta = 0)."""
        return self.learner.reference

    @property
    def spikes(self):
        """The learner's spike guard."""
        return self.learner.spikes

    # -- one step, top to bottom ------------------------------------------------------------------

    def step(self) -> dict[str, float]:
        """One GRPO step; returns its metrics (see README, "Metrics")."""
        started = time.perf_counter()
        bucket, task_ids = self.buckets.sample_batch(self.config.prompts_per_step)
        tasks = [self.tasks[i] for i in task_ids]
        completions, texts = self._generate(tasks)
        generated = time.perf_counter()
        expanded = [task for task in tasks for _ in range(self.config.group_size)]
        raw_rewards, masked = score_completions(self.reward_fn, expanded, texts)
        rewards, guards = self._apply_safeguards(raw_rewards, texts, completions, expanded)
        advantages = group_advantages(torch.tensor(rewards, dtype=torch.float64), self.config.group_size,
                                      self.config.scale_rewards).float()
        scored = time.perf_counter()
        update = self._update(completions, advantages)
        self._record_pass_rates(tasks, raw_rewards)
        self.step_count += 1
        self.totals["masked_rewards"] += masked
        times = {"time/generate": generated - started, "time/score": scored - generated,
                 "time/update": time.perf_counter() - scored, "time/step": time.perf_counter() - started}
        return self._metrics(raw_rewards, completions, bucket, masked, guards, update, times)

    def _generate(self, tasks: Sequence[Task]):
        ids, mask = encode_prompts(self.tokenizer, [t.prompt for t in tasks])
        completions = sample_completions(
            self.model, ids, mask, group_size=self.config.group_size, max_new_tokens=self.config.max_new_tokens,
            temperature=self.config.temperature, top_p=self.config.top_p, eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id, generator=self.generator)
        return completions, decode_completions(self.tokenizer, completions)

    def _apply_safeguards(self, rewards, texts, completions, tasks):
        """Diversity penalty and floor reward; returns new rewards and what the guards did."""
        g, cfg = self.config.group_size, self.config
        group_bleu = group_self_bleu(texts, g)
        alarms = collapse_alarm(group_bleu, cfg.collapse_threshold)
        penalised = 0
        if cfg.diversity_penalty > 0:
            penalties = diversity_penalties(texts, g, threshold=cfg.diversity_threshold, penalty=cfg.diversity_penalty)
            penalised = sum(p > 0 for p in penalties)
            rewards = [r - p for r, p in zip(rewards, penalties)]
        floored = 0
        if cfg.floor_reward > 0:
            rewards, floored = apply_floor_reward(rewards, g, self._progress(texts, completions, tasks), cfg.floor_reward)
        self.totals["floored_groups"] += floored
        self.totals["collapse_alarms"] += alarms
        return rewards, {"guard/self_bleu": statistics.fmean(group_bleu), "guard/collapse_alarms": alarms,
                         "guard/diversity_penalised": penalised, "guard/floored_groups": floored}

    def _progress(self, texts, completions, tasks) -> list[float]:
        """Partial progress per completion: the task's own score if given, else mean token logprob."""
        if self.progress_fn is not None:
            return [float(self.progress_fn(task, text)) for task, text in zip(tasks, texts)]
        lengths = completions.completion_mask.sum(-1).clamp(min=1)
        return ((completions.logprobs * completions.completion_mask).sum(-1) / lengths).tolist()

    def _update(self, completions: Completions, advantages: torch.Tensor) -> dict[str, float]:
        return self.learner.update(completions, advantages)

    def _compact_batch(self, completions: Completions, advantages: torch.Tensor):
        return self.learner.compact_batch(completions, advantages)

    def _record_pass_rates(self, tasks: Sequence[Task], rewards: Sequence[float]) -> None:
        """Feed each task's observed pass rate (mean raw reward clipped to [0, 1]) to the bucket sampler."""
        g = self.config.group_size
        for index, task in enumerate(tasks):
            group = [r for r in rewards[index * g:(index + 1) * g] if not math.isnan(r)]
            if group:
                self.buckets.update(task.id, min(1.0, max(0.0, statistics.fmean(group))))

    def _metrics(self, rewards, completions, bucket, masked, guards, update, times) -> dict[str, float]:
        valid = [r for r in rewards if not math.isnan(r)]
        metrics = {
            "train/step": self.step_count, "train/reward": statistics.fmean(valid) if valid else float("nan"),
            "train/reward_std": statistics.stdev(valid) if len(valid) > 1 else 0.0,
            "train/frac_zero_std": zero_std_group_fraction(rewards, self.config.group_size),
            "train/loss": update["loss"], "train/grad_norm": update["grad_norm"],
            "train/clip_fraction": update["clip_fraction"], "train/trained_rows": update["trained_rows"],
            "train/entropy": masked_mean(completions.entropy, completions.completion_mask),
            "train/completion_length": completions.completion_mask.sum(-1).float().mean().item(),
            "train/truncated_fraction": completions.truncated.float().mean().item(),
            "train/lr": self.learner.lr(), "train/bucket": bucket,
            "guard/masked_rewards": masked, "guard/skipped_spikes_total": self.learner.skipped_spikes,
            **guards, **times,
        }
        if update["kl"] is not None:
            metrics["train/kl"] = update["kl"]
        for index, rate in self.buckets.pass_rates().items():
            metrics[f"bucket/{index}/pass_rate"] = rate
        return metrics

    def train(self, steps: int | None = None, callback: Callable[[dict], None] | None = None) -> list[dict]:
        """Run `steps` (default: config.steps minus steps already done) and return every step's metrics."""
        remaining = (self.config.steps - self.step_count) if steps is None else steps
        history = []
        for _ in range(max(0, remaining)):
            metrics = self.step()
            history.append(metrics)
            if callback is not None:
                callback(metrics)
        return history

    # -- state, for checkpoints and exact resume --------------------------------------------------

    def state_dict(self) -> dict:
        """Everything a resumed run needs to continue exactly like an uninterrupted one."""
        return {
            "step": self.step_count, "totals": dict(self.totals), "config": asdict(self.config),
            "learner": self.learner.state_dict(), "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
            "buckets": self.buckets.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()`; the trainer must have been built with the same config and tasks."""
        self.step_count, self.totals = state["step"], dict(state["totals"])
        self.learner.load_state_dict(state["learner"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        self.buckets.load_state_dict(state["buckets"])


def heuristic_difficulty(task: Task) -> float:
    """The task's own difficulty if it has one, else its prompt length (a crude proxy for steps)."""
    return float(task.difficulty) if task.difficulty is not None else float(len(task.prompt))


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of `values` over the positions where `mask` is 1."""
    return ((values * mask).sum() / mask.sum().clamp(min=1)).item()
