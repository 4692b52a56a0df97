"""A run whose rewards are mostly masked warns at once and stops past train.max_masked_fraction (issue 10).

The guard itself is checked step by step (fast); one end-to-end run on the tiny model uses a judge
endpoint on 127.0.0.1 that refuses every request: it warns on step 1, stops with exit status 2 and
one line on its last step, keeps metrics.jsonl and the checkpoint of the last complete step, and
resumes to the end once the limit is raised with --set.
"""

from __future__ import annotations

import json
import shutil

import pytest

from trainers.team.trainer import MaskedRewardGuard, MaskedRewardsError
from helpers.paths import SCENARIOS

STOP = ("train.max_masked_fraction={limit:g}; training stopped before this step's update (the last checkpoint and "
        "metrics.jsonl are intact). Fix the scorer (marl validate, marl rollout), or allow more with --set "
        "train.max_masked_fraction=0.9 (1 never stops)")


def _guard(limit=0.5, total_steps=100):
    lines: list[str] = []
    return MaskedRewardGuard(limit, total_steps, lines.append), lines


def test_a_masked_step_warns_once_and_a_masked_window_stops():
    guard, lines = _guard()
    for step in range(4):  # 8 of 8 masked: one warning, no stop before the window is full
        guard.check(step, ["episode"] * 8, 8)
    assert lines == ["warning: step 1: 8 of 8 episodes had masked rewards (a scorer failed); training stops if "
                     "more than 0.5 of them stay masked over 5 steps (train.max_masked_fraction)"]
    with pytest.raises(MaskedRewardsError) as stopped:
        guard.check(4, ["episode"] * 8, 8)
    assert str(stopped.value) == ("step 5: 40 of 40 episodes over the last 5 step(s) had masked rewards (a scorer "
                                  "failed), more than " + STOP.format(limit=0.5))
    assert len(lines) == 1


def test_a_transient_outage_below_the_limit_over_the_window_does_not_stop():
    guard, lines = _guard()
    masked = [8, 8, 0, 0, 0, 0, 0, 8]  # 16 of 40 at step 5, then 8 of 40 ... never above half
    for step, count in enumerate(masked):
        guard.check(step, ["episode"] * count, 8)
    assert len(lines) == 1 and lines[0].startswith("warning: step 1: 8 of 8 episodes")


def test_a_run_shorter_than_the_window_stops_at_its_last_step():
    guard, _ = _guard(total_steps=2)
    guard.check(0, ["episode"] * 4, 8)
    with pytest.raises(MaskedRewardsError, match=r"^step 2: 12 of 16 episodes over the last 2 step\(s\)"):
        guard.check(1, ["episode"] * 8, 8)


@pytest.mark.parametrize("limit, stops", [(1.0, False), (0.0, True), (0.75, False), (0.7, True)])
def test_the_limit_is_the_share_of_masked_episodes(limit, stops):
    guard, _ = _guard(limit=limit, total_steps=1)
    if stops:
        with pytest.raises(MaskedRewardsError):
            guard.check(0, ["episode"] * 6, 8)
    else:
        guard.check(0, ["episode"] * 6, 8)


def test_the_limit_is_validated_where_it_is_set(tmp_path, capsys):
    from trainers.cli.main import main

    assert main(["validate", "relay", "--set", "train.max_masked_fraction=2"]) == 2
    err = capsys.readouterr().err
    assert "train.max_masked_fraction" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_judge_that_always_fails_stops_the_run_with_its_data_intact(demo_model_dir, tmp_path, capsys):
    from helpers.judge_server import JudgeServer, write_judged_relay
    from trainers.cli.main import main

    scenarios = SCENARIOS
    shutil.copy(scenarios / "relay_lib.py", tmp_path / "relay_lib.py")
    settings = ["train.prompts_per_step=2", "train.group_size=4", "tasks.count=60", "tasks.eval_count=0",
                "train.warmup.rl_steps=0", "train.checkpoint_every=1", "train.steps=3"]
    args = [x for item in settings for x in ("--set", item)]
    with JudgeServer(default=("status", 400, {}, "judge endpoint refuses everything")) as server:
        path = write_judged_relay(scenarios, server.url, tmp_path)
        out = tmp_path / "run"
        code = main(["run", str(path), *args, "--out", str(out), "--tracker", "none"])
        captured = capsys.readouterr()
        assert code == 2
        reason = "critic api_error: 400: judge endpoint refuses everything"
        assert f"warning: step 1: 8 of 8 episodes had masked rewards ({reason})" in captured.out
        assert captured.err == (f"marl: error: step 3: 24 of 24 episodes over the last 3 step(s) had masked rewards "
                                f"({reason}), more than " + STOP.format(limit=0.5) + "\n")
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [row["train/step"] for row in rows] == [1, 2]  # every complete step kept, nothing torn
        assert (out / "checkpoints" / "latest").read_text().strip().endswith("2")
        assert not (out / "summary.json").exists()  # the run did not finish

        code = main(["run", str(path), *args, "--set", "train.max_masked_fraction=1", "--out", str(out),
                     "--resume", "--tracker", "none"])
        assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["train/step"] for row in rows] == [1, 2, 3] and rows[-1]["judge/masked_total"] == 24
