"""A sample episode's credit split in words (marl.credit.explain) and the credit figures logged every step."""

from __future__ import annotations

import pytest

from marl.credit.exact import CreditEstimate
from marl.credit.explain import explain_credit
from marl.credit.replay import credit_figures
from marl.rollout import EpisodeJob, EpisodePlayer
from marl.scenario.load import load_scenario
from trainers.policy.actors import build_actors

EXPERTS = ["agents.0.policy=expert", "agents.1.policy=expert", "agents.2.policy=expert"]


def _episode(overrides):
    scenario = load_scenario("relay", list(overrides))
    actors, seats = build_actors(scenario, None)
    player = EpisodePlayer(scenario, actors, seats)
    task = scenario.split()[1][0]
    return player, player.play([EpisodeJob(task, 0)]).episodes[0], scenario.spec.credit


def test_a_silent_agent_is_shown_costing_the_team_what_the_stand_in_would_have_earned():
    player, episode, credit = _episode([*EXPERTS[:2], "agents.2.policy='null'"])
    text = "\n".join(explain_credit(player, episode, credit))
    assert "the team scored 0.00" in text
    assert "the stand-in policy `relay_lib:expert` in its place" in text
    assert "Without `final` the team would have scored 1.00, so `final` added -1.00." in text
    assert "Without `left` the team would have scored 0.00, so `left` added +0.00." in text
    assert "| {left, right} | 1.00 |" in text  # Shapley's coalitions: the absent final played by the stand-in
    assert "`final` -1.00" in text and "`left` +0.00" in text


def test_difference_credit_is_the_leave_one_out_values_without_a_coalition_table():
    player, episode, credit = _episode([*EXPERTS[:2], "agents.2.policy='null'", "credit.method=difference"])
    text = "\n".join(explain_credit(player, episode, credit))
    assert "v(everyone) - v(everyone without it)" in text and "| coalition playing" not in text
    assert "`final` -1.00" in text


def test_the_team_reward_says_no_agent_is_measured():
    player, episode, credit = _episode([*EXPERTS, "credit.method=team"])
    assert "no agent's part is measured" in explain_credit(player, episode, credit)[0]


def _estimate(values):
    return CreditEstimate(values=values, stderr=dict.fromkeys(values, 0.0), n_evals=1, method="shapley/exact")


def test_credit_figures_are_logged_whatever_the_sign():
    figures = credit_figures([_estimate({"a": -0.5, "b": 0.25}), None, _estimate({"a": -0.5, "b": 0.25})], ["a", "b"])
    assert figures["credit/a/value"] == -0.5 and figures["credit/b/value"] == 0.25  # the masked one is left out
    assert figures["credit/a/share"] == pytest.approx(-2 / 3) and figures["credit/b/share"] == pytest.approx(1 / 3)
    zero = credit_figures([_estimate({"a": 0.0, "b": 0.0})], ["a", "b"])
    assert zero == {"credit/a/value": 0.0, "credit/b/value": 0.0, "credit/a/share": 0.0, "credit/b/share": 0.0}
    assert credit_figures([None, None], ["a", "b"]) == {}  # every credit masked: nothing, never a 0
