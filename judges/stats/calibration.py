"""Calibrators that turn a judge's raw output into a calibrated P(good), bound to one judge.

* `PlattCalibrator`: logistic regression on the judge's logit (fixes leniency and over/under-
  confidence; the default, good from ~300 gold labels).
* `IsotonicCalibrator`: monotone non-parametric map (opt-in, needs ~1000 labels).
* `HierarchicalCalibrator`: slope shared across domains, fitted on rule-verified gold from
  verifiable domains; per-domain intercept refitted on a few soft-domain gold labels, shrunk towards
  the verifiable intercept (partial pooling, as in a hierarchical model).
* `StyleDebiaser`: removes only the judge's *excess* style slope over the gold slope, in logit space,
  with features z-scored within group (e.g. the rollouts of one prompt).

Every calibrator records the `judge_id` it was fitted for (backend identity + prompt hash, say),
the fit's data size and sha256, its parameters and a format version. `apply(..., judge_id=...)`
refuses, with ValueError, to calibrate another judge's outputs: a judge whose model or prompt
changed is a different judge (section 5.5 item 10).

Inputs: `input_space="prob"` means the judge gives probabilities / [0, 1] scores (mapped to logits
after clipping to [1e-6, 1 - 1e-6]); `"logit"` means it gives logits. Outputs are probabilities.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from common.files import parse_json_line, read_user_text, write_text_atomically
from judges.strict_json import all_finite, plain
from judges.stats.inference import brier_score, expected_calibration_error, logistic_fit, logit, sigmoid

FORMAT_VERSION = 1
INPUT_SPACES = ("prob", "logit")
UNCERTAINTY_PARAMS = frozenset({"stderr", "slope_se"})  # not used by apply: unknown (null) when infinite
MAX_FILE_BYTES = 64 << 20  # a calibrator file: an isotonic fit on a million gold pairs is a few MiB


def _to_logit(x: np.ndarray, input_space: str) -> np.ndarray:
    values = np.asarray(x, dtype=float)
    if not np.all(np.isfinite(values)):
        raise ValueError("judge outputs must be finite")
    if input_space == "logit":
        return values
    if np.any((values < 0) | (values > 1)):
        raise ValueError("input_space='prob' needs judge outputs in [0, 1]")
    return logit(values)


def _gold(gold: np.ndarray, n: int, allow_missing: bool = False) -> np.ndarray:
    labels = np.asarray(gold, dtype=float)
    if labels.shape != (n,):
        raise ValueError(f"gold has shape {labels.shape}, expected ({n},)")
    finite = labels[np.isfinite(labels)]
    if (not allow_missing and len(finite) != n) or np.any((finite < 0) | (finite > 1)):
        raise ValueError("gold labels must lie in [0, 1]" + (" (NaN = missing)" if allow_missing else ""))
    return labels


def data_fingerprint(*arrays: Any) -> str:
    """sha256 over the fit data (numbers as float64, anything else as text), to tie a file to its data."""
    digest = hashlib.sha256()
    for array in arrays:
        data = np.asarray(array)
        if data.dtype.kind in "biuf":
            digest.update(np.ascontiguousarray(data, dtype=np.float64).tobytes())
        else:
            digest.update("\x1f".join(map(str, data.ravel().tolist())).encode())
        digest.update(b"\x1e")
    return digest.hexdigest()


class Calibrator:
    """Base class: judge binding, JSON (de)serialisation and files. Subclasses define `kind`,
    `options()`, `params()`, `_load_params()`, `fit(...)` and `apply(...)`."""

    kind: ClassVar[str] = ""
    _kinds: ClassVar[dict[str, type[Calibrator]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Calibrator._kinds[cls.kind] = cls

    def __init__(self) -> None:
        self.judge_id: str | None = None
        self.n_fit = 0
        self.data_sha256 = ""
        self.diagnostics: dict[str, Any] = {}

    def options(self) -> dict[str, Any]:
        """Constructor keyword arguments (what `from_json` passes back to the constructor)."""
        return {}

    def params(self) -> dict[str, Any]:
        """Fitted parameters as JSON-ready values."""
        raise NotImplementedError

    def _load_params(self, params: dict[str, Any]) -> None:
        raise NotImplementedError

    @staticmethod
    def _require_judge_id(judge_id: str) -> None:
        if not isinstance(judge_id, str) or not judge_id:
            raise ValueError("fit needs a non-empty judge_id (e.g. backend identity + prompt hash)")

    def _record_fit(self, judge_id: str, *arrays: Any) -> None:
        self.judge_id = judge_id
        self.n_fit = len(np.asarray(arrays[0]))
        self.data_sha256 = data_fingerprint(*arrays)

    def check_judge(self, judge_id: str) -> None:
        """Raise ValueError unless this calibrator is fitted and was fitted for `judge_id`."""
        if self.judge_id is None:
            raise ValueError(f"{type(self).__name__} is not fitted; call fit(...) first")
        if judge_id != self.judge_id:
            raise ValueError(f"{type(self).__name__} was fitted for judge {self.judge_id!r} and refuses to "
                             f"calibrate judge {judge_id!r}; refit it on that judge's gold labels")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: format version, kind, judge_id, fit size and hash, options, parameters."""
        if self.judge_id is None:
            raise ValueError(f"{type(self).__name__} is not fitted; nothing to serialise")
        return {"format_version": FORMAT_VERSION, "kind": self.kind, "judge_id": self.judge_id,
                "n_fit": self.n_fit, "data_sha256": self.data_sha256, "options": self.options(),
                "params": self.params(), "diagnostics": self.diagnostics}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibrator:
        """Rebuild a calibrator; `Calibrator.from_json` dispatches on `kind`."""
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported calibrator format_version {data.get('format_version')!r} "
                             f"(this code reads {FORMAT_VERSION})")
        kind = data.get("kind")
        target = Calibrator._kinds.get(kind) if cls is Calibrator else cls
        if target is None or target.kind != kind:
            raise ValueError(f"cannot load a calibrator of kind {kind!r} as {cls.__name__}")
        calibrator = target(**data.get("options", {}))
        calibrator._load_params(data["params"])
        calibrator.judge_id, calibrator.n_fit = data["judge_id"], int(data["n_fit"])
        calibrator.data_sha256 = data["data_sha256"]
        calibrator.diagnostics = dict(data.get("diagnostics", {}))
        return calibrator

    def save(self, path: str | Path) -> None:
        """Write `to_json()` to `path` as strict JSON, through a synced temporary file and a rename.

        ValueError (nothing written) when a fitted parameter is not a finite number; a non-finite
        diagnostic or standard error is written as null (read back as NaN).
        """
        data = self.to_json()
        for name in UNCERTAINTY_PARAMS & set(data["params"]):  # an infinite stderr (separated data) is unknown
            data["params"][name] = plain(data["params"][name])
        if not all_finite(data["params"]):
            raise ValueError(f"{type(self).__name__} has non-finite parameters {data['params']!r} (a fit that "
                             "diverged); it was not written")
        data["diagnostics"] = plain(data["diagnostics"])
        write_text_atomically(path, json.dumps(data, indent=2, sort_keys=True, allow_nan=False))

    @classmethod
    def load(cls, path: str | Path) -> Calibrator:
        """Read a file written by `save`; ValueError (one line naming the file) for a file that is not one: a
        FIFO, a device, not UTF-8, not JSON, bounded as every user file (common.files.FileProblem)."""
        text = read_user_text(path, max_bytes=MAX_FILE_BYTES, expected="a calibrator JSON file (`marl judges "
                                                                         "calibrate` writes one)")
        data = parse_json_line(path, 1, text)
        try:
            return cls.from_json(data)
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as error:  # not a calibrator's
            # fields: a parameter that is text, a 400-digit integer (OverflowError as a float), ragged knots
            message = " ".join(str(error).split())[:120]
            raise ValueError(f"{path}: not a calibrator file ({type(error).__name__}: {message}); fit one with "
                             "`marl judges calibrate`") from None


def _check_space(input_space: str) -> str:
    if input_space not in INPUT_SPACES:
        raise ValueError(f"input_space must be one of {INPUT_SPACES}, got {input_space!r}")
    return input_space


def _scores(raw: np.ndarray, calibrated: np.ndarray, gold: np.ndarray, raw_is_probability: bool) -> dict[str, float]:
    """In-sample ECE and Brier after calibration (and before, when the raw output is a probability)."""
    scores = {"ece_after": expected_calibration_error(calibrated, gold),
              "brier_after": brier_score(calibrated, gold)}
    if raw_is_probability:
        scores.update(ece_before=expected_calibration_error(raw, gold), brier_before=brier_score(raw, gold))
    return scores


class PlattCalibrator(Calibrator):
    """P(good) = sigmoid(intercept + slope * judge_logit), fitted by maximum likelihood on gold."""

    kind = "platt"

    def __init__(self, input_space: str = "prob") -> None:
        super().__init__()
        self.input_space = _check_space(input_space)
        self.intercept, self.slope = 0.0, 1.0
        self.stderr = [0.0, 0.0]

    def options(self) -> dict[str, Any]:
        return {"input_space": self.input_space}

    def params(self) -> dict[str, Any]:
        return {"intercept": self.intercept, "slope": self.slope, "stderr": list(self.stderr)}

    def _load_params(self, params: dict[str, Any]) -> None:
        self.intercept, self.slope = float(params["intercept"]), float(params["slope"])
        self.stderr = [float("nan") if s is None else float(s) for s in params["stderr"]]

    def fit(self, x: np.ndarray, gold: np.ndarray, *, judge_id: str,
            weights: np.ndarray | None = None) -> PlattCalibrator:
        """Fit on judge outputs `x` and gold labels in [0, 1]; returns self."""
        self._require_judge_id(judge_id)
        z = _to_logit(x, self.input_space)
        labels = _gold(gold, len(z))
        fit = logistic_fit(z[:, None], labels, weights)
        self.intercept, self.slope = float(fit.coef[0]), float(fit.coef[1])
        self.stderr = [float(s) for s in fit.stderr]
        self._record_fit(judge_id, x, labels)
        self.diagnostics = _scores(np.asarray(x, float), self._transform(z), labels, self.input_space == "prob")
        return self

    def _transform(self, z: np.ndarray) -> np.ndarray:
        return sigmoid(self.intercept + self.slope * z)

    def apply(self, x: np.ndarray, *, judge_id: str) -> np.ndarray:
        """Calibrated P(good) for judge outputs `x` of judge `judge_id`."""
        self.check_judge(judge_id)
        return self._transform(_to_logit(x, self.input_space))


def _pool_adjacent_violators(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted non-decreasing least-squares fit (fallback for scipy < 1.12)."""
    means, weights, sizes = [], [], []
    for value, weight in zip(y.tolist(), w.tolist()):
        means.append(value), weights.append(weight), sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            total = weights[-2] + weights[-1]
            merged = (means[-2] * weights[-2] + means[-1] * weights[-1]) / total
            size = sizes[-2] + sizes[-1]
            del means[-1], weights[-1], sizes[-1]
            means[-1], weights[-1], sizes[-1] = merged, total, size
    return np.repeat(means, sizes)


def isotonic_fit(y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Non-decreasing weighted least-squares fit of `y` (already ordered by the predictor)."""
    try:
        from scipy.optimize import isotonic_regression
    except ImportError:
        return _pool_adjacent_violators(np.asarray(y, float), np.asarray(weights, float))
    return isotonic_regression(y, weights=weights, increasing=True).x


class IsotonicCalibrator(Calibrator):
    """A non-decreasing step map from judge output to P(good) (pool-adjacent-violators), linearly
    interpolated between fitted points and constant beyond them. Works on the raw output scale."""

    kind = "isotonic"

    def __init__(self) -> None:
        super().__init__()
        self.knots_x: np.ndarray = np.zeros(0)
        self.knots_y: np.ndarray = np.zeros(0)

    def params(self) -> dict[str, Any]:
        return {"knots_x": self.knots_x.tolist(), "knots_y": self.knots_y.tolist()}

    def _load_params(self, params: dict[str, Any]) -> None:
        self.knots_x = np.asarray(params["knots_x"], dtype=float)
        self.knots_y = np.asarray(params["knots_y"], dtype=float)

    def fit(self, x: np.ndarray, gold: np.ndarray, *, judge_id: str,
            weights: np.ndarray | None = None) -> IsotonicCalibrator:
        """Fit on judge outputs `x` (any monotone score) and gold labels in [0, 1]; returns self."""
        self._require_judge_id(judge_id)
        values = np.asarray(x, dtype=float)
        labels = _gold(gold, len(values))
        w = np.ones(len(values)) if weights is None else np.asarray(weights, dtype=float)
        unique, inverse = np.unique(values, return_inverse=True)
        tie_weight = np.bincount(inverse, weights=w)
        fitted = isotonic_fit(np.bincount(inverse, weights=w * labels) / tie_weight, tie_weight)
        # Keep only the ends of each constant block: interpolation through them is the same map.
        changes = np.flatnonzero(np.diff(fitted) != 0)
        keep = np.unique(np.concatenate([[0, len(fitted) - 1], changes, changes + 1]))
        self.knots_x, self.knots_y = unique[keep], np.clip(fitted[keep], 0.0, 1.0)
        self._record_fit(judge_id, values, labels)
        is_probability = bool(np.all((values >= 0) & (values <= 1)))
        self.diagnostics = _scores(values, self._transform(values), labels, is_probability)
        return self

    def _transform(self, values: np.ndarray) -> np.ndarray:
        return np.interp(values, self.knots_x, self.knots_y)

    def apply(self, x: np.ndarray, *, judge_id: str) -> np.ndarray:
        """Calibrated P(good) for judge outputs `x` of judge `judge_id`."""
        self.check_judge(judge_id)
        return self._transform(np.asarray(x, dtype=float))


class HierarchicalCalibrator(Calibrator):
    """logit P(good) = intercept[domain] + slope * judge_logit, with the slope shared.

    fit: the slope and one intercept per verifiable domain come from the rule-verified gold; the
    prior intercept is their size-weighted mean; each soft domain's intercept is then refitted on
    its own (few) gold labels with the slope held fixed and a Normal(prior intercept, prior_sd^2)
    prior. A domain without labels gets the prior intercept. The default prior_sd = 2 logits is weak:
    with ~50 labels the intercept's standard error is ~0.3, so shrinkage moves it by ~2%. `diagnostics["leniency_shift"]` gives
    each soft domain's intercept minus the prior with its standard error; `flagged` is True when
    the 95% interval excludes 0 (collect more soft labels before trusting the transfer).
    """

    kind = "hierarchical"

    def __init__(self, input_space: str = "prob", prior_sd: float = 2.0) -> None:
        super().__init__()
        self.input_space = _check_space(input_space)
        if prior_sd <= 0:
            raise ValueError("prior_sd must be positive")
        self.prior_sd = float(prior_sd)
        self.slope, self.slope_se, self.prior_intercept = 1.0, 0.0, 0.0
        self.intercepts: dict[str, float] = {}

    def options(self) -> dict[str, Any]:
        return {"input_space": self.input_space, "prior_sd": self.prior_sd}

    def params(self) -> dict[str, Any]:
        return {"slope": self.slope, "slope_se": self.slope_se, "prior_intercept": self.prior_intercept,
                "intercepts": dict(self.intercepts)}

    def _load_params(self, params: dict[str, Any]) -> None:
        self.slope = float(params["slope"])
        self.slope_se = float("nan") if params["slope_se"] is None else float(params["slope_se"])
        self.prior_intercept = float(params["prior_intercept"])
        self.intercepts = {str(k): float(v) for k, v in params["intercepts"].items()}

    def fit(self, x: np.ndarray, gold: np.ndarray, domains: Sequence[str], *,
            verifiable_domains: Collection[str], judge_id: str) -> HierarchicalCalibrator:
        """Fit on judge outputs, gold labels and each item's domain name; returns self."""
        self._require_judge_id(judge_id)
        z = _to_logit(x, self.input_space)
        labels, names = _gold(gold, len(z)), np.asarray(domains).astype(str)
        if names.shape != z.shape:
            raise ValueError(f"domains has shape {names.shape}, judge outputs {z.shape}")
        verified = np.isin(names, [str(d) for d in verifiable_domains])
        shared = sorted(set(names[verified].tolist()))
        if not shared:
            raise ValueError("no item belongs to a verifiable domain; the shared slope needs rule-verified gold")
        onehot = (names[verified][:, None] == np.array(shared)[None, :]).astype(float)
        fit = logistic_fit(np.column_stack([onehot, z[verified]]), labels[verified], intercept=False)
        self.slope, self.slope_se = float(fit.coef[-1]), float(fit.stderr[-1])
        self.intercepts = dict(zip(shared, map(float, fit.coef[:-1])))
        self.prior_intercept = float(np.average(fit.coef[:-1], weights=onehot.sum(axis=0)))
        self.diagnostics = {"leniency_shift": {}}
        for domain in sorted(set(names[~verified].tolist())):
            self._fit_soft_domain(domain, z[names == domain], labels[names == domain])
        self._record_fit(judge_id, x, labels, names)
        return self

    def _fit_soft_domain(self, domain: str, z: np.ndarray, labels: np.ndarray) -> None:
        fit = logistic_fit(np.ones((len(z), 1)), labels, offset=self.prior_intercept + self.slope * z,
                           intercept=False, l2=np.array([1.0 / self.prior_sd ** 2]))
        shift, se = float(fit.coef[0]), float(fit.stderr[0])
        self.intercepts[domain] = self.prior_intercept + shift
        self.diagnostics["leniency_shift"][domain] = {"shift": shift, "stderr": se, "n": int(len(z)),
                                                      "flagged": bool(abs(shift) > 1.96 * se)}

    def apply(self, x: np.ndarray, domains: Sequence[str], *, judge_id: str) -> np.ndarray:
        """Calibrated P(good); domains never seen at fit time use the prior (verifiable) intercept."""
        self.check_judge(judge_id)
        z = _to_logit(x, self.input_space)
        names = np.asarray(domains).astype(str)
        if names.shape != z.shape:
            raise ValueError(f"domains has shape {names.shape}, judge outputs {z.shape}")
        unique, inverse = np.unique(names, return_inverse=True)
        intercept = np.array([self.intercepts.get(d, self.prior_intercept) for d in unique.tolist()])[inverse]
        return sigmoid(intercept + self.slope * z)


def standardize_features(features: np.ndarray, groups: Sequence[Any] | None = None,
                         center: np.ndarray | None = None, scale: np.ndarray | None = None) -> np.ndarray:
    """z-score the columns of `features` (n, k): within each group when `groups` is given (a
    feature constant within its group gets 0), else with `center`/`scale` (default: the sample's)."""
    data = np.asarray(features, dtype=float)
    data = data.reshape(len(data), -1)
    if groups is None:
        mean = data.mean(axis=0) if center is None else np.asarray(center, float)
        sd = data.std(axis=0) if scale is None else np.asarray(scale, float)
        return np.where(sd > 0, (data - mean) / np.where(sd > 0, sd, 1.0), 0.0)
    _, inverse = np.unique(np.asarray(groups), return_inverse=True)
    size = np.bincount(inverse).astype(float)[:, None]
    sums = np.stack([np.bincount(inverse, weights=column) for column in data.T], axis=1)
    squares = np.stack([np.bincount(inverse, weights=column ** 2) for column in data.T], axis=1)
    mean = sums / size
    sd = np.sqrt(np.clip(squares / size - mean ** 2, 0.0, None))[inverse]
    return np.where(sd > 1e-12, (data - mean[inverse]) / np.where(sd > 1e-12, sd, 1.0), 0.0)


def _ols(design: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares coefficients and their classical standard errors."""
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    dof = max(len(target) - design.shape[1], 1)
    sigma2 = float(np.sum((target - design @ coef) ** 2)) / dof
    return coef, np.sqrt(np.clip(np.diag(np.linalg.pinv(design.T @ design)) * sigma2, 0.0, None))


class StyleDebiaser(Calibrator):
    """Remove the judge's excess style slope over the gold slope: corrected logit =
    judge_logit - sum_k (b_judge[k] - b_gold[k]) * z[k], returned as a probability.

    z are the style features (log length, markdown counts, ...) standardised within group when
    `groups` is given (the rollouts of one prompt, the policies answering one instruction), else
    with the fit sample's mean and sd. b_gold comes from a logistic regression of gold labels on
    [1, z] (items without gold are NaN); b_judge from every item's judge output on [1, z]:

    * "ols_logit" (default): OLS on the judge's logit, i.e. the slope the judge actually applies.
      Exact when gold has no style preference. The gold slope, fitted on binary labels, is a
      marginal slope attenuated by the quality variation it cannot see, so when gold genuinely
      rewards a feature a little of that genuine slope is removed too.
    * "logistic": logistic regression of the judge's probabilities (or hard verdicts), a marginal
      slope like gold's: like is compared with like when judge and gold are about equally
      sensitive to quality; otherwise the judge slope is attenuated and less is removed.

    Observational slopes are confounded when style correlates with quality; probes estimate the
    judge's slope without that confound (see `judges.stats.inference.length_slope`).
    """

    kind = "style"
    SLOPE_METHODS = ("ols_logit", "logistic")

    def __init__(self, feature_names: Sequence[str], input_space: str = "prob",
                 judge_slope_method: str = "ols_logit") -> None:
        super().__init__()
        if judge_slope_method not in self.SLOPE_METHODS:
            raise ValueError(f"judge_slope_method must be one of {self.SLOPE_METHODS}")
        self.feature_names = [str(name) for name in feature_names]
        self.input_space = _check_space(input_space)
        self.judge_slope_method = judge_slope_method
        k = len(self.feature_names)
        self.judge_coef, self.judge_stderr = np.zeros(k), np.zeros(k)
        self.gold_coef, self.gold_stderr = np.zeros(k), np.zeros(k)
        self.center, self.scale, self.grouped = np.zeros(k), np.ones(k), False

    def options(self) -> dict[str, Any]:
        return {"feature_names": list(self.feature_names), "input_space": self.input_space,
                "judge_slope_method": self.judge_slope_method}

    def params(self) -> dict[str, Any]:
        names = ("judge_coef", "judge_stderr", "gold_coef", "gold_stderr", "center", "scale")
        return {**{name: getattr(self, name).tolist() for name in names}, "grouped": self.grouped}

    def _load_params(self, params: dict[str, Any]) -> None:
        for name in ("judge_coef", "judge_stderr", "gold_coef", "gold_stderr", "center", "scale"):
            setattr(self, name, np.asarray(params[name], dtype=float))
        self.grouped = bool(params["grouped"])

    @property
    def excess(self) -> np.ndarray:
        """b_judge - b_gold per feature (logits per within-group sd)."""
        return self.judge_coef - self.gold_coef

    def _features(self, features: np.ndarray, n: int) -> np.ndarray:
        data = np.asarray(features, dtype=float).reshape(n, -1)
        if data.shape[1] != len(self.feature_names) or not np.all(np.isfinite(data)):
            raise ValueError(f"features must be finite with {len(self.feature_names)} columns "
                             f"({self.feature_names}), got shape {data.shape}")
        return data

    def fit(self, judge: np.ndarray, gold: np.ndarray, features: np.ndarray, *, judge_id: str,
            groups: Sequence[Any] | None = None) -> StyleDebiaser:
        """Fit both slopes. judge: every item's judge output; gold: labels in [0, 1], NaN where an item
        has none; features: (n, k) raw style features; groups: optional group id per item."""
        self._require_judge_id(judge_id)
        z_judge = _to_logit(judge, self.input_space)
        labels = _gold(gold, len(z_judge), allow_missing=True)
        data = self._features(features, len(z_judge))
        self.grouped = groups is not None
        self.center, self.scale = data.mean(axis=0), data.std(axis=0)
        z = standardize_features(data, groups, self.center, self.scale)
        design = np.column_stack([np.ones(len(z)), z])
        if self.judge_slope_method == "ols_logit":
            coef, stderr = _ols(design, z_judge)
        else:
            coef, stderr = logistic_fit(z, sigmoid(z_judge))
        self.judge_coef, self.judge_stderr = coef[1:], stderr[1:]
        has_gold = np.isfinite(labels)
        if has_gold.sum() <= z.shape[1] + 1:
            raise ValueError(f"only {int(has_gold.sum())} gold labels; the gold slope needs more")
        gold_fit = logistic_fit(z[has_gold], labels[has_gold])
        self.gold_coef, self.gold_stderr = gold_fit.coef[1:], gold_fit.stderr[1:]
        self._record_fit(judge_id, judge, np.nan_to_num(labels, nan=-1.0), data,
                         [] if groups is None else np.asarray(groups))
        self.diagnostics = {"excess": dict(zip(self.feature_names, self.excess.tolist())),
                            "n_gold": int(has_gold.sum())}
        return self

    def apply(self, judge: np.ndarray, features: np.ndarray, *, judge_id: str,
              groups: Sequence[Any] | None = None) -> np.ndarray:
        """Style-corrected P(judge prefers / passes). Pass `groups` exactly when fit had them."""
        self.check_judge(judge_id)
        z_judge = _to_logit(judge, self.input_space)
        if (groups is not None) != self.grouped:
            raise ValueError("StyleDebiaser was fitted " + ("with" if self.grouped else "without")
                             + " groups; apply must standardise features the same way")
        z = standardize_features(self._features(features, len(z_judge)), groups, self.center, self.scale)
        return sigmoid(z_judge - z @ self.excess)
