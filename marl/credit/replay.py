"""Per-episode credit from counterfactual replays, and the judge shrinkage of blended rewards.

`episode_credits(player, episodes, credit)` gives every episode of a training step its own
CreditEstimate: the coalition values v(S) are the team rewards of replays of that very episode in
which the agents outside S are absent (`credit.absent`), all replays of a step played in one
lockstep batch (`marl.rollout`). Present agents keep their recorded messages while what they
see is unchanged, and the replays of one episode share their fresh samples (common random numbers),
so an agent whose message changes nothing downstream gets exactly zero marginal value. `mask`
rescores the blanked transcript without playing. A replay whose judge failed masks the episode's
credit (counted by the trainer), never a 0.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from marl.blend import shrink_to_group_mean
from marl.credit.coalitions import coalitions_needed, estimate_credit, masked_team_reward
from marl.credit.exact import NonFiniteValue
from marl.rollout import Episode, EpisodeJob, EpisodePlayer


def shrink_factors(episodes, group_size: int, spec) -> list[float | None]:
    """With rewards.blend.shrink (cooperative): lambda per episode the judge decided, else None.

    Within each task group, lambda = 1 / (1 + var / var_group) from the judge's uncertainty and the
    spread of the group's judge scores (marl.blend.shrink_to_group_mean). Rule-decided and masked
    episodes get None. Recorded in the episode's breakdown as blend["shrink"].
    """
    blend = spec.rewards.blend
    if blend is None or not blend.shrink or spec.mode != "cooperative":
        return [None] * len(episodes)
    factors = []
    for start in range(0, len(episodes), group_size):
        group = episodes[start:start + group_size]
        details = [e.breakdown["team"].blend if "team" in e.breakdown else None for e in group]
        judged = [d["judge"] if d and d["source"] == "judge" else None for d in details]
        variances = [d["judge_variance"] if d and d["source"] == "judge" else 0.0 for d in details]
        for detail, raw, (_, factor) in zip(details, judged, shrink_to_group_mean(judged, variances)):
            factors.append(None if raw is None else factor)
            if raw is not None and factor is not None:
                detail["shrink"] = factor
    return factors


def shrink_rewards(rows: list[dict], factors: list[float | None], group_size: int, agents) -> int:
    """Move each agent's judge-decided rewards toward their group's mean: r -> m + lambda (r - m).

    Applied to the per-agent rewards after credit assignment, so the counterfactual values the
    credit came from stay on one scale; for the team reward it is the team reward shrunk. Returns
    how many episodes were shrunk.
    """
    shrunk = 0
    for start in range(0, len(rows), group_size):
        members = [i for i in range(start, min(start + group_size, len(rows))) if factors[i] is not None]
        if len(members) < 2:
            continue
        for agent in agents:
            values = [rows[i][agent] for i in members if not math.isnan(rows[i][agent])]
            if len(values) < 2:
                continue
            mean = statistics.fmean(values)
            for i in members:
                rows[i][agent] = mean + factors[i] * (rows[i][agent] - mean)
        shrunk += len(members)
    return shrunk


@dataclass
class EpisodeReplays:
    """The counterfactual replays of one played episode: the coalition values found so far, and the
    memos its replays share (one per rollout: rollout r of every coalition shares its fresh samples)."""

    episode: Episode
    values: dict[frozenset, float]
    memos: list[dict]

    def masked(self) -> bool:
        """A judge failed in the episode or one of its replays (its credit is masked, never a 0)."""
        return any(math.isnan(v) for v in self.values.values())


def episode_credits(player: EpisodePlayer, episodes, credit) -> list:
    """One CreditEstimate per episode (None when its team reward is masked), from batched replays."""
    players = tuple(player.scenario.agent_names)
    everyone = frozenset(players)
    needed = [c for c in coalitions_needed(credit, players, player.visibility) if c != everyone]
    replays = [EpisodeReplays(e, {everyone: e.team_reward()}, memos) for e, memos in
               zip(episodes, shared_memos(episodes, credit.rollouts, credit.samples_shared_by))]
    fill_values(player, replays, needed, credit)
    estimates = []
    for replay in replays:
        if replay.masked():
            estimates.append(None)
            continue

        def value(coalition, replay=replay):  # sampled estimators ask for coalitions as they go
            coalition = frozenset(coalition)
            if coalition not in replay.values:
                fill_values(player, [replay], [coalition], credit)
            return replay.values[coalition]

        try:
            estimates.append(estimate_credit(credit, value, players, player.visibility))
        except NonFiniteValue:
            estimates.append(None)  # a sampled estimator met a failed replay: masked like a failed judge
    return estimates


def shared_memos(episodes, rollouts: int, shared_by: str) -> list[list[dict]]:
    """The memos of each episode's replays, one per rollout (see `marl.rollout`: replays sharing a memo
    share their fresh samples).

    `task`: the episodes of one task (and prefix and seating) share them. The G episodes of a task are
    compared with each other by the group-normalised advantages, so a stand-in's counterfactual that is
    the same for all of them (the same agent seeing the same thing) gets one sample, not G different
    ones: the group's credits then differ only by what each episode's own agents did (common random
    numbers across the group), and a step samples each distinct counterfactual view once. `group`: as
    `task`, and the memos start with the messages the group's own episodes already sampled (`seed_memos`),
    so a replay asks the model only for views no episode of the group has seen. `episode`: each
    episode's replays share only their own.
    """
    if shared_by == "episode":
        return [[{} for _ in range(rollouts)] for _ in episodes]
    by_task: dict[tuple, list[dict]] = {}
    memos = [by_task.setdefault(_task_key(e), [{} for _ in range(rollouts)]) for e in episodes]
    if shared_by == "group":
        for episode, episode_memos in zip(episodes, memos):
            seed_memos(episode_memos, episode)
    return memos


def seed_memos(memos: list[dict], episode) -> None:
    """Put a played episode's messages into its task's replay memos, as draws a replay can reuse.

    A message the policy sampled for an agent seeing X at turn t is a draw from that agent's policy
    given X, exactly what a replay whose present agent sees X at turn t would sample: the replay
    repeats it (the memo key of a present agent) instead of generating. Rollout r takes the r-th
    episode of the group that saw X, so the rollouts of one coalition stay independent draws; a view
    seen by fewer episodes than there are rollouts is sampled afresh in the later rollouts. Absent
    agents' keys are never seeded: under `resample` an episode's own message would be its own
    counterfactual."""
    for turn in episode.turns:
        key = (turn.turn, turn.agent, turn.observation, True)
        for memo in memos:
            if key not in memo:
                memo[key] = turn.text
                break


def _task_key(episode) -> tuple:
    task = episode.task if episode.task is not None else episode.job.task
    # seats too: episodes of one task played by different actors (a self-play pool) must not share samples
    return getattr(task, "id", task), episode.job.prefix, tuple(sorted(episode.job.seats.items()))


def fill_values(player, replays: list[EpisodeReplays], coalitions, credit) -> None:
    """v(S) of each episode for the given coalitions: rescored (mask) or replayed in one batch, the
    replays of an episode sharing its memos (one per rollout) with every earlier and later call."""
    if not coalitions:
        return
    if credit.absent == "mask":
        for replay in replays:
            episode = replay.episode
            for coalition in coalitions:
                replay.values[coalition] = masked_team_reward(player.scorer, episode.job.task, episode.transcript,
                                                              episode.tool_log, coalition, list(episode.rewards))
        return
    jobs, keys = [], []
    for index, replay in enumerate(replays):
        job = replay.episode.job
        for coalition in coalitions:
            for r in range(credit.rollouts):
                jobs.append(EpisodeJob(job.task, job.seed + 7919 * (r + 1) + credit.seed, seats=job.seats,
                                       coalition=coalition, absent_mode=credit.absent,
                                       reference=replay.episode.reference(), prefix=job.prefix,
                                       memo=replay.memos[r]))
                keys.append((index, coalition))
    returns: dict = {}
    for key, result in zip(keys, player.play(jobs).episodes):
        returns.setdefault(key, []).append(result.team_reward())
    for (index, coalition), values in returns.items():
        replays[index].values[coalition] = statistics.fmean(values)


def credit_figures(credits, agents) -> dict[str, float]:
    """credit/<agent>/value and credit/<agent>/share of a batch, whatever the credits' signs.

    value: the agent's mean credit per episode whose credit was not masked. share: its summed credit
    over the sum of every agent's |summed credit|, so the shares' magnitudes add up to 1 and a negative
    share says the agent did worse than the stand-in it is measured against; all 0 when every credit is
    0. Empty when every episode's credit was masked (nothing to say, never a 0)."""
    kept = [c for c in credits if c is not None]
    if not kept:
        return {}
    sums = {a: sum(c.values[a] for c in kept) for a in agents}
    scale = sum(abs(value) for value in sums.values())
    metrics = {f"credit/{a}/value": sums[a] / len(kept) for a in agents}
    metrics.update({f"credit/{a}/share": sums[a] / scale if scale > 0 else 0.0 for a in agents})
    return metrics
