"""The GRPO trainer, top to bottom: one step = sample -> score -> safeguards -> advantages -> update.

`GRPOTrainer.step()`: sample groups -> score (failures masked) -> safeguards -> advantages (the
objective in `trainers.grpo.objective`) -> `mu` updates of the compacted batch -> metrics. The update
itself (optimizer, lr schedule, spike guard, KL reference, exact batch compaction) is
`trainers.grpo.learner.PolicyLearner`, which the team trainer uses for each of its policies too.
The knobs are `trainers.grpo.config.GRPOConfig`.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict

import torch

from marl.types import Task
from trainers.grpo.safeguards import (DifficultyBuckets, apply_floor_reward, collapse_alarm, diversity_penalties,
                                 group_self_bleu)
from trainers.policy.sampling import Completions, decode_completions, encode_prompts, sample_completions
from trainers.grpo.config import GRPOConfig
from trainers.grpo.objective import group_advantages, masked_mean, zero_std_group_fraction


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
    `state_dict()` / `load_state_dict()`; see trainers/runs/checkpoint.py for atomic files on disk.
    """

    def __init__(self, model, tokenizer, tasks: Sequence[Task], reward_fn: RewardFn,
                 config: GRPOConfig | None = None, *, progress_fn: ProgressFn | None = None):
        from trainers.grpo.learner import PolicyLearner

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
