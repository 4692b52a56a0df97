"""Team metrics: what an episode achieved, and the metrics of one `MultiAgentTrainer.step()`.

    success(episode, mode)      team success: the outcome met (cooperative), or someone won (competitive)
    won(episode, agent)         an agent's win in a competitive episode
    is_masked(episode)          a reward of the episode is NaN (a scorer failed)
    nanmean(values)             the mean of the non-NaN values
    step_metrics(...)           train/*, judge/*, credit/*, policy/*, bucket/* of a step (selfplay/*: the
                                self-play plug-in's, trainers.team.selfplay)
    TurnGuards                  length/* and tools/* of a step, with one warning line each when they go wrong

The held-out evaluation (`trainers.team.evaluation`) and the stages read the same `success`.
"""

from __future__ import annotations

import math
import statistics

from marl.credit.replay import credit_figures
from marl.selfplay import match_score
from trainers.grpo.shared import bucket_metrics, nanmean

__all__ = ["TurnGuards", "is_masked", "masked_credit", "nanmean", "step_metrics", "success", "won"]


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


def step_metrics(trainer, result, mode: str, bucket: int, guards: dict, updates: dict,
                 times: dict) -> dict[str, float]:
    """The metrics of the step that produced `result` (a `StepResult`) in a scenario of `mode`, after the
    trainer's bookkeeping. `guards`: the `guard/*` metrics; `updates`: policy name -> its learner's update stats.
    """
    episodes = result.episodes
    metrics = {"train/step": trainer.step_count, "train/bucket": bucket,
               "train/reward": nanmean([e.team_reward() for e in episodes]),
               "train/team_success": nanmean([success(e, mode) for e in episodes]),
               "judge/masked_episodes": sum(is_masked(e) for e in episodes),
               "judge/masked_total": trainer.totals["masked_episodes"], **guards, **times}
    metrics["train/signal_groups"] = signal_share(episodes, trainer.agents, trainer.grpo.group_size)
    for agent in trainer.agents:
        metrics[f"train/agent/{agent}/reward"] = nanmean([row[agent] for row in result.rewards])
        if mode != "cooperative":
            metrics[f"train/agent/{agent}/win_rate"] = nanmean([won(e, agent) for e in episodes])
    if result.credits is not None:
        metrics.update(credit_figures(result.credits, trainer.agents))
        metrics["judge/masked_credit"] = masked_credit(episodes, result.credits)
    metrics.update(_policy_metrics(updates))
    metrics["train/lr"] = next(iter(trainer.learners.values())).lr()
    metrics.update(bucket_metrics(trainer.buckets))
    return metrics


FIXED = "fixed:"  # the actor and opponent id of a fixed opponent: FIXED + its name in the scenario's `opponents`


def match_scores(episodes, agents, opponent_actor: str) -> list[float]:
    """The learner's match score (1 win, 0.5 draw, 0 loss) in each scored episode, the seats played by
    `opponent_actor` being the other side (episodes with a masked reward are left out)."""
    scores = []
    for episode in episodes:
        if any(math.isnan(episode.rewards.get(a, math.nan)) for a in agents):
            continue
        learner = [a for a in agents if episode.job.seats.get(a) != opponent_actor]
        scores.append(match_score(episode.rewards, learner, [a for a in agents if a not in learner]))
    return scores


def fixed_opponent_score(episodes, agents, opponent: str) -> float:
    """The learner's mean match score against the fixed opponent seated as `opponent` this step (NaN
    when no episode was scored)."""
    scores = match_scores(episodes, agents, opponent)
    return statistics.fmean(scores) if scores else math.nan


def signal_share(episodes, agents, group_size: int) -> float:
    """The share of (agent, group) pairs whose G episodes' scored rewards are not all equal: where GRPO has
    a signal to learn from before any credit split, floor reward or guard (NaN when nothing is scored).
    Episodes come in groups of `group_size` consecutive ones (the plays of one task)."""
    pairs = varied = 0
    for start in range(0, len(episodes), group_size):
        for agent in agents:
            values = [e.rewards.get(agent, math.nan) for e in episodes[start:start + group_size]]
            values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
            if len(values) >= 2:
                pairs += 1
                varied += max(values) - min(values) > 1e-9
    return varied / pairs if pairs else math.nan


def _policy_metrics(updates: dict) -> dict[str, float]:
    """policy/{name}/* of every learner's update; train/kl and engine/* (the sampler/trainer mismatch) for a
    lone policy, engine/*/{name} for several; train/loss as their mean."""
    metrics = {}
    for name, update in updates.items():
        for key in ("loss", "grad_norm", "clip_fraction", "trained_rows"):
            metrics[f"policy/{name}/{key}"] = update[key]
        if update["kl"] is not None:
            metrics["train/kl" if len(updates) == 1 else f"policy/{name}/kl"] = update["kl"]
        for key, value in (update.get("mismatch") or {}).items():  # engine/*: sampler against trainer
            metrics[key if len(updates) == 1 else f"{key}/{name}"] = value
    if updates:
        metrics["train/loss"] = statistics.fmean(u["loss"] for u in updates.values())
    return metrics


class TurnGuards:
    """What users ask to be told about their agents' turns, step by step (metrics, and one warning each).

    length/prompts_truncated        share of the step's model prompts cut to fit: by the environment
                                    (observation_max_chars) or to the token limit (max_prompt_tokens)
    length/completions_at_limit     share of its sampled completions that hit their max_tokens
    tools/{agent}/calls             tool calls the parser found in a tool-using agent's messages

    The first step on which either share is above `warn_fraction` (train.truncation_warn_fraction)
    prints one line; a tool-using agent with no parsed call for `silence_steps` steps in a row
    (train.tool_silence_steps) prints one line naming it and what to check.
    """

    def __init__(self, spec, warn_fraction: float, silence_steps: int, log=print):
        self.warn_fraction, self.silence_steps = warn_fraction, silence_steps
        self.tools = {agent.name: agent.tools for agent in spec.agents if agent.tools}
        self.log, self.warned, self.silent = log, set(), dict.fromkeys(self.tools, 0)

    def update(self, step: int, batch) -> dict[str, float]:
        """The metrics of the step `step` (1-based) that played `batch` (an EpisodeBatch); warns when due."""
        cut, at_limit, model_turns = 0, 0, 0
        for episode in batch.episodes:
            for turn in episode.turns:
                if turn.actor is None:
                    continue  # not sampled by a trained model here (scripted, replayed, absent)
                rows = batch.generations[turn.actor][turn.batch]
                model_turns += 1
                cut += bool(rows.prompt_cut is not None and rows.prompt_cut[turn.row])  # ModelActor.act fits them
                at_limit += bool(rows.truncated[turn.row])
        metrics = {}
        if model_turns:
            metrics = {"length/prompts_truncated": cut / model_turns,
                       "length/completions_at_limit": at_limit / model_turns}
            self._warn_share(step, "prompts", cut, model_turns, "were cut to fit (their middle history dropped): "
                             "raise observation_max_chars or max_prompt_tokens, or use a model with a longer context")
            self._warn_share(step, "completions", at_limit, model_turns, "hit their agent's max_tokens before "
                             "ending: raise agents[].max_tokens (a pretrained model usually needs more than the tiny "
                             "model's few tokens)")
        return {**metrics, **self._tool_metrics(step, batch.episodes)}

    def _warn_share(self, step: int, what: str, count: int, total: int, advice: str) -> None:
        if count / total > self.warn_fraction and what not in self.warned:
            self.warned.add(what)
            self.log(f"warning: step {step}: {count} of {total} {what} {advice} (more than "
                     f"train.truncation_warn_fraction={self.warn_fraction:g}; warned once)")

    def _tool_metrics(self, step: int, episodes) -> dict[str, float]:
        """tools/{agent}/calls per tool-using agent; one warning when an agent stays silent too long."""
        metrics = {}
        for agent, tools in self.tools.items():
            calls = sum(record.agent == agent for episode in episodes for record in episode.tool_log)
            metrics[f"tools/{agent}/calls"] = float(calls)
            self.silent[agent] = 0 if calls else self.silent[agent] + 1
            if self.silent[agent] >= self.silence_steps and ("tools", agent) not in self.warned:
                self.warned.add(("tools", agent))
                self.log(f"warning: step {step}: agent {agent!r} has tools ({', '.join(tools)}) but wrote no tool "
                         f"call the parser recognises in {self.silent[agent]} steps in a row; check that its "
                         "observation shows the tools and the call format ({tools} in agents[].observation, e.g. "
                         f"{tools[0]}(arg=\"value\")), that max_tokens and action_max_chars leave room for a call, "
                         "and what it writes (marl rollout); train.tool_silence_steps sets the wait")
        return metrics
