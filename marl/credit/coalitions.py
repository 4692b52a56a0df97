"""Coalition values of a scenario: what the team earns when only some agents take part.

`ScenarioCoalitionValue(env, policy, task, absent=..., rollouts=R)` is a function v(S) -> float for
the credit estimators in `marl.credit.estimators`: the team reward averaged over R seeded episodes of `task`
in which the agents outside S are absent. Seeds are shared by every coalition (common random
numbers), and each (coalition, seed) episode is played once and cached. The episodes are played by
the one engine, `marl.rollout.EpisodePlayer`, with `policy` speaking for every agent; what "absent"
means is one of `marl.rollout.ABSENT_MODES` (the scenario's `credit.absent`, documented there).
`replay` uses the engine's history rule (the full-team transcript kept up to the first change) and
`mask` re-runs nothing (`masked_team_reward`).
"""

from __future__ import annotations

import inspect
import statistics
from itertools import combinations

from marl.rollout import ABSENT_MODES, Episode, EpisodeJob, PolicyActor, check_absent_mode, policy_player, team_reward
from marl.types import Task

ABSENT_POLICIES = ABSENT_MODES  # the name this module used before the engine owned the list
BATCHED = ("null_message", "skip_turn", "default_policy")  # played in lockstep; the others one at a time
RESAMPLE_SEED = 1_000_003  # resample: an absent agent's policy is called with seed + this


class ScenarioCoalitionValue:
    """v(S): the cooperative team reward of `task` with only the agents in S present (see module doc)."""

    def __init__(self, env, policy, task: Task, *, absent: str = "null_message", rollouts: int = 1, seed: int = 0,
                 default_policy=None):
        check_absent_mode(absent)
        if env.scenario.spec.mode != "cooperative":
            raise ValueError(f"credit splits a team reward; scenario {env.scenario.spec.name!r} is "
                             f"{env.scenario.spec.mode} (zero-sum rewards are already per agent)")
        if absent == "default_policy" and default_policy is None:
            raise ValueError("absent='default_policy' needs a default policy (credit.default_policy: module:function)")
        if absent == "resample" and "seed" not in inspect.signature(policy).parameters:
            raise ValueError("absent='resample' needs a policy that accepts seed=...; a deterministic scripted "
                             "policy would only repeat itself (use null_message or default_policy)")
        self.env, self.policy, self.task, self.absent = env, policy, task, absent
        self.default_policy = default_policy
        self.players = tuple(env.possible_agents)
        self.seeds = [seed + r for r in range(rollouts)]
        self.returns: dict[tuple[frozenset, int], float] = {}
        self.full_team: dict[int, Episode] = {}  # seed -> the full-team episode (replay and mask start from it)
        # `env` is the engine's first environment; lockstep batches add more that share its scorer
        self.player = policy_player(env, policy, default_policy=default_policy)

    def __call__(self, coalition: frozenset) -> float:
        """Mean team reward over the shared seeds (NaN if a judge failed on some episode)."""
        return statistics.fmean(self.episode_return(frozenset(coalition), seed) for seed in self.seeds)

    def evaluate_many(self, coalitions) -> int:
        """Play every missing (coalition, seed) episode; return how many were played.

        For null_message, skip_turn and default_policy they are played in lockstep: at each turn the
        present agents of all those episodes are answered together, by ONE call of
        `policy.batch([(agent, observation, task), ...])` when the policy has a `batch` method (an LLM
        policy generating for many prompts at once), else one call each. The replay-based modes
        (resample, replay, mask) play one episode at a time.
        """
        pending = [(frozenset(c), seed) for c in coalitions for seed in self.seeds
                   if (frozenset(c), seed) not in self.returns]
        pending = list(dict.fromkeys(pending))
        if self.absent not in BATCHED:
            for coalition, seed in pending:
                self.episode_return(coalition, seed)
            return len(pending)
        if pending:
            jobs = [EpisodeJob(self.task, seed, coalition=coalition, absent_mode=self.absent)
                    for coalition, seed in pending]
            self._record(self.player.play(jobs).episodes)
        return len(pending)

    def episode_return(self, coalition: frozenset, seed: int) -> float:
        """The team reward of one seeded episode with `coalition` present (cached)."""
        key = (coalition, seed)
        if key not in self.returns:
            self.returns[key] = self._play(coalition, seed)
        return self.returns[key]

    # -- episodes ---------------------------------------------------------------------------------

    def _record(self, episodes) -> None:
        """Cache the team reward of played episodes, and the full-team episodes themselves."""
        for episode in episodes:
            coalition, seed = episode.job.coalition, episode.job.seed
            self.returns[coalition, seed] = episode.team_reward()
            if coalition == frozenset(self.players):
                self.full_team[seed] = episode

    def _play(self, coalition: frozenset, seed: int) -> float:
        """One episode alone, its policy called agent by agent in the environment's order."""
        everyone = frozenset(self.players)
        if self.absent == "mask" and coalition != everyone:
            return self._masked(coalition, seed)
        history = self._reference(seed) if self.absent == "replay" and coalition != everyone else None
        policy = self.policy
        if self.absent == "resample":
            policy = _Resampling(self.policy, coalition, seed + RESAMPLE_SEED)
        self.player.actors["policy"] = PolicyActor(policy, order=self.players)
        try:
            [episode] = self.player.play([EpisodeJob(self.task, seed, coalition=coalition,
                                                     absent_mode=self.absent, history=history)]).episodes
        finally:
            self.player.actors["policy"] = PolicyActor(self.policy)  # lockstep batches: policy.batch if any
        self._record([episode])
        return episode.team_reward()

    def _reference(self, seed: int) -> list[dict]:
        """The full-team transcript of `seed` (played first if needed), as (agent, text, turn) entries."""
        full = frozenset(self.players)
        if seed not in self.full_team:
            self.returns[full, seed] = self._play(full, seed)
        return [{k: t[k] for k in ("agent", "text", "turn")} for t in self.full_team[seed].transcript]

    def _masked(self, coalition: frozenset, seed: int) -> float:
        self._reference(seed)
        episode = self.full_team[seed]
        return masked_team_reward(self.env.scorer, self.task, episode.transcript, episode.tool_log, coalition,
                                  self.players)


class _Resampling:
    """The policy of a resample episode: present agents as usual, absent ones with another seed."""

    def __init__(self, policy, coalition: frozenset, seed: int):
        self.policy, self.coalition, self.seed = policy, coalition, seed

    def __call__(self, agent: str, observation: str, task: Task) -> str:
        if agent in self.coalition:
            return self.policy(agent, observation, task)
        return self.policy(agent, observation, task, seed=self.seed)


def masked_team_reward(scorer, task: Task, transcript: list[dict], tool_log, coalition: frozenset,
                       players) -> float:
    """The `mask` counterfactual: the transcript with absent agents' messages (and their tool calls)
    blanked, scored again; no episode is re-run."""
    blanked = [{**t, "text": t["text"] if t["agent"] in coalition else ""} for t in transcript]
    calls = [call for call in tool_log if call.agent in coalition]
    rewards, _ = scorer.score_episode(task, blanked, calls, list(players))
    return team_reward(rewards)


def coalitions_needed(spec, players: tuple, graph) -> list[frozenset]:
    """The coalitions an exact method will ask for, so they can be played in one batch up front
    (empty for sampled estimators, which decide their coalitions as they go)."""
    import networkx as nx

    everyone = frozenset(players)
    if spec.method == "team":
        return [everyone]
    if spec.method == "difference":
        return [everyone] + [everyone - {p} for p in players]
    exact = spec.estimator == "exact" or (spec.estimator == "auto" and (spec.budget is None or
                                                                       spec.budget >= 2 ** len(players) - 1))
    if not exact or len(players) > 12:
        return []  # sampled estimators decide their coalitions as they go
    subsets = [frozenset(c) for size in range(len(players) + 1) for c in combinations(players, size)]
    if spec.method == "myerson":
        undirected = nx.Graph(graph)
        return [s for s in subsets if len(s) <= 1 or nx.is_connected(undirected.subgraph(s))]
    return subsets


def episode_credit(env, policy, task: Task, credit=None, *, seed: int = 0):
    """Per-agent credit for one task under the scenario's `credit` section (or the given CreditSpec).

    Returns (CreditEstimate, the coalition value used). `team` copies the team reward to every agent;
    the other methods split it from coalition values (Myerson over the scenario's visibility graph,
    Owen over `credit.unions`).
    """
    spec = credit if credit is not None else env.scenario.spec.credit
    default = env.scenario.resolve(spec.default_policy) if spec.default_policy else None
    value = ScenarioCoalitionValue(env, policy, task, absent=spec.absent, rollouts=spec.rollouts,
                                   seed=seed + spec.seed, default_policy=default)
    value.evaluate_many(coalitions_needed(spec, value.players, env.visibility))
    return estimate_credit(spec, value, value.players, env.visibility), value


def estimate_credit(spec, value, players: tuple, graph):
    """Split v(everyone) among `players` with the method and estimator of a CreditSpec.

    `value(coalition) -> float` is any coalition value; `graph` is the visibility graph (Myerson).
    `team` copies v(everyone) to every player.
    """
    from marl.credit import estimators
    from marl.credit.exact import CreditEstimate

    options, method = dict(budget=spec.budget, seed=spec.seed), spec.estimator
    if spec.method == "team":
        team = value(frozenset(players))
        return CreditEstimate({p: team for p in players}, {p: 0.0 for p in players}, 1, "team")
    if spec.method == "shapley":
        return estimators.shapley(value, players, method=method, **options)
    if spec.method == "banzhaf":
        return estimators.banzhaf(value, players, method="exact" if method == "auto" else method, **options)
    if spec.method == "owen":
        if not spec.unions:
            raise ValueError("credit.method 'owen' needs credit.unions (union name -> agents)")
        return estimators.owen(value, players, list(spec.unions.values()), **options)
    if spec.method == "myerson":
        return estimators.myerson(value, graph, **options)
    if spec.method == "difference":
        return estimators.difference_rewards(value, players)
    return estimators.least_core(value, players)
