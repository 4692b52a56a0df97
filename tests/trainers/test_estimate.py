"""`marl estimate`: a real probe of the relay scenario on the tiny model; the projection's arithmetic,
its scaling with train.steps, clean errors, and no run directory written."""

from __future__ import annotations

import math
import sys

import pytest

from marl.scenario.load import load_scenario
from trainers.cli.main import main
from trainers.config import resolve_config
from trainers.estimate import Probe, estimate_run, project_estimate
from trainers.run import RunOptions

TINY = ["train.group_size=2", "train.prompts_per_step=2", "train.steps=10"]


def _set_args(overrides: list[str]) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


# make test (--dist loadgroup): this module's tests run on one worker, so relay_estimate is built once
pytestmark = pytest.mark.xdist_group("estimate")


@pytest.fixture(scope="module")
def relay_estimate(tmp_path_factory, demo_model_dir):  # relay plays the demo model: ordered after its build
    """estimate_run on tiny relay settings, run from an empty working directory (returned too)."""
    workdir = tmp_path_factory.mktemp("estimate-cwd")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        figures = estimate_run(RunOptions("relay", TINY), probe_steps=2, log=lambda message: None)
    return figures, workdir


def test_training_tokens_follow_the_formula_on_the_returned_figures(relay_estimate):
    f, _ = relay_estimate
    assert f["stages"] == [("warmup", 3), ("main", 10)] and f["total_steps"] == 13
    assert f["episodes_per_step"] == 2 * 2 and f["total_episodes"] == 13 * 4
    assert f["mean_trajectory_tokens"] > 0 and f["episodes_measured"] == 2 * 4  # 2 probe steps x 4 episodes
    assert f["training_tokens"] == f["total_steps"] * f["prompts_per_step"] * f["group_size"] * \
        f["mean_trajectory_tokens"] * f["mu"]
    assert f["draws_per_task"] == pytest.approx(13 * 2 / f["train_tasks"])


def test_wall_time_is_steps_times_measured_seconds_per_step_plus_evaluation(relay_estimate):
    f, _ = relay_estimate
    assert f["probe_steps"] == 2 and f["timed_steps"] == 1 and f["warmup_excluded"]
    assert f["seconds_per_step"] == f["step_seconds"][1]  # the first step is left out as warm-up
    assert f["train_seconds"] == f["total_steps"] * f["seconds_per_step"]
    assert f["total_seconds"] == f["train_seconds"] + f["eval_seconds"]
    assert f["eval_tasks"] == 100 and f["eval_seconds"] > 0
    assert 0 <= f["credit_share"] <= 1 and math.isnan(f["seconds_per_step_sd"])  # one timed step: no spread


def test_doubling_train_steps_doubles_main_stage_tokens_and_time(relay_estimate):
    f, _ = relay_estimate
    probe = Probe(f["step_seconds"], [f["credit_seconds_per_step"]] * 2, [f["play_seconds_per_step"]] * 2,
                  [f["update_seconds_per_step"]] * 2, [f["mean_trajectory_tokens"]], f["eval_seconds"] / 2,
                  f["eval_tasks_timed"])
    without_warmup = ["train.stages=[main]"]
    short = project_estimate("relay", resolve_config(load_scenario("relay", TINY + without_warmup)), f["train_tasks"], 100, probe)
    long = project_estimate("relay", resolve_config(load_scenario("relay", TINY + without_warmup + ["train.steps=20"])), f["train_tasks"],
                            100, probe)
    assert long["total_steps"] == 2 * short["total_steps"] == 20
    assert long["training_tokens"] == pytest.approx(2 * short["training_tokens"])
    assert long["train_seconds"] == pytest.approx(2 * short["train_seconds"])
    assert short["training_tokens"] == pytest.approx(f["training_tokens"] * 10 / 13)


def test_spread_is_reported_when_several_steps_are_timed(relay_estimate):
    f, _ = relay_estimate
    probe = Probe([9.0, 1.0, 2.0, 3.0], [0.5] * 4, [0.2] * 4, [0.3] * 4, [4, 6], 1.0, 100)
    g = project_estimate("relay", resolve_config(load_scenario("relay", TINY)), f["train_tasks"], 100, probe)
    assert g["seconds_per_step"] == 2.0 and g["seconds_per_step_sd"] == pytest.approx(1.0)
    assert g["train_seconds_range"] == (13 * 1.0, 13 * 3.0)
    assert g["credit_share"] == 0.25 and g["mean_trajectory_tokens"] == 5.0


def test_probe_writes_no_run_directory(relay_estimate):
    _, workdir = relay_estimate
    assert not (workdir / "runs").exists()
    assert list(workdir.iterdir()) == []


def test_cli_prints_the_table_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["estimate", "relay", *_set_args(TINY + ["train.stages=[main]"]), "--probe-steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "10 x 2 x 2 x" in out and "warm-up included" in out and "estimated wall time" in out
    assert list(tmp_path.iterdir()) == []


def test_bad_scenario_path_exits_2_without_a_traceback(tmp_path, monkeypatch, capsys):
    # what the `marl` console script runs: main() reads its arguments from sys.argv
    monkeypatch.setattr(sys, "argv", ["marl", "estimate", str(tmp_path / "nope.yaml")])
    monkeypatch.chdir(tmp_path)
    assert main() == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out and "no scenario file" in captured.err
    assert not (tmp_path / "runs").exists()


def test_invalid_scenario_prints_file_line_col_problems(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nagents:\n  - name: a\n    max_tokens: -3\n")
    assert main(["estimate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:4:" in err


def test_bad_input_is_a_usage_error(capsys):
    assert main(["estimate", "relay", "--probe-steps", "0"]) == 2
    assert "--probe-steps 0" in capsys.readouterr().err
    assert main(["estimate", "relay", "--set", "train.nope=1"]) == 2
