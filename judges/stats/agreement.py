"""Agreement statistics between judges, humans and rule verifiers, with bootstrap CIs.

Design (one rule for the whole `judges.stats_*` pair of modules):

* Agreement statistics (`cohen_kappa`, `fleiss_kappa`, `krippendorff_alpha`, `spearman`, `kendall_tau`,
  `accuracy`) return a plain float: they are cheap, composable and used inside bootstrap loops.
  Their confidence interval comes from `bootstrap_ci(statistic, *arrays, ...)`, or all at once from
  `agreement(...)`, which return an `Estimate`.
* Estimators whose interval is analytic (Clopper-Pearson, the position-bias estimator, probe slopes
  in `judges.stats.inference`) return an `Estimate` directly.

Conventions:

* Malformed input (empty, mismatched lengths, labels outside `labels`, no pairable unit) raises
  ValueError with a message saying what is wrong.
* A chance-corrected statistic is *undefined* when the expected disagreement is zero (every rating
  falls in one category: the kappa paradox taken to its limit). It then returns NaN, as scikit-learn
  does, rather than raising: one degenerate bootstrap replicate must not abort a report.
* Missing ratings are NaN (or None in object arrays); only `krippendorff_alpha` accepts them.

Only numpy at import time; scipy is imported inside the functions that need it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

WEIGHTS = (None, "linear", "quadratic")
ALPHA_LEVELS = ("nominal", "ordinal", "interval", "ratio")


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a two-sided confidence interval at `level`; `method` says how it was made."""

    estimate: float
    ci_low: float
    ci_high: float
    level: float = 0.95
    method: str = ""

    def contains(self, value: float) -> bool:
        """True when `value` lies inside the closed interval."""
        return self.ci_low <= value <= self.ci_high

    @property
    def width(self) -> float:
        """ci_high - ci_low."""
        return self.ci_high - self.ci_low

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


# ---------------------------------------------------------------------------------------------- helpers


def _paired(rater_a: Sequence[Any], rater_b: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(rater_a), np.asarray(rater_b)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"expected two 1-D label arrays, got shapes {a.shape} and {b.shape}")
    if len(a) != len(b):
        raise ValueError(f"the two raters rated different numbers of items ({len(a)} vs {len(b)})")
    if len(a) == 0:
        raise ValueError("no items to compare")
    return a, b


def _encode(values: np.ndarray, labels: Sequence[Any] | None) -> tuple[np.ndarray, int]:
    """Category indices of `values` (sorted unique order, or the order of `labels`) and the category count."""
    if labels is None:
        categories, codes = np.unique(values, return_inverse=True)
        return codes.reshape(values.shape), len(categories)
    index = {label: i for i, label in enumerate(labels)}
    if len(index) != len(labels):
        raise ValueError(f"labels contain duplicates: {list(labels)}")
    unknown = {v for v in values.tolist() if v not in index}
    if unknown:
        raise ValueError(f"values {sorted(map(str, unknown))} are not among labels {list(labels)}")
    return np.array([index[v] for v in values.tolist()], dtype=int).reshape(values.shape), len(index)


def _is_missing(data: np.ndarray) -> np.ndarray:
    if data.dtype.kind == "f":
        return np.isnan(data)
    if data.dtype.kind == "O":
        return np.array([v is None or (isinstance(v, float) and math.isnan(v)) for v in data.ravel()],
                        dtype=bool).reshape(data.shape)
    return np.zeros(data.shape, dtype=bool)


# ------------------------------------------------------------------------------------ pairwise statistics


def accuracy(rater_a: Sequence[Any], rater_b: Sequence[Any]) -> float:
    """Fraction of items on which the two raters give the same label (always report a kappa next to it)."""
    a, b = _paired(rater_a, rater_b)
    return float(np.mean(a == b))


def cohen_kappa(rater_a: Sequence[Any], rater_b: Sequence[Any], *, weights: str | None = None,
                labels: Sequence[Any] | None = None) -> float:
    """Cohen's kappa between two raters; `weights` None, "linear" or "quadratic" (ordinal scores).

    Categories are the sorted union of observed labels, or `labels` in the given order (the order
    defines the distance for weighted kappa: |i - j| or (i - j)^2 between category positions, as in
    scikit-learn). NaN when chance agreement is 1 (both raters used a single category).
    """
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    a, b = _paired(rater_a, rater_b)
    codes, k = _encode(np.concatenate([a, b]), labels)
    ia, ib = codes[: len(a)], codes[len(a):]
    observed = np.bincount(ia * k + ib, minlength=k * k).reshape(k, k).astype(float)
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0)) / observed.sum()
    positions = np.arange(k)
    distance = np.abs(positions[:, None] - positions[None, :]).astype(float)
    weight = {None: (distance > 0).astype(float), "linear": distance, "quadratic": distance ** 2}[weights]
    expected_disagreement = float(np.sum(weight * expected))
    if expected_disagreement == 0.0:
        return math.nan
    return 1.0 - float(np.sum(weight * observed)) / expected_disagreement


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (scipy); NaN when either input is constant."""
    from scipy import stats

    a, b = _paired(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.spearmanr(a, b).statistic)


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (tie-corrected; scipy); NaN when either input is constant."""
    from scipy import stats

    a, b = _paired(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.kendalltau(a, b, variant="b").statistic)


# ---------------------------------------------------------------------------------- many-rater statistics


def fleiss_kappa_counts(counts: np.ndarray) -> float:
    """Fleiss' kappa from an items x categories table of how many raters chose each category.

    Every row must sum to the same number of raters n >= 2 (use `krippendorff_alpha` when ratings
    are missing). NaN when every rating falls in one category.
    """
    table = np.asarray(counts, dtype=float)
    if table.ndim != 2 or table.shape[0] == 0:
        raise ValueError(f"expected a non-empty items x categories table, got shape {table.shape}")
    raters = table.sum(axis=1)
    if np.any(table < 0) or not np.all(raters == raters[0]) or raters[0] < 2:
        raise ValueError("every item needs the same number (>= 2) of non-negative ratings")
    n = raters[0]
    per_item = (np.sum(table ** 2, axis=1) - n) / (n * (n - 1))
    shares = table.sum(axis=0) / table.sum()
    chance = float(np.sum(shares ** 2))
    if chance == 1.0:
        return math.nan
    return (float(per_item.mean()) - chance) / (1.0 - chance)


def fleiss_kappa(ratings: np.ndarray, *, labels: Sequence[Any] | None = None) -> float:
    """Fleiss' kappa from an items x raters matrix of labels (no missing ratings).

    With two raters this is Scott's pi.
    """
    data = np.asarray(ratings)
    if data.ndim != 2 or data.size == 0:
        raise ValueError(f"expected a non-empty items x raters matrix, got shape {data.shape}")
    if _is_missing(data).any():
        raise ValueError("Fleiss' kappa needs every rater on every item; use krippendorff_alpha for missing data")
    codes, k = _encode(data, labels)
    counts = np.stack([np.sum(codes == c, axis=1) for c in range(k)], axis=1)
    return fleiss_kappa_counts(counts)


def _alpha_distances(values: np.ndarray, marginals: np.ndarray, level: str) -> np.ndarray:
    """Squared distance delta^2 between every pair of values (Krippendorff 2011, section E)."""
    if level == "nominal":
        return 1.0 - np.eye(len(values))
    if level == "interval":
        return (values[:, None] - values[None, :]) ** 2
    if level == "ratio":
        total = values[:, None] + values[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(total == 0, 0.0, ((values[:, None] - values[None, :]) / total) ** 2)
    # ordinal: the mass of values between c and k (inclusive), minus half of the two endpoints.
    cumulative = np.concatenate([[0.0], np.cumsum(marginals)])
    low = np.minimum.outer(np.arange(len(values)), np.arange(len(values)))
    high = np.maximum.outer(np.arange(len(values)), np.arange(len(values)))
    between = cumulative[high + 1] - cumulative[low]
    return (between - (marginals[low] + marginals[high]) / 2.0) ** 2


def krippendorff_alpha(reliability_data: np.ndarray, *, level: str = "nominal") -> float:
    """Krippendorff's alpha for a raters x units matrix (the `krippendorff` package's layout).

    Missing ratings are NaN (or None in object arrays); units with fewer than two ratings are not
    pairable and drop out. `level`: nominal, ordinal, interval or ratio (the last three need numbers,
    ordered by value). NaN when all pairable ratings share one value (no expected disagreement).
    """
    if level not in ALPHA_LEVELS:
        raise ValueError(f"level must be one of {ALPHA_LEVELS}, got {level!r}")
    data = np.asarray(reliability_data)
    if data.ndim != 2 or data.size == 0:
        raise ValueError(f"expected a non-empty raters x units matrix, got shape {data.shape}")
    present = ~_is_missing(data)
    observed = data[present].astype(str if level == "nominal" else float)
    values, codes = np.unique(observed, return_inverse=True)
    unit_of = np.broadcast_to(np.arange(data.shape[1]), data.shape)[present]
    counts = np.zeros((data.shape[1], len(values)))
    np.add.at(counts, (unit_of, codes), 1.0)
    pairable = counts.sum(axis=1)
    counts = counts[pairable >= 2]
    if len(counts) == 0:
        raise ValueError("no unit has two or more ratings; alpha is not defined")
    scaled = counts / (counts.sum(axis=1, keepdims=True) - 1.0)
    coincidences = scaled.T @ counts - np.diag(scaled.sum(axis=0))
    marginals = coincidences.sum(axis=0)
    total = marginals.sum()
    numeric = values.astype(float) if level != "nominal" else np.arange(len(values), dtype=float)
    distance = _alpha_distances(numeric, marginals, level)
    expected = float(np.sum(np.outer(marginals, marginals) * distance)) / (total - 1.0)
    if expected == 0.0:
        return math.nan
    return 1.0 - float(np.sum(coincidences * distance)) / expected


# --------------------------------------------------------------------------------------------- bootstrap


def bootstrap_indices(n: int, n_boot: int, seed: int = 0,
                      clusters: Sequence[Any] | None = None) -> Iterator[np.ndarray]:
    """Yield `n_boot` resampled index arrays over n items.

    With `clusters` (one id per item: prompt, task, pair) whole clusters are resampled with
    replacement and all their items kept together: both orders and all group members share a
    prompt, so resampling judgments would understate the variance.
    """
    rng = np.random.default_rng(seed)
    if clusters is None:
        for _ in range(n_boot):
            yield rng.integers(0, n, n)
        return
    ids = np.asarray(clusters)
    if len(ids) != n:
        raise ValueError(f"clusters has {len(ids)} entries for {n} items")
    _, inverse = np.unique(ids, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    sizes = np.bincount(inverse)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    for _ in range(n_boot):
        pick = rng.integers(0, len(sizes), len(sizes))
        picked_sizes = sizes[pick]
        run_starts = np.repeat(starts[pick] - np.cumsum(picked_sizes) + picked_sizes, picked_sizes)
        yield order[run_starts + np.arange(picked_sizes.sum())]


def _percentile_estimate(point: float, replicates: np.ndarray, level: float, method: str) -> Estimate:
    finite = replicates[np.isfinite(replicates)]
    if len(finite) < len(replicates) / 2:  # mostly degenerate resamples: no honest interval
        return Estimate(point, math.nan, math.nan, level, method)
    low, high = np.quantile(finite, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return Estimate(point, float(low), float(high), level, method)


def bootstrap_ci(statistic: Callable[..., float], *arrays: Sequence[Any], n_boot: int = 1000,
                 level: float = 0.95, seed: int = 0, clusters: Sequence[Any] | None = None) -> Estimate:
    """Percentile-bootstrap CI of `statistic(*arrays)`, resampling items along axis 0 of every array.

    NaN replicates (degenerate resamples) are dropped; if more than half are NaN the CI is NaN.
    Seeded, so the same call gives the same interval. For a raters x units matrix (Krippendorff's
    layout) pass `data.T` and transpose back inside `statistic`.
    """
    data = [np.asarray(a) for a in arrays]
    n = len(data[0])
    if any(len(a) != n for a in data):
        raise ValueError("all arrays must have the same length along axis 0")
    point = float(statistic(*data))
    replicates = np.array([statistic(*(a[idx] for a in data))
                           for idx in bootstrap_indices(n, n_boot, seed, clusters)], dtype=float)
    tag = "cluster " if clusters is not None else ""
    return _percentile_estimate(point, replicates, level, f"{tag}percentile bootstrap, B={n_boot}")


def _alpha_of_pair(level: str) -> Callable[[np.ndarray, np.ndarray], float]:
    return lambda a, b: krippendorff_alpha(np.vstack([a, b]), level=level)


AGREEMENT_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "cohen": cohen_kappa,
    "cohen_linear": lambda a, b: cohen_kappa(a, b, weights="linear"),
    "cohen_quadratic": lambda a, b: cohen_kappa(a, b, weights="quadratic"),
    "spearman": spearman,
    "kendall": kendall_tau,
    "alpha_nominal": _alpha_of_pair("nominal"),
    "alpha_ordinal": _alpha_of_pair("ordinal"),
    "alpha_interval": _alpha_of_pair("interval"),
}


def agreement(judge: Sequence[Any], gold: Sequence[Any], *, metrics: Sequence[str] = ("accuracy", "cohen"),
              level: float = 0.95, n_boot: int = 1000, seed: int = 0,
              clusters: Sequence[Any] | None = None) -> dict[str, Estimate]:
    """Several agreement metrics (names in AGREEMENT_METRICS) between judge and gold labels, each with
    a percentile-bootstrap CI; all metrics share the same resamples. Pass `clusters` (e.g. prompt ids)
    for a cluster bootstrap. The alpha metrics need numeric labels (NaN = missing)."""
    unknown = [m for m in metrics if m not in AGREEMENT_METRICS]
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; choose from {sorted(AGREEMENT_METRICS)}")
    a, b = _paired(judge, gold)
    functions = [AGREEMENT_METRICS[m] for m in metrics]
    points = [float(f(a, b)) for f in functions]
    replicates = np.array([[f(a[idx], b[idx]) for f in functions]
                           for idx in bootstrap_indices(len(a), n_boot, seed, clusters)], dtype=float)
    tag = "cluster " if clusters is not None else ""
    method = f"{tag}percentile bootstrap, B={n_boot}"
    return {m: _percentile_estimate(points[i], replicates[:, i], level, method) for i, m in enumerate(metrics)}
