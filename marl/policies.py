"""Policies for tests and baselines, and the one-episode view of the engine for them.

A policy is `policy(agent, observation, task) -> text`. Built-in: `expert` (the scenario's expert
function), `null` (always the empty message), `random` (printable noise, seeded) and any scripted
'module:function' with the same signature. `rollout` plays one episode with one policy for every
agent and returns what happened; it is no loop of its own but `marl.rollout.EpisodePlayer` (the
engine) with the policy as its only actor, called agent by agent in the environment's order.
`mean_reward` averages team rewards over tasks.
"""

from __future__ import annotations

import random
import statistics
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from marl.rollout import EpisodeJob, policy_player
from marl.scenario.load import Scenario
from marl.types import Task

Policy = Callable[[str, str, Task], str]


def null_policy(agent: str, observation: str, task: Task) -> str:
    """Says nothing: the absent agent."""
    return ""


class RandomPolicy:
    """Printable noise of random length, from its own seeded RNG (`rng` is its whole state)."""

    alphabet = string.ascii_letters + string.digits + string.punctuation + " "

    def __init__(self, seed: int = 0, max_chars: int = 16):
        self.rng, self.max_chars = random.Random(seed), max_chars

    def __call__(self, agent: str, observation: str, task: Task) -> str:
        return "".join(self.rng.choice(self.alphabet) for _ in range(self.rng.randint(0, self.max_chars)))


class PolicyError(ValueError):
    """A scripted policy that raised: reported as one line naming the policy, never a traceback."""


class ScriptedPolicy:
    """A 'module:function' policy; whatever it raises becomes a PolicyError naming it."""

    def __init__(self, reference: str, function: Policy):
        self.reference, self.__wrapped__ = reference, function

    def __call__(self, agent: str, observation: str, task: Task) -> str:
        try:
            return self.__wrapped__(agent, observation, task)
        except Exception as error:  # noqa: BLE001 - user code: one line, not a traceback
            raise PolicyError(f"policy {self.reference!r} raised {type(error).__name__}: {error} (a policy is "
                              "called as function(agent, observation, task) and returns the agent's message)") \
                from None


def random_policy(seed: int = 0, max_chars: int = 16) -> Policy:
    """Printable noise of random length, from its own seeded RNG."""
    return RandomPolicy(seed, max_chars)


def get_policy(name: str, scenario: Scenario, seed: int = 0) -> Policy:
    """`expert`, `null`, `random`, or a scripted 'module:function' (resolved next to the scenario)."""
    if name == "null":
        return null_policy
    if name == "random":
        return random_policy(seed)
    if name == "expert":
        if scenario.spec.expert is None:
            raise ValueError(f"scenario {scenario.spec.name!r} has no expert (add `expert: module:function`)")
        return ScriptedPolicy(scenario.spec.expert, scenario.resolve(scenario.spec.expert))
    if ":" in name:
        return ScriptedPolicy(name, scenario.resolve(name))
    raise ValueError(f"unknown policy {name!r}: use expert, null, random or a 'module:function'")


@dataclass
class EpisodeResult:
    """What one episode produced."""

    task: Task
    transcript: list[dict]
    rewards: dict[str, float]
    breakdown: dict
    tool_validity: dict[str, float | None] = field(default_factory=dict)
    observations: list[dict] = field(default_factory=list)  # (agent, observation, action) per heard turn


def rollout(env, policy: Policy, task: Task | str | int | None = None, seed: int = 0) -> EpisodeResult:
    """Play one episode of a ScenarioEnv with `policy` for every agent whose turn it is (through the engine)."""
    player = policy_player(env, policy, order=env.possible_agents)
    [episode] = player.play([EpisodeJob(task, seed)]).episodes
    heard = [{"agent": t.agent, "observation": t.observation, "action": t.text} for t in episode.turns]
    return EpisodeResult(task=episode.task, transcript=episode.transcript, rewards=episode.rewards,
                         breakdown=episode.breakdown, tool_validity=episode.tool_validity, observations=heard)


def mean_reward(env, policy: Policy, tasks: list[Task], seed: int = 0) -> float:
    """Mean over tasks of the mean reward over agents (the team reward in cooperative mode)."""
    totals = []
    for index, task in enumerate(tasks):
        result = rollout(env, policy, task=task, seed=seed + index)
        totals.append(statistics.fmean(result.rewards.values()))
    return statistics.fmean(totals)
