"""Blend rule-verified and (calibrated) judge scores into one reward per candidate of a group.

Two modes:

    gate  the rule's score wherever the rule applies (its judgment is ok); the judge's elsewhere
    sum   (w_rule * rule + w_judge * judge) / (w_rule + w_judge) where both are ok

Judge uncertainty shrinks toward the group mean before blending: a judge score s with variance
var moves to m + lambda (s - m), lambda = 1 / (1 + var / var_group), where m and var_group are the
mean and variance of the group's judge scores. A noisy judge therefore moves advantages less than
a confident one. The variance comes from the judgment's label probabilities when it has them
(pointwise ratings with logprobs), else from `default_variance`.

A failed judgment is masked: the blended value is NaN (GRPO gives it advantage 0), never 0. A rule
that does not apply is passed as None. Each result records where its value came from.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from judges.types import Judgment

MODES = ("gate", "sum")


@dataclass(frozen=True)
class BlendedScore:
    """The blended value and each source's contribution (None where a source did not contribute)."""

    value: float
    source: str  # "rule", "judge", "sum" or "masked"
    rule: float | None
    judge: float | None
    judge_raw: float | None
    shrink: float | None  # lambda applied to the judge score

    @property
    def masked(self) -> bool:
        return math.isnan(self.value)


def judgment_variance(judgment: Judgment, default: float) -> float:
    """Variance of a judge score in [0, 1] from its label probabilities (ratings), else `default`."""
    probabilities = judgment.probabilities or {}
    try:
        values = {float(label): p for label, p in probabilities.items()}
    except ValueError:
        return default
    if len(values) < 2:
        return default
    low, high = min(values), max(values)
    scaled = {(v - low) / (high - low): p for v, p in values.items()}
    total = sum(scaled.values())
    mean = sum(v * p for v, p in scaled.items()) / total
    return sum(p * (v - mean) ** 2 for v, p in scaled.items()) / total


def shrink_to_group_mean(scores: Sequence[float | None], variances: Sequence[float]) -> list[tuple[float | None, float | None]]:
    """(shrunk score, lambda) per member; None and NaN stay as they are."""
    present = [s for s in scores if s is not None and not math.isnan(s)]
    if len(present) < 2:
        return [(s, None) for s in scores]
    mean, spread = statistics.fmean(present), statistics.pvariance(present)
    shrunk = []
    for score, variance in zip(scores, variances):
        if score is None or math.isnan(score):
            shrunk.append((score, None))
            continue
        factor = 1.0 / (1.0 + variance / spread) if spread > 0 else 0.0
        shrunk.append((mean + factor * (score - mean), factor))
    return shrunk


def blend_group(rules: Sequence[Judgment | None], judges: Sequence[Judgment | None], *, mode: str = "gate",
                weights: tuple[float, float] = (1.0, 1.0), default_variance: float = 0.0) -> list[BlendedScore]:
    """Blend one group's rule and judge judgments (same length; None = no rule / no judge)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of {MODES}")
    if len(rules) != len(judges):
        raise ValueError(f"{len(rules)} rule judgments but {len(judges)} judge judgments: give one of each per member")
    raw = [j.score if j is not None and j.ok else None for j in judges]
    variances = [judgment_variance(j, default_variance) if j is not None and j.ok else 0.0 for j in judges]
    shrunk = shrink_to_group_mean(raw, variances)
    return [_blend_one(rule, judge, raw_score, shrunk_score, factor, mode, weights)
            for rule, judge, raw_score, (shrunk_score, factor) in zip(rules, judges, raw, shrunk)]


def _blend_one(rule, judge, raw_score, judge_score, factor, mode, weights) -> BlendedScore:
    rule_score = rule.score if rule is not None and rule.ok else None
    rule_failed = rule is not None and not rule.ok
    judge_failed = judge is not None and not judge.ok

    def masked():
        return BlendedScore(math.nan, "masked", rule_score, judge_score, raw_score, factor)

    if mode == "gate":
        if rule_score is not None:
            return BlendedScore(rule_score, "rule", rule_score, None, raw_score, factor)
        if rule_failed or judge_failed or judge_score is None:
            return masked()
        return BlendedScore(judge_score, "judge", None, judge_score, raw_score, factor)
    if rule_failed or judge_failed or rule_score is None or judge_score is None:
        return masked()
    w_rule, w_judge = weights
    value = (w_rule * rule_score + w_judge * judge_score) / (w_rule + w_judge)
    return BlendedScore(value, "sum", rule_score, judge_score, raw_score, factor)
