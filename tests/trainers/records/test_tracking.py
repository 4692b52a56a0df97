"""Tracking backends (JSONL, a real offline W&B run read back from disk, no-op) and the run report."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from trainers.records.report import read_metrics, rolling_mean, write_report
from trainers.records.tracking import (JsonlTracker, NullTracker, Tracker, WandbTracker, artifact_name, coerce_cell,
                               make_tracker, resolve_wandb_mode)
from helpers.paths import ROOT

REPO_ROOT = ROOT
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
COLUMNS = ["step", "agent", "completion", "score"]


@pytest.fixture(autouse=True)
def _sandboxed_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Every test: W&B disabled, every W&B dir inside tmp_path, no credentials, settings reset after."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        directory = tmp_path / var.lower()
        directory.mkdir()
        monkeypatch.setenv(var, str(directory))
    yield
    wandb = sys.modules.get("wandb")  # None while a test hides it; absent if never imported
    if wandb is not None:  # wandb.setup() caches env-derived settings per process
        wandb.teardown()


@pytest.fixture
def wandb_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt-in: a real offline run whose `.wandb` log the test reads back."""
    monkeypatch.setenv("WANDB_MODE", "offline")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _log_training(tracker: Tracker, checkpoint: Path) -> None:
    """What a trainer does: train and eval rows with their own step keys, a table, a checkpoint."""
    for step in range(3):
        tracker.log({"train/step": step, "train/reward": step / 2, "credit/solver/share": 0.25 * step})
    tracker.log({"eval/step": 0, "eval/accuracy": 0.75})
    tracker.log_table("samples/completions", COLUMNS, [[2, "solver", "42", 1.0], [2, "critic", "ok", 0.5]])
    tracker.log_table("samples/completions", COLUMNS, [[3, "solver", None, 0.0]])
    tracker.log_artifact(checkpoint, "policy", metadata={"train/step": 2}, aliases=["latest", "step-2"])
    tracker.summary({"final/reward": 1.0})
    tracker.finish()


# --- JSONL ---------------------------------------------------------------------------------------------

def test_jsonl_tracker_writes_metrics_tables_and_summary(tmp_path: Path) -> None:
    tracker = JsonlTracker(tmp_path / "run")
    tracker.log({"train/step": 0, "train/reward": float("nan"), "train/kl": float("inf")})
    tracker.log({"train/step": 1, "train/reward": 0.5})
    tracker.log_table("samples/completions", ["step", "text", "extra"], [[0, "a", None], [1, "b", float("nan")]])
    tracker.log_artifact(tmp_path, "ignored")  # no-op outside W&B
    tracker.summary({"a": 1})
    tracker.summary({"b": float("nan")})
    tracker.finish()

    run = tmp_path / "run"
    assert _jsonl(run / "metrics.jsonl") == [{"train/step": 0, "train/reward": None, "train/kl": None},
                                             {"train/step": 1, "train/reward": 0.5}]
    assert "NaN" not in (run / "metrics.jsonl").read_text()
    assert _jsonl(run / "tables" / "samples__completions.jsonl") == [
        {"step": 0, "text": "a", "extra": "None"}, {"step": 1, "text": "b", "extra": None}]
    assert json.loads((run / "summary.json").read_text()) == {"a": 1, "b": None}


def test_jsonl_table_rejects_ragged_rows(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected 2"):
        JsonlTracker(tmp_path).log_table("t", ["a", "b"], [[1]])


def test_cell_coercion_and_artifact_names() -> None:
    assert [coerce_cell(cell) for cell in ("x", 3, 0.5, None, True, [1])] == ["x", 3, 0.5, "None", "True", "[1]"]
    assert artifact_name("policy/run 1:v") == "policy-run-1-v"
    with pytest.raises(ValueError):
        artifact_name("///")


def test_null_tracker_does_nothing(tmp_path: Path) -> None:
    with make_tracker("none", tmp_path / "run") as tracker:
        assert isinstance(tracker, NullTracker)
        tracker.log({"train/step": 0, "train/reward": 1.0})
        tracker.log_table("t", ["a"], [[1]])
        tracker.summary({"a": 1})
    assert not (tmp_path / "run").exists()


# --- W&B -------------------------------------------------------------------------------------------

def test_wandb_mode_respects_environment() -> None:
    assert resolve_wandb_mode({"WANDB_MODE": "disabled", "WANDB_API_KEY": "k"}) is None
    assert resolve_wandb_mode({"WANDB_API_KEY": "k"}) == "online"
    assert resolve_wandb_mode({}) == "offline"


def test_wandb_offline_run_reads_back_from_disk(wandb_offline: None, tmp_path: Path) -> None:
    from helpers.wandb_reader import read_offline_run, table_rows

    run_dir = tmp_path / "run"
    checkpoint = tmp_path / "policy.bin"
    checkpoint.write_bytes(b"weights")
    tracker = make_tracker("wandb", run_dir, project="marl-test", config={"lr": 1e-6, "group_size": 4},
                           name="unit", group="debate")
    assert isinstance(tracker, WandbTracker)
    _log_training(tracker, checkpoint)
    got, files_dir = read_offline_run(run_dir)

    assert got["run"]["project"] == "marl-test" and got["run"]["name"] == "unit"
    assert got["run"]["group"] == "debate" and got["run"]["job_type"] == "train"
    assert got["config"]["lr"] == 1e-6 and got["config"]["group_size"] == 4
    train = [(row["train/step"], row["train/reward"], row["credit/solver/share"])
             for row in got["history"] if "train/reward" in row]
    assert train == [(0, 0, 0), (1, 0.5, 0.25), (2, 1.0, 0.5)]
    assert [(row["eval/step"], row["eval/accuracy"]) for row in got["history"] if "eval/step" in row] == [(0, 0.75)]
    definitions = {(metric["name"], metric["step_metric"]) for metric in got["metrics"]}
    assert {("train/step", ""), ("train/*", "train/step"), ("eval/*", "eval/step"),
            ("credit/*", "train/step")} <= definitions

    columns, rows = table_rows(got, files_dir, "samples/completions")
    assert columns == COLUMNS
    assert rows == [[2, "solver", "42", 1.0], [2, "critic", "ok", 0.5], [3, "solver", "None", 0.0]]
    assert got["summary"]["samples/completions"]["nrows"] == 3
    assert got["summary"]["final/reward"] == 1.0

    [policy] = [artifact for artifact in got["artifacts"] if artifact["type"] == "model"]
    assert policy["name"] == "policy" and sorted(policy["aliases"]) == ["latest", "step-2"]  # a set in wandb
    assert policy["files"] == ["policy.bin"] and policy["metadata"] == {"train/step": 2}
    _assert_jsonl_mirror_matches(run_dir, got["history"])


def _assert_jsonl_mirror_matches(run_dir: Path, history: list[dict]) -> None:
    """The JSONL mirror holds the same metric rows as W&B (minus wandb's `_` keys and table refs)."""
    logged = [{key: value for key, value in row.items() if not key.startswith("_") and "samples/" not in key}
              for row in history]
    assert [row for row in logged if row] == _jsonl(run_dir / "metrics.jsonl")
    assert len(_jsonl(run_dir / "tables" / "samples__completions.jsonl")) == 3
    assert json.loads((run_dir / "summary.json").read_text()) == {"final/reward": 1.0}


def test_wandb_disabled_by_environment_still_mirrors(tmp_path: Path) -> None:
    checkpoint = tmp_path / "policy.bin"
    checkpoint.write_bytes(b"weights")
    _log_training(make_tracker("wandb", tmp_path / "run"), checkpoint)
    assert not list(tmp_path.rglob("*.wandb"))
    assert len(_jsonl(tmp_path / "run" / "metrics.jsonl")) == 4


# --- errors and import boundary -------------------------------------------------------------------------

def test_make_tracker_rejects_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="wandb, jsonl, none"):
        make_tracker("tensorboard", tmp_path)


def test_make_tracker_explains_missing_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(RuntimeError, match="--tracker jsonl"):
        make_tracker("wandb", tmp_path)


def test_make_tracker_explains_failed_init(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import wandb

    def refuse(**kwargs: object) -> None:
        raise wandb.errors.UsageError("no network")

    monkeypatch.setattr(wandb, "init", refuse)
    with pytest.raises(RuntimeError, match="no network.*--tracker jsonl"):
        make_tracker("wandb", tmp_path)


def test_importing_tracking_and_report_stays_light() -> None:
    code = ("import sys, trainers.records.tracking, trainers.records.report; "
            "heavy = {'wandb', 'matplotlib', 'torch'} & set(sys.modules); assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)


# --- report --------------------------------------------------------------------------------------------

def _synthetic_metrics(run_dir: Path, steps: int = 12) -> None:
    tracker = JsonlTracker(run_dir)
    for step in range(steps):
        tracker.log({"train/step": step, "train/reward": step / steps, "train/team_success": float(step % 2),
                     "train/agent/solver/reward": 0.1 * step, "train/agent/critic/reward": 0.05 * step,
                     "guard/self_bleu": 0.9 - 0.02 * step, "bucket/0/pass_rate": 0.5, "bucket/10/pass_rate": 0.1,
                     "bucket/2/pass_rate": float("nan") if step == 3 else 0.2,
                     "credit/solver/share": 0.6, "credit/critic/share": 0.4, "train/kl": 0.01 * step})
    tracker.log({"eval/step": 0, "eval/accuracy": 0.5})  # no train/step: ignored by the report


def test_report_writes_plots_and_markdown(tmp_path: Path) -> None:
    _synthetic_metrics(tmp_path)
    report = write_report(tmp_path, title="Synthetic", before={"greedy": 0.25, "sampled": 0.2},
                          after={"greedy": 0.5, "sampled": 0.3})
    text = report.read_text()
    expected = ["reward.png", "self_bleu.png", "pass_rate.png", "credit.png", "kl.png"]
    for name in expected:
        png = tmp_path / "plots" / name
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 1000
        assert f"](plots/{name})" in text
    assert text.startswith("# Synthetic") and "logged steps: 12" in text
    assert "| `train/reward` | 0.1667 | 0.75 | +0.5833 |" in text
    assert "| greedy | 0.25 | 0.5 | +0.25 |" in text


def test_report_skips_missing_keys(tmp_path: Path) -> None:
    with (tmp_path / "metrics.jsonl").open("w") as handle:
        for step in range(3):
            handle.write(json.dumps({"train/step": step, "train/reward": float("nan") if step else 1.0}) + "\n")
        handle.write('{"train/step": 3, "train/rew')  # torn last line of a crashed run
    text = write_report(tmp_path).read_text()
    assert [path.name for path in (tmp_path / "plots").iterdir()] == ["reward.png"]
    assert "plots/reward.png" in text and "kl.png" not in text and "Held-out" not in text
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 3


def test_report_needs_metrics(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        write_report(tmp_path)


def test_rolling_mean() -> None:
    assert rolling_mean([1.0, 3.0, 5.0], window=2) == [1.0, 2.0, 4.0]
    assert all(math.isclose(a, b) for a, b in zip(rolling_mean([2.0] * 7), [2.0] * 7))


def test_a_run_id_continues_the_same_wandb_run_and_marks_the_resume(wandb_offline: None, tmp_path: Path) -> None:
    import wandb
    from helpers.wandb_reader import find_run_logs, read_run

    from trainers.records.rundir import wandb_run_id

    run_dir = tmp_path / "run"
    run_id = wandb_run_id(run_dir, 0)
    first = make_tracker("wandb", run_dir, project="marl-test", name="unit", run_id=run_id)
    first.log({"train/step": 1, "train/reward": 0.5})
    first.finish(exit_code=1)  # an interrupted part
    assert wandb_run_id(run_dir, 1) == run_id
    second = make_tracker("wandb", run_dir, project="marl-test", name="unit", run_id=run_id, resumed_at=1)
    second.log({"train/step": 2, "train/reward": 1.0})
    second.finish()
    wandb.teardown()
    parts = [read_run(log) for log in find_run_logs(run_dir)]
    assert [part["run"]["id"] for part in parts] == [run_id, run_id]
    assert [part["exit_code"] for part in parts] == [1, 0]
    assert [[row["train/step"] for row in part["history"]] for part in parts] == [[1], [2]]
    assert "resume/from_step" not in parts[0]["summary"] and parts[1]["summary"]["resume/from_step"] == 1
    state = json.loads((run_dir / "run.json").read_text())
    assert [start["step"] for start in state["starts"]] == [0, 1]


def test_an_offline_resume_rebuilds_one_run_equal_to_the_mirror(wandb_offline: None, tmp_path: Path) -> None:
    """wandb cannot resume offline (every start a new folder, `_step` from 0): `run_tracker` at a
    resume logs the mirror's record (cut back to the checkpoint) into the new run, tables included,
    and removes the older folder, so syncing uploads the run's record once."""
    import wandb
    from helpers.wandb_reader import find_run_logs, read_run

    from trainers.records.report import truncate_metrics, truncate_tables
    from trainers.records.tracking import run_tracker

    run_dir = tmp_path / "run"
    first = run_tracker("wandb", run_dir, 0, config={"lr": 1}, group="unit", project="marl-test")
    for step in (1, 2, 3):  # step 3 is logged, then the process dies before its checkpoint
        first.log({"train/step": step, "train/reward": step / 10})
        first.log_table("samples", ["step", "message"], [[step, f"said {step}"]])
    first.finish(exit_code=1)
    truncate_metrics(run_dir / "metrics.jsonl", 2)  # what `marl run --resume` does at checkpoint 2
    truncate_tables(run_dir / "tables", 2)
    second = run_tracker("wandb", run_dir, 2, config={"lr": 1}, group="unit", project="marl-test")
    second.log({"train/step": 3, "train/reward": 0.75})
    second.log_table("samples", ["step", "message"], [[3, "said 3 again"]])
    second.finish()
    wandb.teardown()
    logs = find_run_logs(run_dir)
    assert len(logs) == 1 and len(list((run_dir / "wandb").glob("offline-run-*"))) == 1
    run = read_run(logs[0])
    rows = [row for row in run["history"] if "train/step" in row]
    assert [(row["train/step"], row["train/reward"]) for row in rows] == [(1, 0.1), (2, 0.2), (3, 0.75)]
    assert [row["train/step"] for row in _jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3]
    assert sum("samples" in row for row in run["history"]) == 3  # one table log per step, none repeated
    assert run["summary"]["resume/from_step"] == 2 and run["exit_code"] == 0
