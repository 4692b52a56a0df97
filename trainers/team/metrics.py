"""Team metrics: what an episode achieved, and the metrics of one `MultiAgentTrainer.step()`.

    success(episode, mode)      team success: the outcome met (cooperative), or someone won (competitive)
    won(episode, agent)         an agent's win in a competitive episode
    is_masked(episode)          a reward of the episode is NaN (a scorer failed)
    nanmean(values)             the mean of the non-NaN values
    step_metrics(...)           train/*, judge/*, credit/*, policy/*, bucket/*, selfplay/* of a step

The held-out evaluation (`trainers.team.evaluation`) and the stages read the same `success`.
"""

from __future__ import annotations

import math
import statistics

from marl.credit.replay import credit_shares
from trainers.grpo.shared import bucket_metrics, nanmean

__all__ = ["is_masked", "masked_credit", "nanmean", "step_metrics", "success", "won"]


def success(episode, mode: str) -> float:
    """Team success of an episode: the outcome layer is fully met (cooperative) or the episode was
    decided (competitive: someone won); NaN when masked."""
    if mode == "cooperative":
        breakdown = episode.breakdown.get("team")
        if breakdown is None or math.isnan(breakdown.total):
            return math.nan
        outcome = breakdown.layers.get("outcome")
        return float(outcome is not None and outcome >= 1.0)
    values = list(episode.rewards.values())
    if any(math.isnan(v) for v in values):
        return math.nan
    return float(max(values) > min(values) + 1e-9)


def won(episode, agent: str) -> float:
    """1 when the agent's zero-sum reward beats every other agent's, 0 otherwise, NaN when masked."""
    rewards = episode.rewards
    if any(math.isnan(v) for v in rewards.values()):
        return math.nan
    return float(all(rewards[agent] > value + 1e-9 for other, value in rewards.items() if other != agent))


def is_masked(episode) -> bool:
    """True when any of the episode's rewards is NaN (a scorer failed): it carries no training signal."""
    return any(math.isnan(v) for v in episode.rewards.values())


def masked_credit(episodes, credits) -> int:
    """Episodes whose team reward was scored but whose credit could not be split (None)."""
    return sum(c is None and not is_masked(e) for e, c in zip(episodes, credits))


def step_metrics(trainer, result, bucket: int, guards: dict, updates: dict, times: dict, opponent) -> dict[str, float]:
    """The metrics of the step that produced `result` (a `StepResult`), after the trainer's bookkeeping.

    `guards`: the `guard/*` metrics; `updates`: policy name -> its learner's update stats; `opponent`:
    the snapshot played against (None: self-play or cooperative).
    """
    episodes, mode = result.episodes, trainer.spec.mode
    metrics = {"train/step": trainer.step_count, "train/bucket": bucket,
               "train/reward": nanmean([e.team_reward() for e in episodes]),
               "train/team_success": nanmean([success(e, mode) for e in episodes]),
               "judge/masked_episodes": sum(is_masked(e) for e in episodes),
               "judge/masked_total": trainer.totals["masked_episodes"], **guards, **times}
    for agent in trainer.agents:
        metrics[f"train/agent/{agent}/reward"] = nanmean([row[agent] for row in result.rewards])
        if mode != "cooperative":
            metrics[f"train/agent/{agent}/win_rate"] = nanmean([won(e, agent) for e in episodes])
    if result.credits is not None:
        metrics.update(credit_shares(result.credits, trainer.agents))
        metrics["judge/masked_credit"] = masked_credit(episodes, result.credits)
    metrics.update(_policy_metrics(updates))
    metrics["train/lr"] = next(iter(trainer.learners.values())).lr()
    metrics.update(bucket_metrics(trainer.buckets))
    if trainer.pool is not None:
        metrics.update(trainer.pool.ratings_metrics())
        metrics["selfplay/against_snapshot"] = float(opponent is not None)
    return metrics


def _policy_metrics(updates: dict) -> dict[str, float]:
    """policy/{name}/* of every learner's update; train/kl for a lone policy, train/loss as their mean."""
    metrics = {}
    for name, update in updates.items():
        for key in ("loss", "grad_norm", "clip_fraction", "trained_rows"):
            metrics[f"policy/{name}/{key}"] = update[key]
        if update["kl"] is not None:
            metrics["train/kl" if len(updates) == 1 else f"policy/{name}/kl"] = update["kl"]
    if updates:
        metrics["train/loss"] = statistics.fmean(u["loss"] for u in updates.values())
    return metrics
