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
