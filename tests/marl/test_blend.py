"""Blending rule and judge scores: gate and sum, shrinkage of uncertain judges, masked failures."""

import math

import pytest

from judges.types import Judgment, failed, passed
from marl.blend import blend_group, judgment_variance, shrink_to_group_mean


def judge(score, probabilities=None):
    return Judgment("ok", score, probabilities=probabilities)


def test_gate_uses_the_rule_where_it_applies_and_the_judge_elsewhere():
    results = blend_group([passed(1.0), None, None], [judge(0.2), judge(0.9), judge(0.5)])
    assert [r.source for r in results] == ["rule", "judge", "judge"]
    assert results[0].value == 1.0 and results[0].rule == 1.0 and results[0].judge is None


def test_sum_weights_both_sources():
    [result] = blend_group([passed(1.0)], [judge(0.5)], mode="sum", weights=(3.0, 1.0))
    assert result.value == pytest.approx((3 * 1.0 + 0.5) / 4) and result.source == "sum"


@pytest.mark.parametrize("rule,judgment,mode", [
    (None, failed("api_error", "down"), "gate"),
    (failed("error", "broken verifier"), judge(0.7), "gate"),
    (passed(1.0), failed("timeout", "slow"), "sum"),
])
def test_failures_are_masked_never_zero(rule, judgment, mode):
    [result] = blend_group([rule], [judgment], mode=mode)
    assert result.masked and math.isnan(result.value) and result.source == "masked"


def test_uncertain_judges_shrink_toward_the_group_mean_and_confident_ones_do_not():
    scores = [0.9, 0.1, 0.5]
    confident = shrink_to_group_mean(scores, [0.0, 0.0, 0.0])
    assert [s for s, _ in confident] == pytest.approx(scores)
    noisy = shrink_to_group_mean(scores, [1.0, 1.0, 1.0])
    mean = sum(scores) / 3
    assert all(abs(s - mean) < abs(orig - mean) for (s, _), orig in zip(noisy, scores) if orig != mean)
    assert sum(s for s, _ in noisy) / 3 == pytest.approx(mean)  # the group mean is kept


def test_variance_comes_from_the_rating_distribution():
    sure = Judgment("ok", 0.9, probabilities={"1": 0.0, "10": 1.0})
    torn = Judgment("ok", 0.5, probabilities={"1": 0.5, "10": 0.5})
    assert judgment_variance(sure, 0.3) == 0.0 and judgment_variance(torn, 0.3) == pytest.approx(0.25)
    assert judgment_variance(judge(0.5), 0.3) == 0.3
    results = blend_group([None, None, None], [torn, sure, Judgment("ok", 0.1, probabilities={"1": 1.0, "10": 0.0})])
    assert results[0].shrink < results[1].shrink == pytest.approx(1.0)


def test_mismatched_lengths_and_unknown_modes_are_rejected():
    with pytest.raises(ValueError, match="one of each"):
        blend_group([None], [])
    with pytest.raises(ValueError, match="mode"):
        blend_group([None], [judge(0.5)], mode="max")
