"""The GRPO core's bookkeeping around a step's sample -> score -> update (trainers/team/trainer.py):


    seed_everything(config)             threads, then Python and torch seeded (in that order)
    difficulty_buckets(tasks, config)   the curriculum sampler, one bucket draw per step
    repetition_guards(texts, rewards)   Self-BLEU per group, collapse alarm, diversity penalty
    GuardTally                          what the guards did this step -> `guard/*` metrics, run totals
    record_pass_rates(...)              each task's observed pass rate back to the sampler
    bucket_metrics, nanmean             shared metric pieces
    core_state / load_core_state        step, totals, config, global RNGs and sampler for exact resume

None of them draws a random number the trainer did not draw before, in the order it drew it: a run
gives the same samples, metrics and checkpoints as before these pieces were written here.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from marl.types import Task
from trainers.grpo.safeguards import DifficultyBuckets, collapse_alarm, diversity_penalties, group_self_bleu


def seed_everything(config) -> None:
    """torch threads from `config.threads`; Python's and torch's global RNGs seeded with `config.seed`."""
    torch.set_num_threads(config.threads)
    random.seed(config.seed)
    torch.manual_seed(config.seed)


def heuristic_difficulty(task: Task) -> float:
    """The task's own difficulty if it has one, else its prompt length (a crude proxy for steps)."""
    return float(task.difficulty) if task.difficulty is not None else float(len(task.prompt))


def difficulty_buckets(tasks: Sequence[Task], config) -> DifficultyBuckets:
    """The curriculum sampler over `tasks`: at most `config.buckets` buckets by heuristic difficulty."""
    return DifficultyBuckets([t.id for t in tasks], [heuristic_difficulty(t) for t in tasks],
                             n_buckets=min(config.buckets, len(tasks)), ema=config.bucket_ema, seed=config.seed)


@dataclass
class GuardTally:
    """What the safeguards did in one step (summed over agents in a team step)."""

    self_bleu: list[float] = field(default_factory=list)  # one Self-BLEU per group (per agent)
    collapse_alarms: int = 0
    diversity_penalised: int = 0
    floored_groups: int = 0

    def add_to(self, totals: dict) -> None:
        """Add this step's floored groups and collapse alarms to the run's totals."""
        totals["floored_groups"] += self.floored_groups
        totals["collapse_alarms"] += self.collapse_alarms

    def metrics(self) -> dict[str, float]:
        """The `guard/*` metrics of the step."""
        return {"guard/self_bleu": statistics.fmean(self.self_bleu), "guard/collapse_alarms": self.collapse_alarms,
                "guard/diversity_penalised": self.diversity_penalised, "guard/floored_groups": self.floored_groups}


def repetition_guards(texts: Sequence[str], rewards: list[float], config, tally: GuardTally) -> list[float]:
    """Self-BLEU of each group of G texts, the collapse alarm, and the diversity penalty when it is on.

    Returns the (penalised) rewards and records what happened in `tally`. Groups are contiguous,
    `config.group_size` texts each, as the rewards are.
    """
    group_bleu = group_self_bleu(texts, config.group_size)
    tally.self_bleu += group_bleu
    tally.collapse_alarms += collapse_alarm(group_bleu, config.collapse_threshold)
    if config.diversity_penalty > 0:
        penalties = diversity_penalties(texts, config.group_size, threshold=config.diversity_threshold,
                                        penalty=config.diversity_penalty)
        tally.diversity_penalised += sum(p > 0 for p in penalties)
        rewards = [r - p for r, p in zip(rewards, penalties)]
    return rewards


def record_pass_rates(buckets: DifficultyBuckets, tasks: Sequence[Task], scores: Sequence[float], group_size: int,
                      known=None) -> None:
    """Feed each task's pass rate to the sampler: the mean of its group's non-NaN scores, clipped to [0, 1].

    `scores` hold G per task, in task order. With `known` (task ids), tasks outside it are skipped: a
    stage's own tasks (reflection retries, adversarial variants) are not in the sampler.
    """
    for index, task in enumerate(tasks):
        group = [s for s in scores[index * group_size:(index + 1) * group_size] if not math.isnan(s)]
        if group and (known is None or task.id in known):
            buckets.update(task.id, min(1.0, max(0.0, statistics.fmean(group))))


def nanmean(values) -> float:
    """Mean of the non-NaN values (NaN when there are none)."""
    kept = [v for v in values if not math.isnan(v)]
    return statistics.fmean(kept) if kept else math.nan


def bucket_metrics(buckets: DifficultyBuckets) -> dict[str, float]:
    """`bucket/{index}/pass_rate` of every difficulty bucket."""
    return {f"bucket/{index}/pass_rate": rate for index, rate in buckets.pass_rates().items()}


def core_state(trainer) -> dict:
    """The state every trainer saves: step, totals, GRPO config, global RNGs and the bucket sampler."""
    return {"step": trainer.step_count, "totals": dict(trainer.totals), "config": trainer.grpo.model_dump(),
            "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
            "buckets": trainer.buckets.state_dict()}


def load_core_state(state: dict, buckets: DifficultyBuckets) -> tuple[int, dict]:
    """Restore what `core_state` saved of the global RNGs and the bucket sampler; (step, totals) for the
    trainer to take back (the trainer's own fields are its to set)."""
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    buckets.load_state_dict(state["buckets"])
    return state["step"], dict(state["totals"])
