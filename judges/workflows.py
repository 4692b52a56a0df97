"""The judges' two workflows as library functions: the bias report and calibration on gold labels.

`marl judges report` and `marl judges calibrate` only parse their options, build the judge, call these
and print; a Python user calls them directly, with any pairwise judge (a `PairwiseJudge` over an
endpoint, a reward model, or the simulated judge below):

    from judges.workflows import calibrate, read_items, report, simulated_judge, write_report

    items = read_items("items.jsonl")                   # ReportItems: prompt, candidates, optional gold
    judge = simulated_judge(items, master_key=5.0)      # or PairwiseJudge(OpenAIBackend(...))
    result = report(items, judge, per_kind=40)          # the strict-JSON report: accuracy, biases, verdicts
    write_report(result, "report.json", markdown="report.md")
    fitted = calibrate(items, judge, method="platt")    # CalibrationResult: the calibrator, ECE raw -> fitted
    fitted.calibrator.save("calibrator.json")

Items file (JSONL), one object per line:
    {"id": "q1", "prompt": "...", "candidates": ["answer 1", "answer 2"], "gold": 0}
`gold` (optional) is the index of the better candidate, or a score in [0, 1] of the first one. A gold
file may instead give {"id": "q1", "gold": 0} lines.

Bad input is a `WorkflowError` (a ValueError, one line: FILE:LINE for a bad items line, the judge's
identity and cause for one that cannot be reached); a calibration with too few judged gold pairs, or
a fit that fails, is a `CalibrationError`.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.files import FileProblem, read_json_objects, write_text_atomically
from judges.model.backend import run_sync
from judges.model.openai_backend import OpenAIBackend
from judges.model.prompted import PairwiseJudge
from judges.model.simulated import SimulatedClient
from judges.model.verdict import NO_LOGPROBS
from judges.types import Candidate, Item

if TYPE_CHECKING:  # imported where used, so that importing this module (the CLI does) loads no numpy
    from judges.stats.bias_report import ReportItem

# the biases a simulated judge may be given: the bias parameters of judges.model.simulated.SimulatedClient
# (its other keywords are the judge's model, not a bias, and the quality function is the items' gold)
SIM_BIASES = ("position", "length_slope", "format_effect", "authority", "self_preference", "master_key", "leniency")
MIN_CALIBRATION_ITEMS = 10
METHODS = ("platt", "isotonic")


class WorkflowError(ValueError):
    """Bad input to a workflow: an unreadable or malformed items file, too few gold items, a judge that
    cannot be reached. The message is one line."""


class NoLogprobsError(WorkflowError):
    """The judge reads its verdict from logprobs and the endpoint answered without them."""

    def __init__(self, identity: str):
        self.identity = identity
        super().__init__(f"model {identity} answered without logprobs, and the logprobs verdict reads them; use "
                         "the text verdict, or an endpoint that returns logprobs (vLLM, SGLang, OpenAI, marl serve)")


class CalibrationError(ValueError):
    """Nothing to fit: too few gold pairs were judged, or the fit itself failed (then its ValueError is the
    cause)."""


# -- items ---------------------------------------------------------------------------------------------------
def read_items(path: str | Path, gold_path: str | Path | None = None) -> list[ReportItem]:
    """The ReportItems of a JSONL items file (gold labels from `gold_path` take precedence over the items' own).

    WorkflowError (FILE:LINE: what is wrong) for an unreadable file, a line that is not a JSON object, an
    item without 'prompt' or 'candidates', a gold that is not a number, or a file without items."""
    from judges.stats.bias_report import ReportItem

    items, golds = [], _read_gold(gold_path) if gold_path else {}
    for number, data in _objects(path, "with prompt and candidates"):
        candidates = data.get("candidates")
        if not isinstance(data.get("prompt"), str) or not isinstance(candidates, list) or not candidates \
                or not all(isinstance(c, str) for c in candidates):
            raise WorkflowError(f"{path}:{number}: each line needs 'prompt' (a string) and 'candidates' "
                                "(a non-empty list of strings)")
        item_id = str(data.get("id", number))
        gold = golds.get(item_id, data.get("gold"))
        if gold is not None and not _gold_fits(gold, len(candidates)):
            raise WorkflowError(f"{path}:{number}: 'gold' must be a candidate index or a score, got {gold!r:.80} "
                                f"(an index from 0 to {len(candidates) - 1}, or the first candidate's score in [0, 1])")
        items.append(ReportItem(id=item_id, prompt=data["prompt"], candidates=tuple(candidates), gold=gold))
    if not items:
        raise WorkflowError(f"{path}: no items (expected one JSON object per line)")
    return items


def _gold_fits(gold, candidates: int) -> bool:
    """A gold label is the index of a candidate (an int) or the first candidate's score in [0, 1] (a float)."""
    if isinstance(gold, bool) or not isinstance(gold, int | float):
        return False
    return 0 <= gold < candidates if isinstance(gold, int) else 0.0 <= gold <= 1.0


def _objects(path, what: str) -> list[tuple[int, dict]]:
    """(line number, object) of a JSON-lines file (common.files.read_json_objects: a regular file, bounded,
    UTF-8, bounded JSON); its FileProblem as a WorkflowError of the same line."""
    try:
        return read_json_objects(path, what=what)
    except FileProblem as problem:
        raise WorkflowError(str(problem)) from None


def _read_gold(path) -> dict:
    golds = {}
    for number, data in _objects(path, "with id and gold"):
        if "id" not in data or "gold" not in data:
            raise WorkflowError(f"{path}:{number}: each gold line needs 'id' and 'gold'")
        golds[str(data["id"])] = data["gold"]
    return golds


# -- the simulated judge ---------------------------------------------------------------------------------------
def simulated_client(items: Sequence[ReportItem], **biases: float):
    """A SimulatedClient whose quality is the items' gold (1 for a gold answer, 0 otherwise), with the named
    biases (`SIM_BIASES`, e.g. position=0.6, master_key=4); ValueError for another name."""
    unknown = sorted(set(biases) - set(SIM_BIASES))
    if unknown:
        raise ValueError(f"unknown bias {unknown[0]!r}; choose one of {', '.join(SIM_BIASES)}")
    best = [i.candidates[i.gold] for i in items if isinstance(i.gold, int) and 0 <= i.gold < len(i.candidates)]
    return SimulatedClient(lambda text: 1.0 if any(b in text for b in best) else 0.0, sharpness=4.0, **biases)


def simulated_judge(items: Sequence[ReportItem], *, cache=None, verdict: str = "text", **biases: float):
    """A both-orders PairwiseJudge over the simulated endpoint of `simulated_client(items, **biases)` (the judge
    `marl judges ... --simulated` uses); `cache` an optional judges.model.cache.JudgeCache."""
    return PairwiseJudge(OpenAIBackend(simulated_client(items, **biases), model="sim", cache=cache), verdict=verdict)


# -- the first pair, judged before the others -----------------------------------------------------------------
def check_judge(judge, item: ReportItem) -> None:
    """Judge `item`'s first pair, so that an unreachable endpoint or a wrong model fails fast with its cause:
    WorkflowError (NoLogprobsError when a logprobs verdict got no logprobs). A judge without a backend (a
    reward model, loaded and checked already) is not asked."""
    if not hasattr(judge, "backend"):
        return
    second = item.candidates[1] if len(item.candidates) > 1 else item.candidates[0]
    pair = run_sync(judge.compare(Item(prompt=item.prompt), Candidate(item.candidates[0]), Candidate(second)))
    if pair.rationale == NO_LOGPROBS:  # the first reply says so: one line, before the other calls
        raise NoLogprobsError(judge.backend.identity)
    answered = pair.rationale.startswith(("invalid response:", "response too large:"))  # reachable: one bad answer
    if pair.p_a is None and pair.status in ("api_error", "timeout") and not answered:
        raise WorkflowError(f"cannot judge with model {judge.backend.identity}: {pair.status}: {pair.rationale}")


# -- the bias report ---------------------------------------------------------------------------------------------
def report(items: Sequence[ReportItem], judge, *, per_kind: int | None = 100, seed: int = 0,
           judge_name: str | None = None, check_first: bool = True) -> dict:
    """Run the bias probes through the pairwise `judge` and return the report (judges.stats.bias_report) as
    strict-JSON data: `accuracy` against gold first (with its CI, and `at_chance`), then position, length,
    format, authority, self_preference, master_key, null_answer and injection, each with a CI, `verdicts`
    (pass / warn / fail / "not estimated"), `n_calls` and `n_failed`; plus `requests` (calls, cache_hits,
    failures, retries) when the judge's backend counts them.

    per_kind: probes per kind; judge_name: the name the self-attribution probe uses; check_first: judge the
    first pair before the rest (`check_judge`), so an unreachable judge is one WorkflowError."""
    from judges.stats.bias_report import run_bias_report, strict_report

    if not items:
        raise WorkflowError("no items to judge")
    if check_first:
        check_judge(judge, items[0])
    options: dict[str, Any] = {"per_kind": per_kind, "seed": seed}
    if judge_name:
        options["judge_name"] = judge_name
    result = strict_report(run_bias_report(judge, items, **options))
    stats = getattr(getattr(judge, "backend", None), "stats", None)
    if isinstance(stats, dict) and "calls" in stats:  # what the judgments cost (n_calls counts judgments)
        result["requests"] = {"calls": stats["calls"], "cache_hits": stats["cache_hits"],
                              "failures": stats["failed"], "retries": stats["retries"]}
    return result


def write_report(result: dict, path: str | Path, markdown: str | Path | None = None) -> None:
    """Write the report as strict JSON (no NaN or Infinity) atomically to `path`, and its markdown summary to
    `markdown` when given; a missing folder is created. OSError when a file cannot be written."""
    from judges.stats.bias_report import report_markdown

    for target in (path, markdown) if markdown else (path,):
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(result, indent=2, allow_nan=False, default=_plain) + "\n")
    if markdown:
        write_text_atomically(markdown, report_markdown(result))


def _plain(value):
    """JSON for what json cannot write itself: numpy scalars and arrays as numbers and lists, else text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


# -- calibration ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CalibrationResult:
    """A calibrator fitted on a judge's answers to gold-labelled pairs, and how well it fits.

    calibrator: the fitted Platt or isotonic calibrator, bound to `judge_id` (save it with `.save(path)`);
    pointwise: fitted on each answer's score against its gold label (a reward model's scenario scores) rather
    than on P(first better) per pair; n_items: the gold items used; n_fitted: the (score, gold) rows fitted;
    n_failed: the pairs (or answers, pointwise) the judge failed; ece_raw and ece_calibrated: the expected
    calibration error before and after, in-sample."""

    calibrator: Any
    method: str
    judge_id: str
    pointwise: bool
    n_items: int
    n_fitted: int
    n_failed: int
    ece_raw: float
    ece_calibrated: float


def calibration_items(items: Sequence[ReportItem]) -> list[ReportItem]:
    """The items a calibration can use: two candidates or more and a gold label; WorkflowError with fewer than
    `MIN_CALIBRATION_ITEMS` of them."""
    usable = [i for i in items if i.gold is not None and len(i.candidates) >= 2]
    if len(usable) < MIN_CALIBRATION_ITEMS:
        raise WorkflowError(f"need at least {MIN_CALIBRATION_ITEMS} items with 2 candidates and a gold label, "
                            f"got {len(usable)}")
    return usable


def calibrate(items: Sequence[ReportItem], judge, *, method: str = "platt", pointwise: bool | None = None,
              check_first: bool = True) -> CalibrationResult:
    """Judge the gold-labelled pairs of `items` and fit a `method` ("platt" or "isotonic") calibrator bound to
    the judge's identity. Nothing is written: save `result.calibrator`.

    pointwise: fit each answer's score against its gold label (1 for the better answer, 0 for the other; a gold
    score g of the first: g and 1 - g), as a reward model scores in a scenario; None: pointwise for a judge
    without a backend (a reward model). check_first: judge the first pair before the rest (`check_judge`).
    WorkflowError for too few gold items or an unreachable judge; CalibrationError when too few pairs were
    judged or the fit fails."""
    import numpy as np

    from judges.stats.calibration import IsotonicCalibrator, PlattCalibrator
    from judges.stats.inference import expected_calibration_error

    if method not in METHODS:
        raise ValueError(f"method {method!r}: choose one of {', '.join(METHODS)}")
    items = calibration_items(items)
    pointwise = not hasattr(judge, "backend") if pointwise is None else pointwise
    if check_first:
        check_judge(judge, items[0])
    rows = _pointwise_rows(judge, items) if pointwise else _pairwise_rows(judge, items)
    if len(rows) < 2 or len({r[1] for r in rows}) < 2:
        raise CalibrationError(f"only {len(rows)} of {len(items)} gold pairs were judged (the rest failed: see the "
                               "endpoint's answers); nothing to fit")  # no cause: the judge's failures, not the fit's
    scores = np.clip(np.array([r[0] for r in rows]), 1e-4, 1 - 1e-4)
    gold = np.array([r[1] for r in rows])
    try:
        with warnings.catch_warnings():  # a near-perfect judge separates the gold labels
            warnings.filterwarnings("ignore", message="logistic_fit did not converge")
            calibrator = (PlattCalibrator() if method == "platt" else IsotonicCalibrator()).fit(
                scores, gold, judge_id=judge.identity)
    except ValueError as error:
        raise CalibrationError(str(error)) from error
    after = calibrator.apply(scores, judge_id=judge.identity)
    raw = np.array([r[0] for r in rows])
    return CalibrationResult(
        calibrator=calibrator, method=method, judge_id=judge.identity, pointwise=pointwise, n_items=len(items),
        n_fitted=len(rows), n_failed=(2 if pointwise else 1) * len(items) - len(rows),
        ece_raw=float(expected_calibration_error(raw, gold)),
        ece_calibrated=float(expected_calibration_error(after, gold)))


def _pairwise_rows(judge, items: list[ReportItem]) -> list[tuple[float, float]]:
    """(P(first better), gold) per judged pair: gold 1 when the first is better, a gold score as given."""
    pairs = run_sync(_compare_items(judge, items))
    return [(p.p_a, 1.0 if i.gold == 0 else float(i.gold) if isinstance(i.gold, float) else 0.0)
            for i, p in zip(items, pairs) if p.p_a is not None]


async def _compare_items(judge, items: list[ReportItem]):
    return await asyncio.gather(*(judge.compare(Item(prompt=i.prompt), Candidate(i.candidates[0]),
                                                Candidate(i.candidates[1])) for i in items))


def _pointwise_rows(judge, items: list[ReportItem]) -> list[tuple[float, float]]:
    """(score, gold) for both answers of every gold item, as the judge scores them in a scenario: gold 1 for
    the better answer and 0 for the other (a gold score g of the first: g and 1 - g)."""
    rows = []
    for item in items:
        first, second = judge.score(Item(prompt=item.prompt), [Candidate(item.candidates[0]),
                                                                Candidate(item.candidates[1])])
        gold = (float(item.gold), 1.0 - float(item.gold)) if isinstance(item.gold, float) else \
            (float(item.gold == 0), float(item.gold == 1))
        rows += [(j.score, g) for j, g in zip((first, second), gold) if j.ok]
    return rows
