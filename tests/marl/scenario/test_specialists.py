"""The specialists scenario (bench/roles.py's default): its tasks, and roles that really differ: the same
surface ("37 25") means add to one role and subtract to the others, so a seat played by another
role's skill fails, while the expert team solves every held-out task."""

from __future__ import annotations

import re

import pytest

from helpers.paths import SCENARIOS
from marl.scenario.load import load_scenario, resolve_callable

PAIR = re.compile(r"\d\d \d\d")


@pytest.fixture(scope="module")
def specialists():
    return load_scenario(SCENARIOS / "specialists.yaml")


def _play(scenario, tasks, played_by: dict[str, str] | None = None) -> list:
    """The outcome layer of the expert team's episodes on `tasks` (1.0: final's answer is exact), each
    agent of `played_by` acting with another agent's skill."""
    from marl.policies import get_policy
    from marl.rollout import EpisodeJob, EpisodePlayer, PolicyActor

    expert, played_by = get_policy("expert", scenario, 0), played_by or {}

    def policy(agent, observation, task):
        return expert(played_by.get(agent, agent), observation, task)

    actor = PolicyActor(policy, order=scenario.agent_names)
    player = EpisodePlayer(scenario, {"team": actor}, {agent: "team" for agent in scenario.agent_names})
    episodes = player.play([EpisodeJob(task, index) for index, task in enumerate(tasks)]).episodes
    return [episode.breakdown["team"].layers["outcome"] for episode in episodes]


def test_the_tasks_are_seeded_two_digit_and_answered_by_the_chain():
    generate = resolve_callable("specialists_lib:generate_tasks", SCENARIOS)
    tasks = generate(seed=3, count=300)
    assert tasks == generate(seed=3, count=300) and tasks != generate(seed=4, count=300)
    for task in tasks:
        meta = task["metadata"]
        assert PAIR.fullmatch(meta["add"]) and PAIR.fullmatch(meta["sub"]), meta
        (a, b), (c, d) = (map(int, meta[key].split()) for key in ("add", "sub"))
        assert 20 <= a + b <= 98 and 10 <= c - d <= 49
        assert task["answer"] == str((a + b) - (c - d)) and 10 <= int(task["answer"]) <= 99
    assert {task["difficulty"] for task in tasks} == {0.0, 1.0}


def test_the_roles_map_the_same_surface_to_different_answers(specialists):
    expert = resolve_callable("specialists_lib:expert", SCENARIOS)
    assert expert("adder", "37 25", None) == "62"
    assert expert("subtractor", "37 25", None) == expert("final", "37 25", None) == "12"
    assert {agent.role for agent in specialists.spec.agents} == {"add", "sub", "final"}  # the only cue to the skill


def test_the_expert_team_solves_every_held_out_task_and_a_swapped_skill_fails(specialists):
    train, held_out = specialists.split()
    assert len(held_out) == 100 and not {t.id for t in train} & {t.id for t in held_out}
    tasks = held_out[:40]
    assert _play(specialists, tasks) == [1.0] * len(tasks)
    for played_by in ({"adder": "subtractor"}, {"final": "adder"}):  # the other role's skill in this seat
        assert _play(specialists, tasks, played_by) == [0.0] * len(tasks), played_by
    # the subtractor and final share a skill: swapping them costs nothing, as the swap test should find
    assert _play(specialists, tasks, {"subtractor": "final", "final": "subtractor"}) == [1.0] * len(tasks)
