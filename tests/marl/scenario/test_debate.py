"""The debate scenario measures skill (issue 32, item 2): independent first answers, right on one's own
beats corrected beats wrong, scripted opponents of graded strength."""

from __future__ import annotations

import types

import pytest

from helpers.paths import SCENARIOS
from judges.rules.registry import build_scorer
from judges.types import Item
from marl.env import make_env
from marl.policies import get_policy, rollout
from marl.rewards import build_candidate
from marl.scenario.load import load_scenario, resolve_callable

lib = types.SimpleNamespace(**resolve_callable("debate_lib:expert", SCENARIOS).__globals__)  # the module
SCENARIO = load_scenario("debate")
ENV = make_env(SCENARIO)
TASKS = ENV.tasks[:30]


def outcome(task, messages: list[tuple[str, str]], agent: str) -> float:
    """`agent`'s outcome score (debate_lib:debate_score) for a scripted transcript."""
    scorer = build_scorer("callable", {"function": "debate_lib:debate_score"}, SCENARIO.base_dir)
    transcript = [{"agent": who, "text": text, "turn": turn} for turn, (who, text) in enumerate(messages)]
    judgment = scorer.score(Item(task.prompt, answer=task.answer, metadata=dict(task.metadata)),
                            [build_candidate(transcript, [], agent)])[0]
    assert judgment.ok, judgment
    return judgment.score


def test_right_on_its_own_beats_corrected_beats_wrong():
    task = TASKS[0]
    right, wrong = f"ANSWER: {task.answer}", f"ANSWER: {int(task.answer) + 1}"
    for first, last, expected in [(right, right, 1.0), (wrong, right, 0.5), (right, wrong, 0.0), (wrong, wrong, 0.0),
                                  ("no number", right, 0.5), (right, "no number", 0.0)]:
        messages = [("debater_a", first), ("debater_b", "ANSWER: 0"), ("debater_a", last), ("debater_b", "ANSWER: 0")]
        assert outcome(task, messages, "debater_a") == expected, (first, last)
    # only the message's last ANSWER counts: listing candidates is not being right
    hedge = f"ANSWER: {task.answer} or ANSWER: {int(task.answer) + 1}"
    assert outcome(task, [("debater_a", hedge), ("debater_a", hedge)], "debater_a") == 0.0


def test_first_answers_are_independent_neither_sees_the_other_before_answering():
    observations, _ = ENV.reset(seed=0)
    assert set(ENV.agents) == {"debater_a", "debater_b"}  # both act in the first turn
    observations, *_ = ENV.step({"debater_a": {"text": "SECRET-A ANSWER: 1"}, "debater_b": {"text": "SECRET-B ANSWER: 2"}})
    assert "SECRET-A" in observations["debater_b"]["text"] and "SECRET-B" in observations["debater_a"]["text"]
    first, _ = ENV.reset(seed=0)
    assert not any("SECRET" in first[agent]["text"] for agent in first)


def play(first, second, task) -> dict[str, float]:
    """The zero-sum rewards of one debate: `first` plays debater_a, `second` debater_b."""
    players = {"debater_a": first, "debater_b": second}
    return rollout(ENV, lambda agent, observation, t: players[agent](agent, observation, t), task=task).rewards


@pytest.mark.parametrize("seat", [0, 1])
def test_opponents_are_graded_the_expert_beats_random_always_claim_when_it_is_wrong_and_ties_itself(seat):
    expert = get_policy("expert", SCENARIO)
    agent = ("debater_a", "debater_b")[seat]

    def rewards(opponent) -> list[float]:
        return [play(*((expert, opponent) if seat == 0 else (opponent, expert)), task)[agent] for task in TASKS]

    assert all(reward > 0 for reward in rewards(lib.random_player))
    claim_wrong = [str(task.metadata["claimed"]) != task.answer for task in TASKS]
    assert [reward > 0 for reward in rewards(lib.claim_player)] == claim_wrong  # wins exactly when the claim is wrong
    assert 0 < sum(claim_wrong) < len(TASKS)
    assert rewards(expert) == [0.0] * len(TASKS)
