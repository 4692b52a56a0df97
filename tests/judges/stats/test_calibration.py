"""Calibrators: closed-form and oracle checks, JSON round-trips, judge binding (T0), and the
debiasing targets on synthetic judges (T2).

Targets are asserted on means over fixed seeds; the comments give the values measured here and
the margins were checked to be >= 3 standard errors.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from judges.stats.calibration import (Calibrator, HierarchicalCalibrator, IsotonicCalibrator, PlattCalibrator,
                                StyleDebiaser, _pool_adjacent_violators, isotonic_fit, standardize_features)
from judges.stats.agreement import spearman
from judges.stats.inference import expected_calibration_error, sigmoid

JUDGE = "sim-judge@v1/prompt:3f2a"


def miscalibrated_judge(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Overconfident, lenient judge: P(gold) = sigmoid(0.5 * judge_logit - 0.6). Returns (judge
    probability, true P(gold), sampled gold label); raw ECE ~0.18."""
    judge_logit = rng.normal(1.0, 2.0, n)
    truth = sigmoid(0.5 * judge_logit - 0.6)
    return sigmoid(judge_logit), truth, (rng.random(n) < truth).astype(float)


@pytest.fixture(scope="module")
def held_out():
    return miscalibrated_judge(np.random.default_rng(123), 50_000)


def fitted_calibrators() -> list[tuple[Calibrator, dict]]:
    """One fitted calibrator of each kind, with the keyword arguments its apply needs."""
    rng = np.random.default_rng(0)
    x, _, gold = miscalibrated_judge(rng, 400)
    domains = np.where(np.arange(400) < 350, "math", "essay")
    features = np.column_stack([rng.normal(size=400), rng.poisson(2, 400)])
    groups = np.arange(400) // 8
    return [
        (PlattCalibrator().fit(x, gold, judge_id=JUDGE), {}),
        (IsotonicCalibrator().fit(x, gold, judge_id=JUDGE), {}),
        (HierarchicalCalibrator().fit(x, gold, domains, verifiable_domains={"math"}, judge_id=JUDGE),
         {"domains": domains}),
        (StyleDebiaser(["log_len", "md_lists"]).fit(x, gold, features, judge_id=JUDGE, groups=groups),
         {"features": features, "groups": groups}),
    ]


# ------------------------------------------------------------------------ T0: serialisation, binding


@pytest.mark.parametrize("index", range(4))
def test_json_round_trip_and_file(index, tmp_path):
    calibrator, extra = fitted_calibrators()[index]
    x = miscalibrated_judge(np.random.default_rng(1), 400)[0]
    expected = calibrator.apply(x, judge_id=JUDGE, **extra)
    data = json.loads(json.dumps(calibrator.to_json()))
    assert data["judge_id"] == JUDGE and data["format_version"] == 1 and data["n_fit"] == 400
    assert len(data["data_sha256"]) == 64 and data["kind"] == calibrator.kind
    restored = Calibrator.from_json(data)
    assert type(restored) is type(calibrator)
    np.testing.assert_allclose(restored.apply(x, judge_id=JUDGE, **extra), expected, rtol=0, atol=1e-12)
    calibrator.save(tmp_path / "cal.json")
    loaded = type(calibrator).load(tmp_path / "cal.json")
    np.testing.assert_allclose(loaded.apply(x, judge_id=JUDGE, **extra), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("index", range(4))
def test_refuses_to_apply_to_another_judge(index):
    calibrator, extra = fitted_calibrators()[index]
    x = np.full(400, 0.7)
    with pytest.raises(ValueError, match="fitted for judge 'sim-judge@v1/prompt:3f2a' and refuses"):
        calibrator.apply(x, judge_id="sim-judge@v2/prompt:3f2a", **extra)
    restored = Calibrator.from_json(calibrator.to_json())
    with pytest.raises(ValueError, match="refuses"):
        restored.apply(x, judge_id="other", **extra)


def test_loading_errors_and_unfitted_use():
    calibrator, _ = fitted_calibrators()[0]
    data = calibrator.to_json()
    with pytest.raises(ValueError, match="format_version"):
        Calibrator.from_json({**data, "format_version": 99})
    with pytest.raises(ValueError, match="kind 'platt' as IsotonicCalibrator"):
        IsotonicCalibrator.from_json(data)
    with pytest.raises(ValueError, match="not fitted"):
        PlattCalibrator().apply([0.5], judge_id=JUDGE)
    with pytest.raises(ValueError, match="judge_id"):
        PlattCalibrator().fit([0.2, 0.8], [0, 1], judge_id="")
    with pytest.raises(ValueError, match="input_space"):
        PlattCalibrator(input_space="odds")


def test_data_hash_tracks_the_fit_data():
    x, _, gold = miscalibrated_judge(np.random.default_rng(5), 200)
    first = PlattCalibrator().fit(x, gold, judge_id=JUDGE).data_sha256
    assert first == PlattCalibrator().fit(x.copy(), gold, judge_id=JUDGE).data_sha256
    gold[0] = 1 - gold[0]
    assert first != PlattCalibrator().fit(x, gold, judge_id=JUDGE).data_sha256


# ------------------------------------------------------------------------- T0: closed forms, oracles


def test_platt_closed_form_two_scores():
    # With two distinct scores a two-parameter logistic fit reproduces each score's gold rate exactly.
    x = np.repeat([0.3, 0.8], [40, 60])
    gold = np.r_[np.ones(10), np.zeros(30), np.ones(45), np.zeros(15)]
    platt = PlattCalibrator().fit(x, gold, judge_id=JUDGE)
    assert platt.apply([0.3, 0.8], judge_id=JUDGE) == pytest.approx([0.25, 0.75], abs=1e-8)
    logit_input = PlattCalibrator(input_space="logit").fit(np.log(x / (1 - x)), gold, judge_id=JUDGE)
    assert logit_input.slope == pytest.approx(platt.slope) and logit_input.intercept == pytest.approx(platt.intercept)


def test_isotonic_matches_sklearn_and_pava_fallback():
    from sklearn.isotonic import IsotonicRegression

    rng = np.random.default_rng(2)
    x = np.round(rng.random(500), 2)  # ties
    gold = (rng.random(500) < x ** 2).astype(float)
    ours = IsotonicCalibrator().fit(x, gold, judge_id=JUDGE)
    reference = IsotonicRegression(out_of_bounds="clip").fit(x, gold)
    grid = np.linspace(-0.1, 1.1, 301)
    np.testing.assert_allclose(ours.apply(grid, judge_id=JUDGE), reference.predict(grid), atol=1e-10)
    y, w = rng.random(200), rng.uniform(0.5, 2.0, 200)
    np.testing.assert_allclose(_pool_adjacent_violators(y, w), isotonic_fit(y, w), atol=1e-12)


def test_standardize_features_within_groups():
    data = np.array([[1.0, 5.0], [3.0, 5.0], [10.0, 1.0], [20.0, 3.0], [30.0, 2.0]])
    z = standardize_features(data, groups=[0, 0, 1, 1, 1])
    assert z[:2, 0] == pytest.approx([-1.0, 1.0]) and z[:2, 1] == pytest.approx([0.0, 0.0])  # constant -> 0
    assert z[2:, 0] == pytest.approx((data[2:, 0] - 20.0) / np.std(data[2:, 0]))


# ------------------------------------------------------------------------------ T2: Platt and isotonic


def test_platt_reaches_ece_target_with_300_labels(held_out):
    x_test, truth_test, gold_test = held_out
    assert expected_calibration_error(x_test, gold_test) == pytest.approx(0.18, abs=0.01)
    rng = np.random.default_rng(10)
    ece, pass_rate_bias = [], []
    for _ in range(200):
        x, _, gold = miscalibrated_judge(rng, 300)
        calibrated = PlattCalibrator().fit(x, gold, judge_id=JUDGE).apply(x_test, judge_id=JUDGE)
        ece.append(expected_calibration_error(calibrated, gold_test))
        pass_rate_bias.append(calibrated.mean() - truth_test.mean())
    assert np.mean(ece) <= 0.05  # measured 0.030 (se 0.001) over 200 seeds
    assert abs(np.mean(pass_rate_bias)) <= 0.01  # measured 0.1 pt (se 0.2 pt)


def test_isotonic_reaches_ece_target_with_1000_labels(held_out):
    x_test, _, gold_test = held_out
    rng = np.random.default_rng(11)
    ece = []
    for _ in range(30):
        x, _, gold = miscalibrated_judge(rng, 1000)
        calibrated = IsotonicCalibrator().fit(x, gold, judge_id=JUDGE).apply(x_test, judge_id=JUDGE)
        ece.append(expected_calibration_error(calibrated, gold_test))
    assert np.mean(ece) <= 0.04  # measured 0.027 (se 0.0015)


# --------------------------------------------------------------- T2: verifiable -> soft transfer

SLOPE, INTERCEPT, LENIENCY = 0.6, -0.3, 1.0


def domain_sample(rng: np.random.Generator, n: int, leniency: float):
    """The judge inflates its logit by `leniency` on this domain; gold follows the uninflated logit."""
    judge_logit = rng.normal(0.5, 1.5, n)
    truth = sigmoid(INTERCEPT + SLOPE * (judge_logit - leniency))
    return sigmoid(judge_logit), truth, (rng.random(n) < truth).astype(float)


def test_hierarchical_transfer_removes_leniency_shift():
    x_soft, truth_soft, _ = domain_sample(np.random.default_rng(7), 5000, LENIENCY)
    soft = np.full(len(x_soft), "essay")
    rng = np.random.default_rng(1000)
    hierarchical_bias, verifiable_only_bias = [], []
    for _ in range(800):
        x_v, _, gold_v = domain_sample(rng, 1000, 0.0)
        x_s, _, gold_s = domain_sample(rng, 50, LENIENCY)
        domains = np.r_[np.full(1000, "math"), np.full(50, "essay")]
        fit = HierarchicalCalibrator().fit(np.r_[x_v, x_s], np.r_[gold_v, gold_s], domains,
                                           verifiable_domains=["math"], judge_id=JUDGE)
        hierarchical_bias.append(fit.apply(x_soft, soft, judge_id=JUDGE).mean() - truth_soft.mean())
        platt = PlattCalibrator().fit(x_v, gold_v, judge_id=JUDGE)
        verifiable_only_bias.append(platt.apply(x_soft, judge_id=JUDGE).mean() - truth_soft.mean())
    assert abs(np.mean(hierarchical_bias)) <= 0.015  # measured +0.5 pt (se 0.22 pt); raw judge +21 pt
    assert np.mean(verifiable_only_bias) >= 0.05  # measured +12.5 pt


def test_hierarchical_flags_leniency_and_falls_back_to_prior():
    rng = np.random.default_rng(3)
    x_v, _, gold_v = domain_sample(rng, 2000, 0.0)
    x_s, _, gold_s = domain_sample(rng, 1000, LENIENCY)
    domains = np.r_[np.full(2000, "math"), np.full(1000, "essay")]
    fit = HierarchicalCalibrator().fit(np.r_[x_v, x_s], np.r_[gold_v, gold_s], domains,
                                       verifiable_domains={"math"}, judge_id=JUDGE)
    shift = fit.diagnostics["leniency_shift"]["essay"]
    assert shift["flagged"] and shift["shift"] == pytest.approx(-SLOPE * LENIENCY, abs=4 * shift["stderr"])
    assert fit.slope == pytest.approx(SLOPE, abs=4 * fit.slope_se)
    unseen = fit.apply([0.6], ["poetry"], judge_id=JUDGE)
    assert unseen == pytest.approx(sigmoid(fit.prior_intercept + fit.slope * np.log(0.6 / 0.4)))
    with pytest.raises(ValueError, match="verifiable domain"):
        HierarchicalCalibrator().fit(x_s, gold_s, ["essay"] * 1000, verifiable_domains={"math"}, judge_id=JUDGE)


# ----------------------------------------------------------------------- T2: style-GLM leaderboard

POLICIES, PROMPTS, JUDGE_LENGTH_SLOPE = 30, 805, 0.6


def leaderboard(seed: int) -> dict[str, float]:
    """30 policies vs a baseline on 805 prompts; length is worthless for gold, the judge pays 0.6
    logits per unit of log-length difference. Returns rank correlations with the true win rates."""
    rng = np.random.default_rng(seed)
    skill, verbosity = rng.normal(0, 0.6, POLICIES), rng.normal(0, 1, POLICIES)
    quality = skill[:, None] + rng.normal(size=(POLICIES, PROMPTS))
    log_len = 0.4 * verbosity[:, None] + rng.normal(0, 0.5, (POLICIES, PROMPTS))
    quality_gap = quality - rng.normal(size=PROMPTS)
    truth = sigmoid(quality_gap)
    judge = sigmoid(quality_gap + JUDGE_LENGTH_SLOPE * (log_len - rng.normal(0, 0.5, PROMPTS)))
    gold = np.full(truth.size, np.nan)
    labelled = rng.choice(truth.size, 3000, replace=False)
    gold[labelled] = rng.random(3000) < truth.ravel()[labelled]
    prompt_id = np.tile(np.arange(PROMPTS), POLICIES)
    features = log_len.reshape(-1, 1)
    debiaser = StyleDebiaser(["log_len"]).fit(judge.ravel(), gold, features, judge_id=JUDGE, groups=prompt_id)
    corrected = debiaser.apply(judge.ravel(), features, judge_id=JUDGE, groups=prompt_id).reshape(POLICIES, -1)
    raw, lc, true_rate = judge.mean(axis=1), corrected.mean(axis=1), truth.mean(axis=1)
    return {"raw": spearman(raw, true_rate), "lc": spearman(lc, true_rate),
            "verbosity_raw": spearman(verbosity, raw), "verbosity_lc": spearman(verbosity, lc),
            "mae_raw": np.abs(raw - true_rate).mean(), "mae_lc": np.abs(lc - true_rate).mean()}


def test_style_debiaser_on_synthetic_leaderboard():
    boards = [leaderboard(seed) for seed in range(40)]
    mean = {key: float(np.mean([b[key] for b in boards])) for key in boards[0]}
    # measured: Spearman with truth 0.912 -> 0.997 (gain se 0.005); Spearman(verbosity, .) 0.29 -> -0.04
    # (se 0.027); MAE vs true win rate 0.033 -> 0.008
    assert mean["lc"] >= mean["raw"] + 0.03
    assert abs(mean["verbosity_lc"]) <= 0.15 and mean["verbosity_raw"] >= 0.2
    assert mean["mae_lc"] <= 0.5 * mean["mae_raw"]


def test_style_debiaser_keeps_the_gold_slope():
    # When gold rewards length as much as the judge does, there is (almost) no excess to remove.
    rng = np.random.default_rng(6)
    n = 20_000
    log_len, quality = rng.normal(size=n), rng.normal(size=n)
    judge = sigmoid(quality + 0.6 * log_len)
    gold = (rng.random(n) < sigmoid(quality + 0.6 * log_len)).astype(float)
    gold[rng.random(n) < 0.5] = np.nan
    marginal = StyleDebiaser(["log_len"], judge_slope_method="logistic").fit(judge, gold, log_len[:, None],
                                                                              judge_id=JUDGE)
    stderr = np.hypot(marginal.judge_stderr[0], marginal.gold_stderr[0])
    assert abs(marginal.excess[0]) < 3 * stderr  # measured -0.008 (se 0.027)
    # The default reads the judge's own slope (0.59); the binary-gold slope is attenuated by the
    # unseen quality (0.50), so a small part of the genuine slope is removed too.
    own = StyleDebiaser(["log_len"]).fit(judge, gold, log_len[:, None], judge_id=JUDGE)
    assert own.judge_coef[0] == pytest.approx(0.6, abs=0.03) and 0.0 < own.excess[0] < 0.2
    with pytest.raises(ValueError, match="without groups"):
        own.apply(judge, log_len[:, None], judge_id=JUDGE, groups=np.zeros(n))


def test_saved_calibrators_are_strict_json_and_a_diverged_fit_is_not_written(tmp_path):
    import math
    import warnings

    scores = np.linspace(0.05, 0.95, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # separated labels: the stderr is unbounded
        platt = PlattCalibrator().fit(scores, (scores > 0.5).astype(float), judge_id="j")
    platt.stderr = [math.inf, math.nan]
    path = tmp_path / "cal.json"
    platt.save(path)

    def refuse(constant):
        raise AssertionError(f"non-strict JSON constant {constant}")

    saved = json.loads(path.read_text(), parse_constant=refuse)
    assert saved["params"]["stderr"] == [None, None]
    loaded = Calibrator.load(path)
    assert all(math.isnan(s) for s in loaded.stderr)
    assert np.allclose(loaded.apply(scores, judge_id="j"), platt.apply(scores, judge_id="j"))
    platt.slope = math.inf
    with pytest.raises(ValueError, match=r"non-finite parameters .* it was not written"):
        platt.save(tmp_path / "diverged.json")
    assert not (tmp_path / "diverged.json").exists() and [p.name for p in tmp_path.iterdir()] == ["cal.json"]


@pytest.mark.parametrize("text, message", [
    ('{\n  "format_version": 1,\n  "n_fit": ' + "9" * 5000 + "\n}", r"cal\.json:3: an integer of 5,000 digits"),
    ("[" * 100_000 + "]" * 100_000, r"cal\.json:1: JSON nested more than 100 levels deep"),
    ('{"format_version": 1, "kind": "platt"}', r"cal\.json: not a calibrator file \(KeyError: 'params'\); fit one"),
    ("[1, 2]", r"cal\.json: not a calibrator file \(AttributeError"),
    # a parameter that passes the digit bound but no float holds, text, ragged knots: each was a traceback
    ('{"format_version": 1, "kind": "platt", "judge_id": "j", "n_fit": 3, "data_sha256": "x", "params": '
     '{"intercept": 1' + "0" * 400 + ', "slope": 1.0, "stderr": [0.0, 0.0]}}', r"\(OverflowError: int too large"),
    ('{"format_version": 1, "kind": "platt", "judge_id": "j", "n_fit": 3, "data_sha256": "x", "params": '
     '{"intercept": "abc", "slope": 1.0, "stderr": [0.0, 0.0]}}', r"\(ValueError: could not convert string"),
    ('{"format_version": 1, "kind": "isotonic", "judge_id": "j", "n_fit": 3, "data_sha256": "x", "params": '
     '{"knots_x": [[1], [2, 3]], "knots_y": [1]}}', r"cal\.json: not a calibrator file \(ValueError: setting an"),
])
def test_a_hostile_calibrator_file_is_one_value_error_naming_it(tmp_path, text, message):
    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as caught:
        Calibrator.load(path)
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=r"^/dev/zero: is a character device, not a regular file"):
        Calibrator.load("/dev/zero")
