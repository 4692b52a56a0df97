"""A penalty scorer that cannot decide masks the episode; it never drops the penalty (issue 27, item 5).

A model judge's parse_error or refusal can be provoked by the candidate's own text, and an endpoint can
be down: in both cases the penalty was neither shown to apply nor not to, so the total is NaN (masked).
"""

from __future__ import annotations

import math

from judges.rules.registry import build_scorer as build_rule_scorer
from judges.types import Judgment, failed
from marl.env import make_env
from marl.rewards import EpisodeScorer


class _PenaltyJudge:
    """Stands for the model judge of a penalty, giving one fixed judgment (a failure or a verdict)."""

    name = "judge"

    def __init__(self, judgment: Judgment):
        self.judgment = judgment

    def score(self, item, candidates):
        return [self.judgment for _ in candidates]


def _blind_answer_total(penalty_judgment: Judgment | None) -> float:
    """The weather team's total for a blind correct answer, with the penalty scored by the real rule
    (None) or by a judge that returns `penalty_judgment`."""
    env = make_env("weather")
    scenario = env.scenario

    def build(scorer_spec):
        if penalty_judgment is not None and scorer_spec in scenario.spec.rewards.penalties:
            return _PenaltyJudge(penalty_judgment)
        return build_rule_scorer(scorer_spec.kind, scorer_spec.params(), scenario.base_dir)

    scorer = EpisodeScorer(scenario.spec, build)
    task = env.tasks[0]
    transcript = [{"agent": "runner", "text": f"ANSWER: {task.answer}", "turn": 0}]
    rewards, _ = scorer.score_episode(task, transcript, [], ["runner"])
    return rewards["runner"]


def test_a_penalty_judge_that_fails_masks_the_episode():
    honest = _blind_answer_total(None)
    assert honest == -0.5  # the real rule: a correct answer given blind loses the 0.5 penalty
    for status in ("parse_error", "refusal", "api_error"):
        assert math.isnan(_blind_answer_total(failed(status, "no verdict in the judge's reply"))), status


def test_a_penalty_judge_that_decides_still_applies_or_spares():
    from judges.types import passed

    assert _blind_answer_total(passed(0.0)) == -0.5
    assert _blind_answer_total(passed(1.0)) == 0.0


def _debate_total(format_judgment: Judgment | None) -> float:
    """debater_a's own total for a right answer in debate, with a second format scorer beside the rule
    (a judge that returns `format_judgment`), or the rule alone (None)."""
    env = make_env("debate")
    spec = env.scenario.spec
    rule = spec.rewards.format[0]
    judged = rule.model_copy(update={"kind": "clarity"}) if format_judgment is not None else None
    rewards_spec = spec.rewards.model_copy(update={"format": [rule] + ([judged] if judged else [])})
    spec = spec.model_copy(update={"rewards": rewards_spec})

    def build(scorer_spec):
        if judged is not None and scorer_spec.kind == "clarity":
            return _PenaltyJudge(format_judgment)
        return build_rule_scorer(scorer_spec.kind, scorer_spec.params(), env.scenario.base_dir)

    task = env.tasks[0]
    transcript = [{"agent": agent, "text": f"ANSWER: {task.answer}", "turn": turn}
                  for turn, agent in enumerate(["debater_a", "debater_b", "debater_a", "debater_b"])]
    _, breakdowns = EpisodeScorer(spec, build).score_episode(task, transcript, [], ["debater_a", "debater_b"])
    return breakdowns["debater_a"].total


def test_a_scorer_that_fails_beside_one_that_decides_masks_its_layer_it_is_never_dropped():
    # a candidate that makes the judge fail must not be scored by the rule it passes alone
    assert _debate_total(None) == 1.0
    from judges.types import passed

    assert _debate_total(passed(0.0)) < 1.0  # a judge that decides counts
    for status in ("parse_error", "refusal", "api_error"):
        assert math.isnan(_debate_total(failed(status, "no verdict in the judge's reply"))), status
