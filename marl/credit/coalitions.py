"""Coalition values of a scenario: what the team earns when only some agents take part.

`ScenarioCoalitionValue(env, policy, task, absent=..., rollouts=R)` is a function v(S) -> float for
the credit estimators in `marl.credit.estimators`: the team reward averaged over R seeded episodes of `task`
in which the agents outside S are absent. Seeds are shared by every coalition (common random
numbers), and each (coalition, seed) episode is played once and cached.

What "absent" means is a choice (the scenario's `credit.absent`):

    null_message    the absent agent's turns produce an empty message (others see it said nothing)
    skip_turn       the absent agent's turns are skipped: nothing of it is heard or recorded
    default_policy  a stand-in policy (`credit.default_policy`, 'module:function') speaks for it
    resample        the agent's own policy is sampled again with another seed (the policy must
                    accept a `seed=` keyword; deterministic scripted policies cannot be resampled)
    replay          replay of the full-team episode: messages before the first absent turn are kept,
                    the absent agent says nothing, and present agents regenerate everything after it
    mask            no re-run at all: the full-team transcript with the absent agents' messages (and
                    their tool calls) blanked, scored again
"""

from __future__ import annotations

import inspect
import math
import statistics

from marl.types import Task

ABSENT_POLICIES = ("null_message", "skip_turn", "default_policy", "resample", "replay", "mask")


class ScenarioCoalitionValue:
    """v(S): the cooperative team reward of `task` with only the agents in S present (see module doc)."""

    def __init__(self, env, policy, task: Task, *, absent: str = "null_message", rollouts: int = 1, seed: int = 0,
                 default_policy=None):
        if absent not in ABSENT_POLICIES:
            raise ValueError(f"absent={absent!r} is not one of {', '.join(ABSENT_POLICIES)}")
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
        self.transcripts: dict[tuple[frozenset, int], tuple[list, list]] = {}

    def __call__(self, coalition: frozenset) -> float:
        """Mean team reward over the shared seeds (NaN if a judge failed on some episode)."""
        return statistics.fmean(self.episode_return(frozenset(coalition), seed) for seed in self.seeds)

    def evaluate_many(self, coalitions) -> int:
        """Play every missing (coalition, seed) episode in lockstep; return how many were played.

        At each turn the present agents of all those episodes are answered together: by ONE call of
        `policy.batch([(agent, observation, task), ...])` when the policy has a `batch` method (an LLM
        policy generating for many prompts at once), else one call each. Used for null_message,
        skip_turn and default_policy; the replay-based policies run one episode at a time.
        """
        pending = [(frozenset(c), seed) for c in coalitions for seed in self.seeds
                   if (frozenset(c), seed) not in self.returns]
        pending = list(dict.fromkeys(pending))
        if not pending or self.absent not in ("null_message", "skip_turn", "default_policy"):
            for coalition, seed in pending:
                self.episode_return(coalition, seed)
            return len(pending)
        from marl.env import ScenarioEnv

        envs = [ScenarioEnv(self.env.scenario, tasks=[self.task]) for _ in pending]
        observations = [env.reset(seed=seed, options={"task": self.task, "absent": self._skipped(coalition)})[0]
                        for env, (coalition, seed) in zip(envs, pending)]
        rewards = [{} for _ in pending]
        while any(env.agents for env in envs):
            live = [k for k, env in enumerate(envs) if env.agents]
            texts = self._batched_actions([(k, agent, observations[k][agent]["text"], pending[k][0])
                                           for k in live for agent in envs[k].acting_agents()])
            for k in live:
                actions = {agent: {"text": texts.get((k, agent), "")} for agent in envs[k].agents}
                observations[k], rewards[k], *_ = envs[k].step(actions)
        for (coalition, seed), env, reward in zip(pending, envs, rewards):
            self.returns[coalition, seed] = team_reward(reward)
            if coalition == frozenset(self.players):
                self.transcripts[coalition, seed] = ([dict(t) for t in env.transcript], list(env.tool_log))
        return len(pending)

    def _skipped(self, coalition: frozenset) -> frozenset:
        return frozenset(self.players) - coalition if self.absent == "skip_turn" else frozenset()

    def _batched_actions(self, requests: list[tuple[int, str, str, frozenset]]) -> dict[tuple[int, str], str]:
        """Texts for every (episode, agent) request: present agents through one batched policy call."""
        texts, present = {}, []
        for k, agent, observation, coalition in requests:
            if agent in coalition:
                present.append((k, agent, observation))
            elif self.absent == "default_policy":
                texts[k, agent] = self.default_policy(agent, observation, self.task)
            else:
                texts[k, agent] = ""
        batch = getattr(self.policy, "batch", None)
        calls = [(agent, observation, self.task) for _, agent, observation in present]
        answers = batch(calls) if batch is not None else [self.policy(*call) for call in calls]
        texts.update({(k, agent): answer for (k, agent, _), answer in zip(present, answers)})
        return texts

    def episode_return(self, coalition: frozenset, seed: int) -> float:
        """The team reward of one seeded episode with `coalition` present (cached)."""
        key = (coalition, seed)
        if key not in self.returns:
            self.returns[key] = self._play(coalition, seed)
        return self.returns[key]

    # -- episodes ---------------------------------------------------------------------------------

    def _play(self, coalition: frozenset, seed: int) -> float:
        if self.absent == "mask" and coalition != frozenset(self.players):
            return self._masked(coalition, seed)
        reference = self._reference(seed) if self.absent == "replay" and coalition != frozenset(self.players) else None
        skip = frozenset(self.players) - coalition if self.absent == "skip_turn" else frozenset()
        observations, _ = self.env.reset(seed=seed, options={"task": self.task, "absent": skip})
        rewards = {}
        while self.env.agents:
            acting = self.env.acting_agents()
            actions = {agent: {"text": self._act(agent, observations[agent]["text"], coalition, seed, reference)
                               if agent in acting else ""} for agent in self.env.agents}
            observations, rewards, *_ = self.env.step(actions)
        if coalition == frozenset(self.players):
            self.transcripts[coalition, seed] = ([dict(t) for t in self.env.transcript], list(self.env.tool_log))
        return team_reward(rewards)

    def _act(self, agent: str, observation: str, coalition: frozenset, seed: int, reference) -> str:
        if agent in coalition:
            if reference is not None:  # replay: keep the original message while history is unchanged
                index = len(self.env.transcript)
                if self.env.transcript == reference[:index] and index < len(reference) \
                        and reference[index]["agent"] == agent:
                    return reference[index]["text"]
            return self.policy(agent, observation, self.task)
        if self.absent == "default_policy":
            return self.default_policy(agent, observation, self.task)
        if self.absent == "resample":
            return self.policy(agent, observation, self.task, seed=seed + 1_000_003)
        return ""

    def _reference(self, seed: int) -> list[dict]:
        full = frozenset(self.players)
        if (full, seed) not in self.transcripts:
            self.returns[full, seed] = self._play(full, seed)
        return [{k: t[k] for k in ("agent", "text", "turn")} for t in self.transcripts[full, seed][0]]

    def _masked(self, coalition: frozenset, seed: int) -> float:
        self._reference(seed)
        transcript, tool_log = self.transcripts[frozenset(self.players), seed]
        return masked_team_reward(self.env.scorer, self.task, transcript, tool_log, coalition, self.players)


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
    from itertools import combinations

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


def team_reward(rewards: dict[str, float]) -> float:
    """The cooperative team reward of per-agent rewards (all equal), NaN when there are none."""
    values = list(rewards.values())
    return values[0] if values else math.nan


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
