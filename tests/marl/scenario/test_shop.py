"""The shop scenario (written for pretrained chat models): its tasks, its expert, and its scoring of a
bare number against a sentence, played through the scenario's own environment."""

from __future__ import annotations

import re

import pytest

from helpers.paths import SCENARIOS
from marl.scenario.load import load_scenario, resolve_callable


@pytest.fixture(scope="module")
def shop():
    return load_scenario(SCENARIOS / "shop.yaml")


def test_the_tasks_are_seeded_and_their_answers_are_the_price_times_the_quantity():
    generate = resolve_callable("shop_lib:generate_tasks", SCENARIOS)
    tasks = generate(seed=3, count=200)
    assert tasks == generate(seed=3, count=200) and tasks != generate(seed=4, count=200)
    for task in tasks:
        listing = dict((fruit, int(price)) for fruit, price in re.findall(r"(\w+) (\d+) dollars", task["metadata"]["listing"]))
        meta = task["metadata"]
        assert int(task["answer"]) == listing[meta["fruit"]] * int(meta["quantity"])
        assert task["difficulty"] == float(int(meta["quantity"]) > 1)
    assert {int(t["metadata"]["quantity"]) for t in tasks} == {1, 2, 3}


def test_the_expert_team_solves_every_held_out_task(shop):
    from marl.policies import get_policy
    from marl.rollout import EpisodePlayer, EpisodeJob, PolicyActor

    train, held_out = shop.split()
    assert len(held_out) == 200 and not {t.id for t in train} & {t.id for t in held_out}
    expert = PolicyActor(get_policy("expert", shop, 0), order=shop.agent_names)
    player = EpisodePlayer(shop, {"expert": expert}, {agent: "expert" for agent in shop.agent_names})
    episodes = player.play([EpisodeJob(task, index) for index, task in enumerate(held_out[:50])]).episodes
    assert all(e.rewards["cashier"] > 0.99 for e in episodes), [e.transcript for e in episodes[:2]]


@pytest.mark.parametrize("clerk, cashier, success, well_formed", [
    ("5", "10", True, True),
    ("5.", "10.", True, True),                    # a trailing period is still a bare number
    ("5", "The total is 10 dollars.", False, False),  # a sentence is neither read as the answer nor well formed
    ("7", "14", False, True),                     # well formed and wrong
])
def test_the_cashiers_answer_decides_success_and_a_bare_number_is_well_formed(shop, clerk, cashier, success,
                                                                               well_formed):
    from judges.types import Item
    from marl.env import make_env

    task = next(t for t in shop.split()[1] if t.metadata["quantity"] == "2" and t.metadata["price"] == "5")
    transcript = [{"agent": "clerk", "text": clerk, "turn": 0}, {"agent": "cashier", "text": cashier, "turn": 1}]
    item = Item(prompt=task.prompt, answer=task.answer, metadata=dict(task.metadata))
    scored = make_env(SCENARIOS / "shop.yaml").scorer.score_candidate(item, transcript, [], "cashier")
    assert (scored.layers["outcome"] > 0.99) == success
    assert (scored.layers["format"] > 0.99) == well_formed
