"""The bias report end to end: real prompts -> OpenAIBackend -> simulated biased judge -> parsing ->
estimators. Injected bias parameters must be recovered (inside the 95% CI), and an unbiased judge must
pass where a biased one fails (negative control)."""

import pytest

from judges.model.prompted import PairwiseJudge
from judges.model.openai_backend import OpenAIBackend
from judges.stats.bias_report import ReportItem, report_markdown, run_bias_report
from judges.model.simulated import SimulatedClient

QUESTIONS = [f"Question {i}: explain topic {i}." for i in range(300)]


def _items():
    """Each item has a good and a worse answer; gold = 0 (the first is better)."""
    return [ReportItem(id=str(i), prompt=q, gold=0,
                       candidates=(f"A clear and correct explanation of topic {i}, with the key facts.",
                                   f"Topic {i} is a thing."))
            for i, q in enumerate(QUESTIONS)]


def _quality(text: str) -> float:
    return 1.0 if "correct explanation" in text else 0.0


def _report(**biases):
    client = SimulatedClient(_quality, sharpness=4.0, seed=1, **biases)
    judge = PairwiseJudge(OpenAIBackend(client, model="sim", max_concurrency=64), logprobs=False)
    return run_bias_report(judge, _items(), per_kind=300, seed=0, judge_name="SimJudge")


# make test (--dist loadgroup): this module's tests run on one worker, so biased and unbiased are built once
pytestmark = pytest.mark.xdist_group("bias_report")


@pytest.fixture(scope="module")
def biased():
    return _report(position=0.6, length_slope=0.5, format_effect=0.8, authority=0.5, self_preference=0.7,
                   master_key=6.0)


@pytest.fixture(scope="module")
def unbiased():
    return _report()


@pytest.mark.parametrize("section,name,injected", [
    ("length", "slope", 0.5),
    ("format", "effect", 0.8),
    ("authority", "effect", 0.5),
    ("self_preference", "effect", 0.7),
])
def test_injected_biases_are_recovered_inside_their_ci(biased, section, name, injected):
    estimate = biased[section][name]
    assert estimate["ci_low"] <= injected <= estimate["ci_high"], estimate
    assert biased["verdicts"][f"{section}.{name}"] in ("warn", "fail")


def test_position_bias_is_recovered_and_its_absence_seen(biased, unbiased):
    log_odds = biased["position"]["log_odds"]
    assert log_odds["ci_low"] <= 0.6 <= log_odds["ci_high"] and log_odds["ci_low"] > 0.2
    assert unbiased["position"]["log_odds"]["ci_low"] <= 0 <= unbiased["position"]["log_odds"]["ci_high"]


def test_master_key_fools_the_biased_judge_only(biased, unbiased):
    assert biased["master_key"]["fpr"]["estimate"] > 0.5 and biased["verdicts"]["master_key.fpr"] == "fail"
    assert unbiased["master_key"]["fpr"]["ci_low"] < 0.05


def test_the_unbiased_judge_passes_every_effect(unbiased):
    for key in ("length.slope", "format.effect", "authority.effect", "self_preference.effect"):
        section, name = key.split(".")
        estimate = unbiased[section][name]
        assert estimate["ci_low"] <= 0 <= estimate["ci_high"], (key, estimate)
    assert unbiased["null_answer"]["win_rate"]["estimate"] < 0.05


def test_report_has_the_documented_keys_and_gold_agreement(biased):
    for key in ("position", "length", "master_key", "null_answer", "n_calls", "n_failed", "verdicts", "gold"):
        assert key in biased
    assert {"estimate", "ci_low", "ci_high"} <= set(biased["position"]["log_odds"])
    assert 0 <= biased["position"]["flip_rate"] <= 1 and biased["n_failed"] == 0
    assert biased["gold"]["accuracy"]["estimate"] > 0.9
    assert "| length.slope |" in report_markdown(biased)


# -- numbers or nothing: a verdict needs a finite, bounded CI; the report is strict JSON ----------------------
def test_an_unbounded_ci_is_not_estimated_never_pass():
    from judges.stats.bias_report import grade_with_reasons

    report = {"length": {"slope": {"estimate": 0.1, "ci_low": -2.6e22, "ci_high": 2.6e22}},
              "position": {"log_odds": {"estimate": 0.05, "ci_low": -0.1, "ci_high": 0.2}},
              "format": {"effect": {"estimate": float("nan"), "ci_low": float("nan"), "ci_high": 1.0}},
              "master_key": {"fpr": None, "n": 0}}
    verdicts, reasons = grade_with_reasons(report)
    assert verdicts == {"length.slope": "not estimated", "position.log_odds": "pass",
                        "format.effect": "not estimated", "master_key.fpr": "not estimated"}
    assert reasons["length.slope"] == ("the 95% CI [-2.6e+22, 2.6e+22] is wider than 10: the data do not bound it "
                                       "(too few or separated verdicts)")
    assert reasons["format.effect"] == "the estimate or its CI is not finite (nan, nan, 1.0)"
    assert reasons["master_key.fpr"] == "no estimate (too few or unanimous verdicts)"


def test_a_separated_judge_gets_not_estimated_and_strict_json():
    import json
    import re
    import warnings

    client = SimulatedClient(_quality, sharpness=4.0, seed=1, length_slope=60.0, temperature=0.01)
    judge = PairwiseJudge(OpenAIBackend(client, model="sim", max_concurrency=64), logprobs=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        report = run_bias_report(judge, _items()[:20], per_kind=20, seed=0, judge_name="SimJudge")
    assert report["verdicts"]["length.slope"] == "not estimated"
    assert report["not_estimated"]["length.slope"].startswith("the 95% CI is unbounded (estimate ")
    assert report["length"]["slope"]["ci_low"] is None and report["length"]["slope"]["ci_high"] is None
    assert report["null_values"]["length.slope.ci_high"] == "inf: not a finite number, written as null"

    def refuse(constant):
        raise AssertionError(f"non-strict JSON constant {constant}")

    text = json.dumps(report, allow_nan=False)  # raises on any NaN or infinity left
    assert json.loads(text, parse_constant=refuse) == report
    markdown = report_markdown(report)
    assert re.search(r"\| length\.slope \| \+\d+\.\d{3} \[-, -\] \| not estimated \|", markdown)
    assert "- length.slope: the 95% CI is unbounded" in markdown
