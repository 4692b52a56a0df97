"""The `marl` command: clear errors without tracebacks, and the demo run end to end with resume.

Most calls run `trainers.cli.main.main` in this process (helpers.inprocess); a fresh interpreter is kept
where the process is the point: the module run as a program, an offline W&B run (its service process and
global state), and Ctrl-C."""

import json
import os
import subprocess
import sys

import pytest

from helpers.inprocess import marl_in_process


def _marl(*args, cwd=None, wandb_home=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    if wandb_home is not None:  # keep W&B's own config, cache and staging inside the test's directory
        env.update({var: str(wandb_home / var.lower()) for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR",
                                                                   "WANDB_DATA_DIR")})
    return subprocess.run([sys.executable, "-m", "trainers.cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


@pytest.mark.parametrize("args,message", [
    (["--set", "train.nope=1"], "train.nope: unknown key 'nope'"),
    (["--set", "train.lr=fast"], "train.lr: Input should be a valid number"),
    (["--set", "train.loss_type=ppo"], "train.loss_type: Input should be 'dapo', 'grpo', 'dr_grpo' or 'bnpo'"),
    (["--set", "train.group_size=1"], "train.group_size: Input should be greater than or equal to 2"),
    (["--set", "lr"], "expected KEY=VALUE"),
    (["--model", "/nonexistent/model"], "train.model: /nonexistent/model is not a directory; pass a directory "
                                        "written by"),
])
def test_bad_input_is_one_clear_line_and_exit_2(args, message, tmp_path):
    result = marl_in_process("demo", "--out", str(tmp_path / "run"), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_python_m_marl_reports_bad_input_in_one_line_end_to_end(tmp_path):
    """The module run as a program (what the console script does): exit status 2 from sys.exit, one line."""
    result = _marl("demo", "--out", str(tmp_path / "run"), "--set", "lr")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "expected KEY=VALUE" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_demo_runs_end_to_end_and_resumes_without_repeating_steps(demo_model_dir, tmp_path):
    out = tmp_path / "run"
    # a fresh interpreter for the one call that opens a W&B run (its service process and global settings)
    first = _marl("demo", "--out", str(out), "--steps", "2", "--set", "train.checkpoint_every=1",
                  "--set", "tasks.eval_count=16", wandb_home=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "held-out team success before" in first.stdout and "held-out team success after" in first.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and 0 <= summary["after"]["team_success"] <= 1
    assert "![Reward and team success](plots/reward.png)" in (out / "report.md").read_text()
    assert (out / "plots" / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list(out.glob("wandb/offline-run-*/run-*.wandb"))) == 1  # an offline W&B run, no key needed

    same = ["--set", "train.checkpoint_every=1", "--set", "tasks.eval_count=16"]
    again = marl_in_process("demo", "--out", str(out), "--steps", "2", *same)
    assert again.returncode == 2 and "--resume" in again.stderr  # nothing already written is lost
    metrics = (out / "metrics.jsonl").read_bytes()
    changed = marl_in_process("demo", "--out", str(out), "--steps", "4", "--resume", "--set", "train.lr=0.5",
                              *same, "--tracker", "jsonl")
    assert changed.returncode == 2 and "Traceback" not in changed.stderr, changed.stderr
    assert len(changed.stderr.strip().splitlines()) == 1 and "different config" in changed.stderr
    assert (out / "metrics.jsonl").read_bytes() == metrics

    resumed = marl_in_process("demo", "--out", str(out), "--steps", "4", "--resume", *same, "--tracker", "jsonl")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    steps = [json.loads(line)["train/step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


@pytest.mark.slow
def test_ctrl_c_writes_a_checkpoint_and_resume_finishes_the_run(demo_model_dir, tmp_path):
    import signal

    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "trainers.cli.main", "demo", "--out", str(out), "--steps", "400",
                                "--tracker", "jsonl"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in process.stdout:  # the progress line for step 5 means training is under way
        if "step 5/400" in line:
            process.send_signal(signal.SIGINT)
            break
    rest, errors = process.communicate(timeout=120)
    assert process.returncode == 130, errors
    assert "Traceback" not in errors and "checkpoint written at step" in rest
    stopped_at = int(rest.split("checkpoint written at step ")[1].split(";")[0])
    assert 5 <= stopped_at < 400

    resumed = marl_in_process("demo", "--out", str(out), "--steps", str(stopped_at + 3), "--resume", "--tracker",
                              "jsonl")
    assert resumed.returncode == 0, resumed.stderr
    steps = [json.loads(line)["train/step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, stopped_at + 4))


def test_resume_drops_metric_rows_past_the_checkpoint_and_a_torn_last_line(tmp_path):
    from trainers.records.report import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"train/step": s, "train/reward": 0.5}) + "\n" for s in (1, 2, 3))
                    + '{"train/step": 4, "train/rew')  # the process died mid-write
    truncate_metrics(path, steps_done=2)
    assert [json.loads(line)["train/step"] for line in path.read_text().splitlines()] == [1, 2]


@pytest.mark.parametrize("command", [["demo", "--steps", "1", "--set", "tasks.eval_count=4"],
                                     ["run", "relay", "--set", "train.steps=1", "--set", "tasks.eval_count=4"]])
def test_a_tracker_that_cannot_start_is_one_line_and_exit_2(command, monkeypatch, tmp_path, demo_model_dir):
    """wandb.init failing (no network, a bad key) is the user's setting to fix, not a traceback."""
    import wandb

    def refuse(**kwargs):
        raise wandb.errors.UsageError("no network")

    monkeypatch.setattr(wandb, "init", refuse)
    result = marl_in_process(*command, "--out", str(tmp_path / "run"), "--tracker", "wandb")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "wandb.init failed: no network" in lines[0] and "--tracker jsonl" in lines[0]
