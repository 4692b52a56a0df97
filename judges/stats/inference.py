"""Inference for judge bias and calibration: exact binomial CIs, the position-bias estimator, probe
slopes, a small logistic-regression fitter, calibration error and Dawid-Skene panels.

Estimators with an analytic interval return an `Estimate` (see `judges.stats.agreement` for the
design); pure scores (ECE, Brier) return floats.

Identification: regressing a judge's verdicts on style features with a
*binary gold label* as the quality control is biased (non-collapsibility plus residual quality
confounding). Bias *parameters* must come from designs where quality cancels: both-order verdicts
(`position_bias`) and counterfactual probes whose quality difference is zero by construction
(`length_slope`). GLMs on observational data are for *outcome* debiasing only.

Only numpy at import time; scipy is imported inside the functions that need it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from judges.stats.agreement import Estimate


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    """The logistic function, overflow-free."""
    return np.exp(-np.logaddexp(0.0, -np.asarray(x, dtype=float)))


def logit(p: np.ndarray | float, eps: float = 1e-6) -> np.ndarray:
    """log(p / (1 - p)) after clipping p to [eps, 1 - eps]."""
    q = np.clip(np.asarray(p, dtype=float), eps, 1.0 - eps)
    return np.log(q) - np.log1p(-q)


def _z(level: float) -> float:
    return NormalDist().inv_cdf((1.0 + level) / 2.0)


def _fractions(values: np.ndarray, name: str) -> np.ndarray:
    """Outcomes in [0, 1] (0/1 picks, or probabilities: a quasi-binomial fit), NaN for missing."""
    data = np.asarray(values, dtype=float)
    finite = data[np.isfinite(data)]
    if not np.all((finite >= 0) & (finite <= 1)):
        raise ValueError(f"{name} must hold values in [0, 1] (NaN for missing)")
    return data


def _binary(values: np.ndarray, name: str) -> np.ndarray:
    data = np.asarray(values, dtype=float)
    finite = data[np.isfinite(data)]
    if not np.all((finite == 0) | (finite == 1)):
        raise ValueError(f"{name} must hold 0/1 values (NaN for missing)")
    return data


# ------------------------------------------------------------------------------------ exact binomial CI


def clopper_pearson(successes: int, trials: int, level: float = 0.95) -> Estimate:
    """Exact (Clopper-Pearson) CI for a binomial rate, e.g. a master-key or null-answer false-positive
    rate: conservative, and honest at 0 successes (upper bound 1 - (alpha/2)^(1/n))."""
    from scipy.stats import beta

    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes}/{trials}")
    tail = (1.0 - level) / 2.0
    low = 0.0 if successes == 0 else float(beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta.ppf(1.0 - tail, successes + 1, trials - successes))
    return Estimate(successes / trials, low, high, level, "Clopper-Pearson exact")


def wilson(successes: float, trials: int, level: float = 0.95) -> Estimate:
    """Wilson score CI for a binomial rate, e.g. a judge's accuracy against gold: well behaved at small n
    and at 0 or n successes; `successes` may be fractional (a tie counted half right)."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes}/{trials}")
    z, rate = _z(level), successes / trials
    center = (rate + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(rate * (1 - rate) / trials + z * z / (4 * trials * trials))
    return Estimate(rate, max(center - half, 0.0), min(center + half, 1.0), level, "Wilson score")


# -------------------------------------------------------------------------------------- position bias


@dataclass(frozen=True)
class PositionBias:
    """Position bias from both-order pairwise verdicts.

    bias: p-hat = 1/2 ln(n11 / n00) in logits (slot-1 advantage; 0 = none), delta-method CI.
    flip_rate: share of pairs whose winner changed with the order (n11 + n00) / n, Clopper-Pearson CI.
        NOT the bias: a judge sampled at T > 0 with no position bias still flips ~30% of close pairs.
    first_slot_rate: share of all verdicts that picked slot 1 (0.5 = balanced in aggregate).
    continuity_corrected: True when n11 or n00 was 0 and 0.5 was added to both.
    """

    bias: Estimate
    flip_rate: Estimate
    first_slot_rate: float
    n11: int
    n00: int
    n_pairs: int
    continuity_corrected: bool


def position_bias(slot1_ab: np.ndarray, slot1_ba: np.ndarray, level: float = 0.95) -> PositionBias:
    """Estimate a judge's position bias from both-order verdicts on the same pairs.

    slot1_ab[i] = 1 if the judge picked slot 1 when pair i was shown as (A, B), 0 if slot 2;
    slot1_ba[i] the same for the (B, A) order; NaN (tie, failure) drops the pair.
    Under a logit-additive judge, P(1,1) / P(0,0) = exp(2p) whatever the quality gap, so
    p-hat = 1/2 ln(n11 / n00) needs no gold labels. Var(p-hat) = (1/n11 + 1/n00) / 4 (delta method).
    When n11 or n00 is 0, 0.5 is added to both (Haldane-Anscombe), so the estimate stays finite.
    """
    ab, ba = _binary(slot1_ab, "slot1_ab"), _binary(slot1_ba, "slot1_ba")
    if ab.shape != ba.shape or ab.ndim != 1:
        raise ValueError(f"expected two 1-D arrays of equal length, got {ab.shape} and {ba.shape}")
    keep = np.isfinite(ab) & np.isfinite(ba)
    ab, ba = ab[keep], ba[keep]
    n = len(ab)
    if n == 0:
        raise ValueError("no pair has a verdict in both orders")
    n11, n00 = int(np.sum((ab == 1) & (ba == 1))), int(np.sum((ab == 0) & (ba == 0)))
    corrected = n11 == 0 or n00 == 0
    c11, c00 = (n11 + 0.5, n00 + 0.5) if corrected else (float(n11), float(n00))
    estimate = 0.5 * math.log(c11 / c00)
    half = _z(level) * 0.5 * math.sqrt(1.0 / c11 + 1.0 / c00)
    bias = Estimate(estimate, estimate - half, estimate + half, level, "1/2 ln(n11/n00), delta method")
    return PositionBias(bias=bias, flip_rate=clopper_pearson(n11 + n00, n, level),
                        first_slot_rate=float((ab.sum() + ba.sum()) / (2 * n)),
                        n11=n11, n00=n00, n_pairs=n, continuity_corrected=corrected)


# ----------------------------------------------------------------------------------- logistic regression


class LogisticFit(NamedTuple):
    """Coefficients (intercept first when fitted) and their standard errors from the Fisher information."""

    coef: np.ndarray
    stderr: np.ndarray


def _penalty(l2: float | np.ndarray, n_coef: int, intercept: bool) -> np.ndarray:
    if np.ndim(l2) == 0:
        penalty = np.full(n_coef, float(l2))
        if intercept:
            penalty[0] = 0.0
        return penalty
    penalty = np.asarray(l2, dtype=float)
    if penalty.shape != (n_coef,):
        raise ValueError(f"l2 per coefficient needs {n_coef} entries, got {penalty.shape}")
    return penalty


def _information(design: np.ndarray, w: np.ndarray, mu: np.ndarray, penalty: np.ndarray) -> np.ndarray:
    """Fisher information of the (penalised) logistic log-likelihood: X' diag(w mu (1 - mu)) X + diag(l2)."""
    return (design * (w * mu * (1.0 - mu))[:, None]).T @ design + np.diag(penalty)


def logistic_fit(X: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None, *,
                 offset: np.ndarray | float = 0.0, intercept: bool = True, l2: float | np.ndarray = 0.0,
                 max_iter: int = 100, tol: float = 1e-10) -> LogisticFit:
    """Maximum-likelihood logistic regression by Newton's method with step halving.

    X: (n, k) features; y: (n,) outcomes in [0, 1] (fractional outcomes fit a quasi-binomial model);
    weights: frequency weights; offset: fixed logit added to every row; intercept: prepend a column
    of ones (coef[0]); l2: ridge penalty (a scalar spares the intercept; an array gives one penalty
    per coefficient). stderr = sqrt(diag(H^-1)), H the observed (= expected, canonical link)
    information. Warns when Newton does not converge (e.g. separable data: set l2 > 0).
    """
    features = np.asarray(X, dtype=float).reshape(len(y), -1)
    design = np.column_stack([np.ones(len(features)), features]) if intercept else features
    outcome = np.asarray(y, dtype=float)
    w = np.ones(len(outcome)) if weights is None else np.asarray(weights, dtype=float)
    if np.any((outcome < 0) | (outcome > 1)) or not np.all(np.isfinite(design)):
        raise ValueError("y must lie in [0, 1] and X must be finite")
    base = np.broadcast_to(np.asarray(offset, dtype=float), outcome.shape)
    penalty = _penalty(l2, design.shape[1], intercept)

    def objective(beta: np.ndarray) -> float:
        eta = design @ beta + base
        return float(np.sum(w * (np.logaddexp(0.0, eta) - outcome * eta)) + 0.5 * np.sum(penalty * beta ** 2))

    beta, converged = np.zeros(design.shape[1]), False
    for _ in range(max_iter):
        mu = sigmoid(design @ beta + base)
        gradient = design.T @ (w * (outcome - mu)) - penalty * beta
        step = np.linalg.lstsq(_information(design, w, mu, penalty), gradient, rcond=None)[0]
        current, scale = objective(beta), 1.0
        while objective(beta + scale * step) > current + 1e-12 and scale > 1e-8:
            scale /= 2.0
        beta = beta + scale * step
        if np.max(np.abs(scale * step)) < tol * (1.0 + np.max(np.abs(beta))):
            converged = True
            break
    if not converged:
        warnings.warn("logistic_fit did not converge (separable data? try l2 > 0)", RuntimeWarning, stacklevel=2)
    information = _information(design, w, sigmoid(design @ beta + base), penalty)
    stderr = np.sqrt(np.clip(np.diag(np.linalg.pinv(information)), 0.0, None))
    return LogisticFit(beta, stderr)


# -------------------------------------------------------------------------------------- probe slopes


def _separated(fit: LogisticFit, design: np.ndarray, max_logit: float = 30.0) -> bool:
    """Whether the fit sits at (quasi-)separation: a coefficient whose largest contribution to the logit
    exceeds `max_logit` (P = 1e-13 or closer to 0/1), or a standard error that is not a positive number.
    There the MLE does not exist and Newton stops anywhere along a flat ridge."""
    reach = np.abs(fit.coef) * (np.max(np.abs(design), axis=0) if len(design) else 0.0)
    return bool(np.any(reach > max_logit) or not np.all(np.isfinite(fit.stderr)) or np.any(fit.stderr <= 1e-12))


@dataclass(frozen=True)
class LengthSlope:
    """Judge length slope b (logits per unit of log-length difference) and the position term p."""

    slope: Estimate
    position: Estimate
    n_pairs: int


def length_slope(slot1_padded_first: np.ndarray, slot1_padded_second: np.ndarray,
                 log_length_diff: np.ndarray, level: float = 0.95) -> LengthSlope:
    """Length slope from padding probes judged in both orders (quality difference 0 by construction).

    slot1_padded_first[i]: 1 if the judge picked slot 1 when shown (padded, original) (or the probability
    that it would, for a judge that gives one: a quasi-binomial fit);
    slot1_padded_second[i]: 1 if it picked slot 1 when shown (original, padded);
    log_length_diff[i]: log len(padded) - log len(original).
    Model: logit P(padded preferred) = b * log_length_diff + p * s, s = +1 when the padded answer
    is in slot 1, -1 otherwise; both orders make s balanced so p cannot leak into b.
    CIs from the observed Fisher information. NaN verdicts drop that order's row.
    """
    first = _fractions(slot1_padded_first, "slot1_padded_first")
    second = _fractions(slot1_padded_second, "slot1_padded_second")
    diff = np.asarray(log_length_diff, dtype=float)
    if not first.shape == second.shape == diff.shape:
        raise ValueError("the three arrays must have the same length")
    padded_preferred = np.concatenate([first, 1.0 - second])
    design = np.column_stack([np.concatenate([diff, diff]),
                              np.concatenate([np.ones_like(diff), -np.ones_like(diff)])])
    keep = np.isfinite(padded_preferred)
    if not keep.any():
        raise ValueError("no padding probe has a verdict (every one failed or was a tie)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = logistic_fit(design[keep], padded_preferred[keep], intercept=False)
    diverged = any("did not converge" in str(w.message) for w in caught) or _separated(fit, design[keep])
    # separated verdicts (the padded answer always wins) have no finite MLE: the CI is unbounded, not
    # the (arbitrary) curvature where Newton stopped, which can read as +-0 or +-1e22
    half = np.full(len(fit.coef), math.inf) if diverged else _z(level) * fit.stderr
    method = "padding probe, logistic MLE" + (" (did not converge: separated verdicts)" if diverged else "")
    estimates = [Estimate(float(c), float(c - h), float(c + h), level, method) for c, h in zip(fit.coef, half)]
    return LengthSlope(slope=estimates[0], position=estimates[1], n_pairs=len(diff))


# -------------------------------------------------------------------------------- calibration metrics


def _probabilities(prob: np.ndarray, outcome: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(prob, dtype=float), np.asarray(outcome, dtype=float)
    if p.shape != y.shape or p.ndim != 1 or len(p) == 0:
        raise ValueError(f"expected two non-empty 1-D arrays of equal length, got {p.shape} and {y.shape}")
    if np.any((p < 0) | (p > 1)) or np.any((y < 0) | (y > 1)):
        raise ValueError("probabilities and outcomes must lie in [0, 1]")
    return p, y


def expected_calibration_error(prob: np.ndarray, outcome: np.ndarray, n_bins: int = 10) -> float:
    """ECE with `n_bins` equal-width bins on [0, 1] (1.0 falls in the last bin): the item-weighted
    mean of |mean outcome - mean probability| per bin. Biased upward on small samples."""
    p, y = _probabilities(prob, outcome)
    bins = np.minimum((p * n_bins).astype(int), n_bins - 1)
    counts = np.bincount(bins, minlength=n_bins)
    gap = np.abs(np.bincount(bins, weights=y, minlength=n_bins) - np.bincount(bins, weights=p, minlength=n_bins))
    return float(gap.sum() / counts.sum())


def brier_score(prob: np.ndarray, outcome: np.ndarray) -> float:
    """Mean squared difference between probability and outcome."""
    p, y = _probabilities(prob, outcome)
    return float(np.mean((p - y) ** 2))


# ------------------------------------------------------------------------------------ multi-judge panels


@dataclass(frozen=True)
class DawidSkene:
    """Binary Dawid-Skene fit: per-judge sensitivity P(1 | truth 1) and specificity P(0 | truth 0),
    the prevalence P(truth 1), and each item's posterior P(truth 1 | labels)."""

    sensitivity: np.ndarray
    specificity: np.ndarray
    prevalence: float
    posterior: np.ndarray
    n_iter: int
    converged: bool


def dawid_skene(labels: np.ndarray, *, max_iter: int = 500, tol: float = 1e-8,
                smoothing: float = 0.01) -> DawidSkene:
    """EM for binary labels from several judges, without gold (Dawid & Skene 1979).

    labels: (items, judges) 0/1 with NaN where a judge did not rate an item. Starts from the mean
    vote, so it assumes the panel is better than chance on average (otherwise the labels swap).
    `smoothing` is a pseudo-count keeping rates off 0 and 1.
    """
    data = _binary(labels, "labels")
    if data.ndim != 2 or data.shape[1] < 2:
        raise ValueError(f"expected an items x judges matrix with >= 2 judges, got shape {data.shape}")
    observed = np.isfinite(data)
    votes = np.where(observed, data, 0.0)
    posterior = mean_vote(data)
    posterior = np.where(np.isnan(posterior), 0.5, posterior)
    n_iter, converged = 0, False
    for n_iter in range(1, max_iter + 1):
        prevalence = float(np.clip(posterior.mean(), 1e-6, 1 - 1e-6))
        positive, negative = posterior[:, None] * observed, (1.0 - posterior)[:, None] * observed
        sensitivity = (np.sum(positive * votes, 0) + smoothing) / (positive.sum(0) + 2 * smoothing)
        specificity = (np.sum(negative * (1 - votes), 0) + smoothing) / (negative.sum(0) + 2 * smoothing)
        evidence = (votes * np.log(sensitivity / (1 - specificity))
                    + (1 - votes) * np.log((1 - sensitivity) / specificity)) * observed
        updated = sigmoid(math.log(prevalence / (1 - prevalence)) + evidence.sum(axis=1))
        change, posterior = float(np.max(np.abs(updated - posterior))), updated
        if change < tol:
            converged = True
            break
    return DawidSkene(sensitivity, specificity, float(posterior.mean()), posterior, n_iter, converged)


def mean_vote(labels: np.ndarray) -> np.ndarray:
    """Per-item mean of the judges' labels or scores, ignoring NaN (NaN when nobody rated the item)."""
    data = np.asarray(labels, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(data, axis=1)
