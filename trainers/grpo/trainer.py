"""The GRPO trainer, top to bottom: one step = sample -> score -> safeguards -> advantages -> update.

`GRPOTrainer.step()`: sample groups -> score (failures masked) -> safeguards -> advantages (the
objective in `trainers.grpo.objective`) -> `mu` updates of the compacted batch -> metrics. The update
itself (optimizer, lr schedule, spike guard, KL reference, exact batch compaction) is
`trainers.grpo.learner.PolicyLearner`, which the team trainer uses for each of its policies too.
The knobs are `trainers.grpo.config.GRPOConfig`; seeding, the difficulty buckets, the repetition
guards, the shared metrics and the saved RNG state are `trainers.grpo.shared`, as in the team trainer.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from marl.types import Task
from trainers.grpo.config import GRPOConfig
from trainers.grpo.objective import group_advantages, masked_mean, zero_std_group_fraction
from trainers.grpo.safeguards import apply_floor_reward
from trainers.policy.prompts import stop_token_ids
from trainers.grpo.shared import (GuardTally, bucket_metrics, core_state, difficulty_buckets,
                                  heuristic_difficulty, load_core_state, nanmean, record_pass_rates,
                                  repetition_guards, seed_everything)
from trainers.policy.loading import model_device
from trainers.policy.generation import Completions, decode_completions, encode_prompts, sample_completions

__all__ = ["GRPOTrainer", "heuristic_difficulty", "score_completions"]


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
    `state_dict()` / `load_state_dict()`; see trainers/records/checkpoint.py for atomic files on disk.
    """

    def __init__(self, model, tokenizer, tasks: Sequence[Task], reward_fn: RewardFn,
                 config: GRPOConfig | None = None, *, progress_fn: ProgressFn | None = None):
        from trainers.grpo.learner import PolicyLearner

        self.config = config = config or GRPOConfig()
        if not tasks:
            raise ValueError("GRPOTrainer needs at least one task")
        seed_everything(config)
        self.model = model.eval()  # eval mode: no dropout, so sampling and training forwards agree
        self.tokenizer, self.reward_fn, self.progress_fn = tokenizer, reward_fn, progress_fn
        self.stop_ids = stop_token_ids(model, tokenizer)  # every listed eos and the end of turn, not only eos
        self.tasks = {task.id: task for task in tasks}
        self.learner = PolicyLearner(model, config)
        self.generator = torch.Generator(device=model_device(model)).manual_seed(config.seed)  # sampling draws here
        self.buckets = difficulty_buckets(tasks, config)
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

    @property
    def grpo(self) -> GRPOConfig:
        """The GRPO knobs (`config`), by the name the team trainer gives them too."""
        return self.config

    def step(self) -> dict[str, float]:
        """One GRPO step; returns its metrics (see docs/reference.md, "Metrics")."""
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
        record_pass_rates(self.buckets, tasks, raw_rewards, self.config.group_size)
        self.step_count += 1
        self.learner.end_step(self.step_count)
        self.totals["masked_rewards"] += masked
        times = {"time/generate": generated - started, "time/score": scored - generated,
                 "time/update": time.perf_counter() - scored, "time/step": time.perf_counter() - started}
        return self._metrics(raw_rewards, completions, bucket, masked, guards, update, times)

    def _generate(self, tasks: Sequence[Task]):
        ids, mask = encode_prompts(self.tokenizer, [t.prompt for t in tasks])
        completions = sample_completions(
            self.model, ids, mask, group_size=self.config.group_size, max_new_tokens=self.config.max_new_tokens,
            temperature=self.config.temperature, top_p=self.config.top_p, eos_token_id=self.stop_ids,
            pad_token_id=self.tokenizer.pad_token_id, generator=self.generator)
        return completions, decode_completions(self.tokenizer, completions)

    def _apply_safeguards(self, rewards, texts, completions, tasks):
        """Self-BLEU, diversity penalty and floor reward; returns new rewards and the `guard/*` metrics."""
        cfg, tally = self.config, GuardTally()
        rewards = repetition_guards(texts, rewards, cfg, tally)
        if cfg.floor_reward > 0:
            rewards, tally.floored_groups = apply_floor_reward(rewards, cfg.group_size,
                                                               self._progress(texts, completions, tasks),
                                                               cfg.floor_reward)
        tally.add_to(self.totals)
        return rewards, tally.metrics()

    def _progress(self, texts, completions, tasks) -> list[float]:
        """Partial progress per completion: the task's own score if given, else mean token logprob."""
        if self.progress_fn is not None:
            return [float(self.progress_fn(task, text)) for task, text in zip(tasks, texts)]
        return masked_mean(completions.logprobs, completions.completion_mask, dim=-1).tolist()

    def _update(self, completions: Completions, advantages: torch.Tensor) -> dict[str, float]:
        return self.learner.update(completions, advantages)

    def _compact_batch(self, completions: Completions, advantages: torch.Tensor):
        return self.learner.compact_batch(completions, advantages)

    def _metrics(self, rewards, completions, bucket, masked, guards, update, times) -> dict[str, float]:
        valid = [r for r in rewards if not math.isnan(r)]
        metrics = {
            "train/step": self.step_count, "train/reward": nanmean(rewards),
            "train/reward_std": statistics.stdev(valid) if len(valid) > 1 else 0.0,
            "train/frac_zero_std": zero_std_group_fraction(rewards, self.config.group_size),
            "train/loss": update["loss"], "train/grad_norm": update["grad_norm"],
            "train/clip_fraction": update["clip_fraction"], "train/trained_rows": update["trained_rows"],
            "train/entropy": masked_mean(completions.entropy, completions.completion_mask).item(),
            "train/completion_length": completions.completion_mask.sum(-1).float().mean().item(),
            "train/truncated_fraction": completions.truncated.float().mean().item(),
            "train/lr": self.learner.lr(), "train/bucket": bucket,
            "guard/masked_rewards": masked, "guard/skipped_spikes_total": self.learner.skipped_spikes,
            **guards, **times,
        }
        if update["kl"] is not None:
            metrics["train/kl"] = update["kl"]
        metrics.update(bucket_metrics(self.buckets))
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
        return {**core_state(self), "learner": self.learner.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()`; the trainer must have been built with the same config and tasks."""
        self.step_count, self.totals = load_core_state(state, self.buckets)
        self.learner.load_state_dict(state["learner"])
        self.generator.set_state(state["generator"])
