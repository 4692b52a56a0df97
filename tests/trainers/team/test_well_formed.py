"""The held-out evaluation reports how well formed each agent's own answers are, apart from success."""

from __future__ import annotations

import pytest

from helpers.paths import SCENARIOS
from marl.rollout import EpisodePlayer, PolicyActor
from marl.scenario.load import load_scenario
from trainers.team.evaluation import evaluate_team


@pytest.fixture(scope="module")
def shop():
    return load_scenario(SCENARIOS / "shop.yaml")


def scripted(shop, clerk, cashier):
    def policy(agent, observation, task):
        return (clerk if agent == "clerk" else cashier)(observation, task)

    actor = PolicyActor(policy, order=shop.agent_names)
    return EpisodePlayer(shop, {"team": actor}, {agent: "team" for agent in shop.agent_names})


def test_a_sentence_with_the_right_number_is_neither_well_formed_nor_read_as_the_answer(shop):
    tasks = shop.split()[1][:12]
    bare_price = lambda observation, task: task.metadata["price"]  # noqa: E731
    chatty_total = lambda observation, task: f"The total is {task.answer} dollars."  # noqa: E731
    figures = evaluate_team(scripted(shop, bare_price, chatty_total), tasks)
    assert figures["well_formed/clerk"] == 1.0 and figures["well_formed/cashier"] == 0.0
    assert figures["well_formed"] == 0.5 and figures["team_success"] == 0.0


def test_well_formed_and_wrong_counts_as_well_formed_but_not_as_success(shop):
    tasks = shop.split()[1][:12]
    wrong = lambda observation, task: str(int(task.answer) + 1)  # noqa: E731
    right_price = lambda observation, task: task.metadata["price"]  # noqa: E731
    figures = evaluate_team(scripted(shop, right_price, wrong), tasks)
    assert figures["well_formed"] == 1.0 and figures["team_success"] == 0.0
    figures = evaluate_team(scripted(shop, right_price, lambda o, task: task.answer), tasks)
    assert figures["well_formed"] == 1.0 and figures["team_success"] == 1.0
