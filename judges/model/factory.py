"""Build a model judge from a plain config (a scenario's `judges:` entry), optionally calibrated.

    judge = build_judge({"name": "helpful", "backend": "openai", "model": "gpt-4.1-mini",
                         "base_url": None, "api_key_env": "OPENAI_API_KEY", "mode": "pointwise",
                         "rubric": None, "scale": (1, 10), "calibration": "cal.json",
                         "concurrency": 8, "timeout_s": 60, "verdict": "text"})

`verdict` is `text` (the MT-Bench prompt and its `Rating: [[N]]`, the default, for strong judges) or
`logprobs` (P(Yes) read from one token's probabilities, for small ones: judges.model.verdict); a local
model's tokenizer must spell each label as one token (LabelError, a ValueError, at build time).

Backend `reward_model` is a trained reward model (`marl rm train`): `model` is its directory, and
there is no prompt, rubric or scale (judges.model.reward_model). In a reward layer a judge scores one candidate at a time, so scenarios use `pointwise` judges;
pairwise and listwise judges compare candidates and are used from Python (`judges.model.prompted`).
A calibration file must have been fitted for this very judge (same model, endpoint, prompt and
settings): otherwise building fails, rather than silently applying someone else's correction.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from judges.model.local_backend import LocalBackend
from judges.model.openai_backend import OpenAIBackend
from judges.model.prompted import PointwiseJudge
from judges.model.prompts import DEFAULT_RUBRIC
from judges.model.reward_model import RewardModelJudge
from judges.types import Candidate, Item, Judgment

BACKENDS = ("openai", "local", "simulated", "reward_model")


class CalibratedScorer:
    """A judge whose ok scores pass through a calibrator fitted for it (raw score kept in details)."""

    def __init__(self, judge, calibrator):
        calibrator.check_judge(judge.identity)
        self.judge, self.calibrator = judge, calibrator
        self.name = getattr(judge, "name", "judge")

    @property
    def identity(self) -> str:
        return self.judge.identity

    def score(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        """The judge's judgments with calibrated scores; failures stay failures."""
        judgments = self.judge.score(item, candidates)
        calibrated = []
        for judgment in judgments:
            if not judgment.ok:
                calibrated.append(judgment)
                continue
            value = float(self.calibrator.apply([judgment.score], judge_id=self.judge.identity)[0])
            calibrated.append(Judgment("ok", value, label=judgment.label, probabilities=judgment.probabilities,
                                       rationale=judgment.rationale,
                                       details={**judgment.details, "raw_score": judgment.score},
                                       usage=judgment.usage, latency=judgment.latency, cached=judgment.cached))
        return calibrated


def build_backend(config: dict[str, Any], base_dir: str | Path | None = None, client=None):
    """The chat backend a judge config asks for (the openai client is built only for 'openai')."""
    backend = config.get("backend", "openai")
    if backend == "openai":
        return OpenAIBackend(client, model=config["model"], base_url=config.get("base_url"),
                             api_key_env=config.get("api_key_env") or "OPENAI_API_KEY",
                             max_concurrency=config.get("concurrency", 8), timeout_s=config.get("timeout_s", 60.0),
                             requests_per_second=config.get("requests_per_second"),
                             label=config.get("name"))  # the ledger counts its calls under the judge's name
    if backend == "local":
        path = Path(config["model"])
        return LocalBackend(path if path.is_absolute() or base_dir is None else Path(base_dir) / path)
    if backend == "simulated":
        raise ValueError("the simulated judge needs a quality function: build judges.model.simulated.SimulatedClient "
                         "in Python and pass it as `client` with backend 'openai'")
    raise ValueError(f"unknown judge backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def build_judge(config: dict[str, Any], base_dir: str | Path | None = None, client=None):
    """A pointwise model judge from a config dict (see the module docstring), calibrated if asked."""
    if config.get("mode", "pointwise") != "pointwise":
        raise ValueError(f"judge {config.get('name')!r}: mode {config.get('mode')!r} compares candidates; a reward "
                         "layer scores one candidate at a time, so use mode 'pointwise' there")
    if config.get("backend") == "reward_model":  # a trained scorer, no prompt: its model is a directory
        path = Path(config["model"])
        judge = RewardModelJudge.load(path if path.is_absolute() or base_dir is None else Path(base_dir) / path,
                                      name=config.get("name"), device=config.get("device") or "cpu")
    else:
        judge = PointwiseJudge(build_backend(config, base_dir, client), name=config.get("name"),
                               rubric=config.get("rubric") or DEFAULT_RUBRIC, scale=tuple(config.get("scale", (1, 10))),
                               verdict=config.get("verdict") or "text")
    if not config.get("calibration"):
        return judge
    from judges.stats.calibration import Calibrator

    path = Path(config["calibration"])
    path = path if path.is_absolute() or base_dir is None else Path(base_dir) / path
    return CalibratedScorer(judge, Calibrator.load(path))
