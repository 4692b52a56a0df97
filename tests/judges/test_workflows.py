"""The judges' workflows called from Python (judges.workflows), without the command line: read items, run the
bias report, fit a calibrator, with the simulated judge `marl judges ... --simulated` uses."""

import json
import re

import numpy as np
import pytest

import judges
from judges.model.prompted import PairwiseJudge
from judges.model.openai_backend import OpenAIBackend
from judges.model.simulated import SimulatedClient
from judges.stats.calibration import Calibrator
from judges.types import passed
from judges.workflows import (CalibrationError, CalibrationResult, NoLogprobsError, WorkflowError, calibrate,
                              check_judge, read_items, report, simulated_client, simulated_judge, write_report)
from helpers.judge_items import write_items


@pytest.fixture(scope="module")
def items_file(tmp_path_factory):
    return write_items(tmp_path_factory.mktemp("workflows") / "items.jsonl", 30)


@pytest.fixture(scope="module")
def items(items_file):
    return read_items(items_file)


def test_read_items_gives_report_items_with_their_gold(items, items_file, tmp_path):
    assert len(items) == 30 and items[0].id == "q0" and items[0].gold == 1 and items[1].gold == 0
    assert items[0].candidates == ("Topic 0 is a thing.", "A clear and correct explanation of topic 0.")
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"id": "q0", "gold": 0}) + "\n")
    assert read_items(items_file, gold)[0].gold == 0  # the gold file wins over the item's own label


@pytest.mark.parametrize("text, message", [
    ('{"prompt": "p", "candidates": ["a", "b"]}\n{oops\n', ":2: not valid JSON"),
    ('{"prompt": "p"}\n', ":1: each line needs 'prompt' (a string) and 'candidates'"),
    ('{"prompt": "p", "candidates": ["a"], "gold": "first"}\n', ":1: 'gold' must be a candidate index or a score"),
    ("\n\n", ": no items"),
])
def test_a_bad_items_file_is_one_workflow_error_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "items.jsonl"
    path.write_text(text)
    with pytest.raises(WorkflowError, match="^" + re.escape(str(path) + message)) as caught:
        read_items(path)
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)
    with pytest.raises(WorkflowError, match="missing.jsonl: cannot be read: no such file"):
        read_items(tmp_path / "missing.jsonl")


def test_report_of_a_judge_with_a_master_key_bias_fails_that_threshold(items, tmp_path):
    judge = simulated_judge(items, master_key=5.0)
    result = judges.report(items, judge, per_kind=20, seed=0)
    assert result["n_items"] == 30 and result["n_failed"] == 0 and result["n_calls"] > 0
    assert result["accuracy"]["estimate"] >= 0.9 and not result["accuracy"]["at_chance"]
    assert result["master_key"]["fpr"]["estimate"] > 0.3 and result["verdicts"]["master_key.fpr"] == "fail"
    assert set(result["verdicts"].values()) <= {"pass", "warn", "fail", "not estimated"}
    # the judge's backend counts its calls: the report says what the judgments cost (the first pair included)
    assert result["requests"]["calls"] == result["n_calls"] + 2 and result["requests"]["failures"] == 0
    write_report(result, tmp_path / "deep" / "report.json", markdown=tmp_path / "report.md")
    assert json.loads((tmp_path / "deep" / "report.json").read_text()) == result
    assert "master_key.fpr" in (tmp_path / "report.md").read_text()


def test_report_of_an_unbiased_judge_fails_nothing(items):
    result = report(items, simulated_judge(items), per_kind=20)
    assert "fail" not in result["verdicts"].values() and result["accuracy"]["estimate"] >= 0.9


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_calibrate_fits_a_calibrator_bound_to_the_judge(items, tmp_path, method):
    judge = simulated_judge(items, position=0.6)
    result = judges.calibrate(items, judge, method=method)
    assert isinstance(result, CalibrationResult) and result.method == method and not result.pointwise
    assert result.judge_id == judge.identity == result.calibrator.judge_id
    assert (result.n_items, result.n_fitted, result.n_failed) == (30, 30, 0)
    assert 0.0 <= result.ece_calibrated <= result.ece_raw <= 1.0  # in-sample, the fit cannot be worse
    result.calibrator.save(tmp_path / "cal.json")
    loaded = Calibrator.load(tmp_path / "cal.json")
    assert loaded.kind == method and loaded.judge_id == judge.identity


def test_calibrate_a_pointwise_judge_fits_each_answer_against_its_gold(items):
    class Scorer:  # no backend, like a reward model: scored pointwise, as in a scenario
        identity = "toy-scorer"

        def score(self, item, candidates):
            return [passed(0.9 if c.text.startswith("A clear") else 0.2) for c in candidates]

    result = calibrate(items, Scorer())
    assert result.pointwise and result.judge_id == "toy-scorer"
    assert (result.n_items, result.n_fitted, result.n_failed) == (30, 60, 0)
    assert result.calibrator.apply(np.array([0.9]), judge_id="toy-scorer")[0] > 0.9


def test_calibrate_needs_ten_gold_pairs(items):
    with pytest.raises(WorkflowError, match="^need at least 10 items with 2 candidates and a gold label, got 9$"):
        calibrate(items[:9], simulated_judge(items))


def _failing_judge(items, status=401):
    client = SimulatedClient(lambda text: 0.0, fail=lambda index: status)
    return PairwiseJudge(OpenAIBackend(client, model="sim", max_retries=0))


def test_a_judge_that_cannot_answer_is_one_error_before_the_other_calls(items):
    judge = _failing_judge(items)
    with pytest.raises(WorkflowError, match=r"^cannot judge with model openai:sim@sim://judge-\w+: api_error: "):
        report(items, judge, per_kind=5)
    assert judge.backend.stats["calls"] <= 2  # the first pair only
    with pytest.raises(CalibrationError, match="^only 0 of 30 gold pairs were judged"):
        calibrate(items, _failing_judge(items), check_first=False)


def test_a_logprobs_verdict_without_logprobs_names_the_model(items):
    client = simulated_client(items)
    client.create = _without_logprobs(client.create)
    client.chat.completions.create = client.create
    judge = PairwiseJudge(OpenAIBackend(client, model="small"), verdict="logprobs")
    with pytest.raises(NoLogprobsError, match="answered without logprobs") as caught:
        check_judge(judge, items[0])
    assert caught.value.identity == judge.backend.identity


def _without_logprobs(create):
    async def answer(**request):
        completion = await create(**request)
        for choice in completion.choices:
            choice.logprobs = None
        return completion

    return answer


def test_simulated_client_refuses_an_unknown_bias(items):
    with pytest.raises(ValueError, match="unknown bias 'verbosity'; choose one of position, "):
        simulated_client(items, verbosity=1.0)


@pytest.mark.parametrize("text, message", [
    ('{"prompt": "p", "candidates": ["a", "b"], "gold": 2}\n', ":1: 'gold' must be a candidate index or a score, got "
                                                             "2 (an index from 0 to 1, or the first candidate's score"),
    ('{"prompt": "p", "candidates": ["a", "b"], "gold": 1.5}\n', ":1: 'gold' must be a candidate index or a score"),
    ('{"prompt": "p", "candidates": ["a", "b"], "gold": NaN}\n', ":1: NaN is not a JSON number"),
    ('{"prompt": "p", "candidates": ["a", "b"], "gold": ' + "9" * 5000 + "}\n", ":1: an integer of 5,000 digits"),
    ("[" * 100_000 + "]" * 100_000 + "\n", ":1: JSON nested more than 100 levels deep"),
    ('{"prompt": "p\u2028q", "candidates": ["a", "b"]}\n["x"]\n', ":2: expected a JSON object with prompt and "
                                                              "candidates, got an array"),
])
def test_hostile_items_are_one_workflow_error(tmp_path, text, message):
    path = tmp_path / "items.jsonl"
    path.write_text(text)
    with pytest.raises(WorkflowError) as caught:
        read_items(path)
    assert str(caught.value).startswith(str(path) + message) and "\n" not in str(caught.value), str(caught.value)


def test_items_and_gold_that_are_not_files_are_refused_unread(items_file, tmp_path):
    with pytest.raises(WorkflowError, match=r"^/dev/zero: is a character device, not a regular file"):
        read_items("/dev/zero")
    with pytest.raises(WorkflowError, match=rf"^{re.escape(str(tmp_path))}: is a folder, not a regular file; give a "
                                            r"JSON-lines file \(a JSON object with id and gold per line\)$"):
        read_items(items_file, gold_path=tmp_path)
