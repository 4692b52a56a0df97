"""The example scenarios under examples/ (docs/concepts.md's check of a new scenario on the defaults) pass the
same conformance checks as the built-ins, and their experts solve them while a null team does not."""

from __future__ import annotations

import pytest
from helpers.paths import ROOT

from marl.policies import get_policy
from marl.rollout import policy_player, EpisodeJob
from marl.env import make_env
from marl.scenario.load import load_scenario
from marl.testing import scenario_conformance

EXAMPLES = sorted((ROOT / "examples").glob("*/*.yaml"))


def test_there_is_an_example_scenario():
    assert [path.name for path in EXAMPLES] == ["subadd.yaml"]


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_an_example_passes_the_conformance_checks_and_its_expert_solves_it(path):
    scenario_conformance(str(path))
    scenario = load_scenario(str(path))
    env = make_env(scenario)
    tasks = scenario.split()[1][:20]
    for name, expected in (("expert", 1.0), ("null", 0.0)):
        player = policy_player(env, get_policy(name, scenario))
        episodes = player.play([EpisodeJob(task, index) for index, task in enumerate(tasks)]).episodes
        assert [e.breakdown["team"].layers["outcome"] for e in episodes] == [expected] * len(tasks), name
