"""No data loss (issue 10): real file size limits, read-only directories, killed processes, torn files.

Every case asserts the one line marl prints, its exit status, and that no logged step was lost or
repeated. The runs are the smallest relay runs of tests/integration/test_run.py (a few seconds of training each).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainers.cli.main import main
from helpers.paths import ROOT

SMALL = ["train.prompts_per_step=2", "train.group_size=4", "tasks.count=60", "tasks.eval_count=8",
         "train.warmup.rl_steps=0", "train.checkpoint_every=1"]


def _settings(*extra: str) -> list[str]:
    return [arg for item in SMALL + list(extra) for arg in ("--set", item)]


def _steps(source: Path | str) -> list[int]:
    """The train/step of every line of a metrics.jsonl (a Path) or of its text."""
    text = source.read_text() if isinstance(source, Path) else source
    return [json.loads(line)["train/step"] for line in text.splitlines() if line.strip()]


def _complete_lines(path: Path) -> int:
    """Lines a running process has finished writing (0 before the file exists)."""
    return path.read_text().count("\n") if path.exists() else 0


def _marl(args: list[str], limit: int | None = None, drop_capabilities: bool = False, **popen):
    """`python -m trainers.cli.main ARGS` in a subprocess; `limit` is its RLIMIT_FSIZE (`ulimit -f`) in bytes."""
    def before_exec():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        if drop_capabilities:
            _drop_capabilities()

    command = [sys.executable, "-m", "trainers.cli.main", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=env, preexec_fn=before_exec, **popen)


def _finish(process, timeout: int = 300) -> tuple[int, str]:
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def _here(args: list[str], capsys) -> tuple[int, str]:
    """`main(args)` in this process (a call with no limit to set needs no fresh interpreter): its exit status
    and what it printed, stdout then stderr."""
    capsys.readouterr()
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _drop_capabilities() -> None:
    """Empty the capability bounding set (so exec cannot give root its capabilities back), then
    capset(2) with empty sets: root then obeys file permissions like any user (a no-op for others)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in range(64):
        libc.prctl(24, capability, 0, 0, 0)  # PR_CAPBSET_DROP; EINVAL past the last one, EPERM for non-root
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("marl: error:")]


# make test (--dist loadgroup): this module's tests run on one worker, so three_steps is built once
pytestmark = pytest.mark.xdist_group("data_loss")


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory, demo_model_dir):
    """A finished 3-step relay run (checkpoints step-2 and step-3); tests copy it."""
    out = tmp_path_factory.mktemp("base") / "run"
    assert main(["run", "relay", *_settings("train.steps=3"), "--out", str(out), "--tracker", "none"]) == 0
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


# -- 1. a resume that hits the file size limit while dropping rows past its checkpoint -------------------

TRUNCATE_UNDER_LIMIT = r"""
import json, resource, sys
from pathlib import Path
from trainers.records.report import truncate_metrics, truncate_tables
run = Path(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (2000, resource.RLIM_INFINITY))
for call in (lambda: truncate_metrics(run / "metrics.jsonl", 25), lambda: truncate_tables(run / "tables", 25)):
    try:
        call()
    except OSError as error:
        print("failed:", error)
"""


def test_truncation_under_the_file_size_limit_loses_no_row(tmp_path):
    """The issue's case: the in-place rewrite cut metrics.jsonl, and the next resume lost steps 16-30."""
    (tmp_path / "tables").mkdir()
    rows = "".join(json.dumps({"train/step": step, "pad": "x" * 100}) + "\n" for step in range(1, 31))
    (tmp_path / "metrics.jsonl").write_text(rows)
    table = "".join(json.dumps({"step": step, "pad": "y" * 100}) + "\n" for step in range(1, 31))
    (tmp_path / "tables" / "samples.jsonl").write_text(table)
    result = subprocess.run([sys.executable, "-c", TRUNCATE_UNDER_LIMIT, str(tmp_path)], capture_output=True,
                            text=True, cwd=ROOT, timeout=60)
    assert result.stdout.splitlines() == [
        f"failed: [Errno 27] File too large: '{tmp_path / 'metrics.jsonl'}'",
        f"failed: [Errno 27] File too large: '{tmp_path / 'tables' / 'samples.jsonl'}'"], result.stderr
    assert (tmp_path / "metrics.jsonl").read_text() == rows
    assert (tmp_path / "tables" / "samples.jsonl").read_text() == table
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["metrics.jsonl", "samples.jsonl", "tables"]  # no temp files

    from trainers.records.report import truncate_metrics, truncate_tables

    truncate_metrics(tmp_path / "metrics.jsonl", 25)
    truncate_tables(tmp_path / "tables", 25)
    assert _steps(tmp_path / "metrics.jsonl") == list(range(1, 26))


def _limit_line(out: Path, step: int) -> str:
    return (f"marl: error: cannot write {out / 'metrics.jsonl'}: File too large (stopped at step {step}; nothing "
            "already written is lost, the last complete checkpoint, step-000002, is intact); free some space, raise "
            f"the file size limit (ulimit -f) or make {out} writable, then continue with --resume")


@pytest.mark.slow
def test_ulimit_f_mid_run_and_during_a_resume_stops_with_one_line_and_the_next_resume_loses_nothing(three_steps,
                                                                                                     tmp_path, capsys):
    out = _copy(three_steps, tmp_path)
    shutil.rmtree(out / "checkpoints" / "step-000003")  # killed after step 3 was logged, before its checkpoint
    metrics = out / "metrics.jsonl"
    first_line = len(metrics.read_text().splitlines()[0]) + 1
    args = ["run", "relay", *_settings("train.steps=3"), "--out", str(out), "--tracker", "none", "--resume"]

    code, output = _finish(_marl(args, limit=metrics.stat().st_size - 100))  # room for steps 1-2, not step 3
    assert code == 2 and "Traceback" not in output, output
    assert _error_lines(output) == [_limit_line(out, 3)]  # mid-run: appending step 3 hit the limit
    assert _steps(metrics.read_text().rsplit("\n", 1)[0]) == [1, 2]  # only a torn step-3 line after them
    torn = metrics.read_bytes()

    code, output = _finish(_marl(args, limit=first_line + 10))  # the resume cannot rewrite rows 1-2
    assert code == 2 and "Traceback" not in output, output
    assert _error_lines(output) == [_limit_line(out, 2)]
    assert metrics.read_bytes() == torn  # the old in-place rewrite cut it here, losing rows

    code, output = _here(args, capsys)
    assert code == 0, output
    assert _steps(metrics) == [1, 2, 3]


# -- 2. a run directory with no checkpoint ----------------------------------------------------------------

@pytest.mark.slow
def test_ulimit_f_before_the_first_checkpoint_then_the_advised_resume_starts_again_from_step_0(demo_model_dir,
                                                                                              tmp_path, capsys):
    out = tmp_path / "run"
    args = ["run", "relay", *_settings("train.steps=2"), "--out", str(out), "--tracker", "none"]
    code, output = _finish(_marl(args, limit=1 << 20))  # state.pt (19 MB) cannot be written
    assert code == 2 and "Traceback" not in output, output
    [line] = _error_lines(output)
    assert line.startswith(f"marl: error: could not write checkpoint step-000001 in {out / 'checkpoints'} (")
    assert line.endswith("there is no complete checkpoint yet: free some space and run again with --resume "
                         "(it starts again from step 0)")
    assert _steps(out / "metrics.jsonl") == [1]
    assert not [p for p in (out / "checkpoints").iterdir()]  # the half-written directory is gone

    code, output = _here(args, capsys)  # without --resume: refused, nothing appended
    assert code == 2 and _error_lines(output) == [
        f"marl: error: {out} holds a run that stopped before its first checkpoint (metrics.jsonl, before.json, "
        "warmup.json, checkpoints); pass --resume to start it again from step 0 (those files are replaced) or "
        "--out NEWDIR"]
    assert _steps(out / "metrics.jsonl") == [1]

    code, output = _here(args + ["--resume"], capsys)  # the advice works
    assert code == 0, output
    assert (f"--resume: {out} has no checkpoint (the run stopped before its first one); starting again from step 0, "
            "replacing metrics.jsonl, before.json, warmup.json, checkpoints") in output
    assert _steps(out / "metrics.jsonl") == [1, 2]  # steps 1-2 once each, not 1, 1, 2


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_is_never_appended_to(demo_model_dir, tmp_path):
    out = tmp_path / "run"
    args = ["run", "relay", *_settings("train.steps=400", "train.checkpoint_every=100"), "--out", str(out),
            "--tracker", "none"]
    process = _marl(args)
    metrics = out / "metrics.jsonl"
    while process.poll() is None and _complete_lines(metrics) < 2:
        time.sleep(0.2)  # waits for the event (two logged steps), not for a time
    assert process.poll() is None, process.communicate()[0][-3000:]
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    logged = metrics.read_bytes()  # may end in a line the kill cut short
    assert not (out / "checkpoints").exists() and _complete_lines(metrics) >= 2
    code = main(["run", "relay", *_settings("train.steps=2"), "--out", str(out), "--tracker", "none"])
    assert code == 2 and metrics.read_bytes() == logged  # refused: nothing appended
    assert main(["run", "relay", *_settings("train.steps=2"), "--out", str(out), "--tracker", "none",
                 "--resume"]) == 0
    assert _steps(out / "metrics.jsonl") == [1, 2]


# -- 3. damaged checkpoints ------------------------------------------------------------------------------

def _cut(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    return len(data), len(data) // 2


@pytest.mark.slow
def test_a_truncated_state_pt_is_skipped_for_the_intact_previous_checkpoint(three_steps, tmp_path, capsys):
    out = _copy(three_steps, tmp_path)
    full, cut = _cut(out / "checkpoints" / "step-000003" / "state.pt")
    assert main(["run", "relay", *_settings("train.steps=4"), "--out", str(out), "--tracker", "none",
                 "--resume"]) == 0
    printed = capsys.readouterr().out
    assert (f"checkpoint step-000003 (state.pt is {cut} bytes, the manifest says {full}) is damaged; resuming from "
            "step-000002, the newest intact one") in printed and "Traceback" not in printed
    assert _steps(out / "metrics.jsonl") == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_truncated_model_is_neither_resumed_from_nor_kept_and_eval_says_so(three_steps, tmp_path, capsys):
    from trainers.records.checkpoint import checkpoint_problem

    out = _copy(three_steps, tmp_path)
    model = out / "checkpoints" / "step-000003" / "model" / "model.safetensors"
    full, cut = _cut(model)
    code = main(["eval", "relay", "--checkpoint", str(model.parent.parent), "--set", "tasks.eval_count=8"])
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines() == [
        f"marl: error: checkpoint {model.parent.parent} is damaged: model/model.safetensors is {cut} bytes, the "
        "manifest says {full}; pass an intact checkpoints/step-N directory or the run directory (its newest intact "
        "checkpoint)".replace("{full}", str(full))]
    assert main(["run", "relay", *_settings("train.steps=3"), "--out", str(out), "--tracker", "none",
                 "--resume"]) == 0
    assert "resuming from step-000002, the newest intact one" in capsys.readouterr().out
    assert checkpoint_problem(out / "checkpoints" / "step-000003") is None  # step 3 trained again and rewritten
    assert _steps(out / "metrics.jsonl") == [1, 2, 3]
    assert main(["eval", "relay", "--checkpoint", str(out), "--set", "tasks.eval_count=8"]) == 0


# -- 5. read-only run directories ------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("resume", [False, True], ids=["new-run", "resume"])
def test_a_read_only_run_directory_is_one_line_and_nothing_changes(three_steps, tmp_path, resume):
    out = _copy(three_steps, tmp_path) if resume else tmp_path / "readonly" / "run"
    target = out if resume else out.parent
    target.mkdir(exist_ok=True)
    snapshot = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    target.chmod(0o555)
    try:
        args = ["run", "relay", *_settings("train.steps=4"), "--out", str(out), "--tracker", "none"]
        code, output = _finish(_marl(args + (["--resume"] if resume else []), drop_capabilities=True))
    finally:
        target.chmod(0o755)
    assert code == 2 and "Traceback" not in output, output
    assert _error_lines(output) == [f"marl: error: run directory {out} is not writable (Permission denied); make it "
                                    "writable (chmod u+w) or pass --out with a writable directory"]
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file()} == snapshot


# -- 4. a killed W&B run is continued, not replaced ------------------------------------------------------

@pytest.mark.slow
def test_a_killed_offline_run_is_rebuilt_so_its_wandb_history_equals_metrics_jsonl(demo_model_dir, tmp_path,
                                                                                     monkeypatch):
    """wandb cannot resume an offline run: a resume rebuilds it from metrics.jsonl (cut back to the
    checkpoint) under the same id and removes the killed start's folder, so one `.wandb` log holds
    every step once, with the values metrics.jsonl holds."""
    import wandb
    from helpers.wandb_reader import find_run_logs, read_run

    from trainers.records.checkpoint import latest_checkpoint

    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "run"
    process = _marl(["run", "relay", *_settings("train.steps=400"), "--out", str(out), "--tracker", "wandb"])
    while process.poll() is None and (latest_checkpoint(out, full=False) is None
                                      or _complete_lines(out / "metrics.jsonl") < 3):
        time.sleep(0.2)  # waits for the event itself: a checkpoint and three logged steps
    assert process.poll() is None, process.communicate()[0][-3000:]  # still training when killed
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    stopped = int(latest_checkpoint(out).name.split("-")[1])
    run_id = json.loads((out / "run.json").read_text())["wandb_run_id"]
    assert len(find_run_logs(out / "wandb")) == 1  # the killed start's folder

    assert main(["run", "relay", *_settings(f"train.steps={stopped + 2}"), "--out", str(out), "--tracker", "wandb",
                 "--resume"]) == 0
    wandb.teardown()  # waits for wandb-core to flush the offline log
    state = json.loads((out / "run.json").read_text())
    assert state["wandb_run_id"] == run_id and [start["step"] for start in state["starts"]] == [0, stopped]
    logs = find_run_logs(out / "wandb")
    assert [log.name for log in logs] == [f"run-{run_id}.wandb"]  # the killed start's folder is gone
    run = read_run(logs[0])
    assert run["run"]["id"] == run_id and run["exit_code"] == 0
    assert run["summary"]["resume/from_step"] == stopped
    record = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    history = [row for row in run["history"] if "train/step" in row]
    assert [row["train/step"] for row in record] == list(range(1, stopped + 3))
    assert [row["train/step"] for row in history] == [row["train/step"] for row in record]
    for logged, kept in zip(history, record):  # the same figures (W&B writes NaN where the mirror has null)
        assert {k: v for k, v in logged.items() if k in kept and kept[k] is not None} == \
            {k: v for k, v in kept.items() if v is not None}
