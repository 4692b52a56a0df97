"""`marl run`: the multi-agent main job end to end on the tiny model (real torch, real W&B offline)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from trainers.cli.main import main
from trainers.team.trainer import StepPlan
from helpers.scenario_files import race_yaml
from helpers.paths import SCENARIOS
from helpers.signal import by_seed, with_signal

SMALL = ["train.prompts_per_step=2", "train.group_size=4", "tasks.count=60", "tasks.eval_count=8",
         "train.warmup.rl_steps=0", "train.checkpoint_every=1"]


def _settings(*extra: str) -> list[str]:
    args = []
    for item in SMALL + list(extra):
        args += ["--set", item]
    return args


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _parameters(directory: Path) -> dict[str, torch.Tensor]:
    from trainers.policy.tinylm import load_policy

    model, _ = load_policy(directory)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _changed(before: dict, after: dict) -> bool:
    return any(not torch.equal(before[name], after[name]) for name in before)


def test_two_step_run_trains_every_policy_and_logs_to_wandb(demo_model_dir, tmp_path, monkeypatch):
    from helpers.wandb_reader import read_offline_run, table_rows

    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb.teardown()  # a W&B session an earlier test of this worker started keeps its settings (its mode, its dirs)
    with_signal(monkeypatch)  # a reward spread in every group, whatever the tiny model samples: both policies update
    out = tmp_path / "run"
    code = main(["run", "relay", *_settings("train.steps=2", "agents.0.policy=own"), "--out", str(out),
                 "--tracker", "wandb"])
    assert code == 0
    base = _parameters(demo_model_dir)
    checkpoint = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    assert _changed(base, _parameters(checkpoint / "model"))        # the shared policy (right, final)
    assert _changed(base, _parameters(checkpoint / "model-left"))   # left's own copy

    run, files = read_offline_run(out)
    history = [row for row in run["history"] if "train/reward" in row]
    assert [row["train/step"] for row in history] == [1, 2]
    for key in ("train/team_success", "train/agent/left/reward", "train/agent/final/reward", "credit/left/value",
                "credit/left/share",
                "policy/shared/loss", "policy/left/loss", "guard/self_bleu", "judge/masked_episodes"):
        assert all(key in row for row in history), key
    assert ("policy/*", "train/step") in {(m["name"], m["step_metric"]) for m in run["metrics"]}

    columns, rows = table_rows(run, files, "credit")
    assert columns == ["step", "episode", "task", "agent", "credit", "stderr", "team_reward", "method"]
    agents: dict = {}
    for step, episode, _, agent, _, _, _, method in rows:
        assert method.startswith("shapley")
        agents.setdefault((step, episode), []).append(agent)
    assert {step for step, _ in agents} == {2}  # tables every TABLE_EVERY steps and at the last one
    assert all(sorted(names) == ["final", "left", "right"] for names in agents.values())
    columns, samples = table_rows(run, files, "samples")
    assert {"observation", "message", "advantage", "credit"} <= set(columns)
    assert {row[columns.index("agent")] for row in samples} == {"left", "right", "final"}

    report = (out / "report.md").read_text()
    assert "Held-out evaluation" in report and "team_success" in report and "masked reward" in report
    assert "### Credit per agent: value and share (shapley credit against the stand-in policy " in report
    example = report[report.index("## Credit: one held-out episode, after training"):]  # the split in words
    assert all(f"Without `{agent}` the team would have scored" in example for agent in ("left", "right", "final"))
    assert "Credit (shapley/exact): `left` " in example
    assert (out / "plots" / "reward.png").exists() and (out / "plots" / "credit.png").exists()
    before, after = (json.loads((out / name).read_text()) for name in ("before.json", "after.json"))
    assert 0 <= before["team_success"] <= 1 and 0 <= after["team_success"] <= 1


def test_credit_table_is_efficient(demo_model_dir, tmp_path):
    """Shapley credits of every logged episode add up to v(everyone) - v(nobody). In relay nobody present
    means the expert plays every seat (credit.absent=default_policy), which always scores 1."""
    out = tmp_path / "run"
    assert main(["run", "relay", *_settings("train.steps=1"), "--out", str(out), "--tracker", "jsonl"]) == 0
    rows = _rows(out / "tables" / "credit.jsonl")
    totals: dict = {}
    for row in rows:
        key = (row["step"], row["episode"], row["team_reward"])
        totals[key] = totals.get(key, 0.0) + row["credit"]
    assert totals
    for (_, _, team), total in totals.items():
        assert total == pytest.approx(team - 1.0, abs=1e-9)


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


@pytest.mark.parametrize("extra", [(), ("agents.1.policy=random",)], ids=["models", "with-a-random-agent"])
def test_resume_continues_exactly_like_an_uninterrupted_run(demo_model_dir, tmp_path, extra):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["run", "relay", *_settings("train.steps=4", *extra), "--out", str(straight), "--tracker", "none"]) == 0
    assert main(["run", "relay", *_settings("train.steps=2", *extra), "--out", str(split), "--tracker", "none"]) == 0
    assert main(["run", "relay", *_settings("train.steps=4", *extra), "--out", str(split), "--tracker", "none",
                 "--resume"]) == 0
    expected, got = _comparable(_rows(straight / "metrics.jsonl")), _comparable(_rows(split / "metrics.jsonl"))
    assert [row["train/step"] for row in got] == [1, 2, 3, 4]
    assert got == expected


def test_sigint_writes_a_checkpoint_and_resume_loses_no_step(demo_model_dir, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "trainers.cli.main", "run", "relay", *_settings("train.steps=400"),
               "--out", str(out), "--tracker", "none"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics = out / "metrics.jsonl"
    while process.poll() is None and (not metrics.exists() or len(_rows(metrics)) < 3):
        time.sleep(0.2)  # waits for the event (three logged steps), not for a time
    assert process.poll() is None, process.communicate()[0][-3000:]
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "checkpoint written at step" in output and "Traceback" not in output
    stopped = int((out / "checkpoints" / "latest").read_text().strip().split("-")[1])
    assert stopped >= 3
    assert main(["run", "relay", *_settings(f"train.steps={stopped + 1}"), "--out", str(out), "--tracker", "none",
                 "--resume"]) == 0
    assert [row["train/step"] for row in _rows(metrics)] == list(range(1, stopped + 2))


def test_a_run_directory_is_never_overwritten(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "relay", *_settings("train.steps=1"), "--out", str(out), "--tracker", "none"]) == 0
    before = (out / "metrics.jsonl").read_text()
    assert main(["run", "relay", *_settings("train.steps=1"), "--out", str(out), "--tracker", "none"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == before


def test_invalid_scenario_stops_before_any_model_is_built(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    relay = (SCENARIOS / "relay.yaml").read_text()
    bad.write_text(relay.replace("group_size: 8", "group_sise: 8"))
    out = tmp_path / "run"
    assert main(["run", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:" in err and "group_sise" in err and "Traceback" not in err
    assert not out.exists()


def _race_scenario(tmp_path: Path) -> Path:
    """A competitive scenario the addition model can play: both agents answer; the correct one wins."""
    path = tmp_path / "race.yaml"
    path.write_text(race_yaml(8, train='  stages: [main]\n  selfplay: {snapshot_every: 1, self_play_fraction: 0.0, strategy: latest}\n'))
    return path


def test_self_play_trains_against_frozen_snapshots_and_logs_ratings(demo_model_dir, tmp_path):
    from trainers.run import RunOptions, prepare

    options = RunOptions(str(_race_scenario(tmp_path)), ["train.group_size=4", "train.prompts_per_step=2"])
    _, _, _, trainer, _ = prepare(options, log=lambda *_: None)
    assert trainer.pool is not None and set(trainer.learners) == {"shared"}
    learner, opponent = trainer.actors["shared"].model, trainer.actors["opponent"].model
    start = {name: p.detach().clone() for name, p in learner.named_parameters()}
    metrics = [trainer.step(StepPlan(reward_transform=by_seed)) for _ in range(3)]  # by_seed: every step has a signal
    assert all(m["selfplay/against_snapshot"] == 1.0 for m in metrics)
    assert [m["selfplay/pool_size"] for m in metrics] == [2, 3, 4]
    assert all("selfplay/rating/learner" in m for m in metrics)
    assert not any(p.requires_grad for p in opponent.parameters())
    assert _changed(start, {name: p.detach() for name, p in learner.named_parameters()})
    seats = {tuple(sorted(e.job.seats.items())) for e in trainer.last_step.episodes}
    assert seats <= {(("first", "opponent"),), (("second", "opponent"),)}
    assert not math.isnan(metrics[-1]["selfplay/rating/learner"])


def test_fixed_opponents_take_their_share_of_self_play_steps(demo_model_dir, tmp_path, capsys):
    """train.selfplay.fixed_opponents: with {expert: 1.0} every step seats the scenario's expert opposite
    the learner (its actor, never trained), logs the learner's score against it and leaves the pool's
    ratings alone; a name the scenario's `opponents` lacks is a located error before training."""
    from trainers.run import RunOptions, prepare

    path = tmp_path / "race.yaml"
    path.write_text(race_yaml(8, train="  stages: [main]\n  selfplay: {fixed_opponents: {expert: 1.0}}\n")
                    + "expert: expert_lib:add\nopponents: {expert: expert}\n")
    (tmp_path / "expert_lib.py").write_text(
        "def add(agent, observation, task):\n    return str(eval(observation.rstrip('=')))\n")
    _, _, _, trainer, _ = prepare(RunOptions(str(path), ["train.group_size=4", "train.prompts_per_step=2"]),
                               log=lambda *_: None)
    metrics = [trainer.step() for _ in range(2)]
    assert all(m["selfplay/against_fixed"] == 1.0 and m["selfplay/against_snapshot"] == 0.0 for m in metrics)
    seats = {tuple(sorted(e.job.seats.items())) for e in trainer.last_step.episodes}
    assert seats <= {(("first", "fixed:expert"),), (("second", "fixed:expert"),)} and len(seats) == 2
    for episode in trainer.last_step.episodes:  # the expert's turns are its own, never a training sample
        [opposite] = episode.job.seats
        assert all(turn.actor is None for turn in episode.turns if turn.agent == opposite)
    # the expert always adds correctly: the learner at best draws (0.5), never wins
    assert all(0.0 <= m["selfplay/fixed/expert/score"] <= 0.5 for m in metrics)
    assert trainer.pool.ratings_metrics() == {"selfplay/pool_size": 1, "selfplay/rating/learner": 1000.0,
                                              "selfplay/rating/step-0": 1000.0}

    path.write_text(path.read_text().replace("{expert: 1.0}", "{minimax: 0.5}"))
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:" in err and "no opponent 'minimax'" in err and "Traceback" not in err


def test_a_judge_that_fails_mid_run_is_masked_counted_and_reported(demo_model_dir, tmp_path):
    import itertools
    import shutil

    from helpers.judge_server import JudgeServer, write_judged_relay

    scenarios = SCENARIOS
    shutil.copy(scenarios / "relay_lib.py", tmp_path / "relay_lib.py")
    calls = itertools.count()
    first_number = re.compile(r"\[Question\]\n\((\d+)\+")

    def flaky(body):
        """Once training has started (the first 8 requests are the held-out evaluation's), a request
        about a task whose first number is above 30 fails: what fails depends on the tasks drawn
        (seeded), never on what the model sampled, so the count of masked episodes is the same on every CPU."""
        if next(calls) < 8:
            return ("ok", "Rating: [[8]]")
        first = int(first_number.search(body["messages"][-1]["content"]).group(1))
        return ("status", 400) if first > 30 else ("ok", "Rating: [[8]]")

    with JudgeServer(default=flaky) as server:
        path = write_judged_relay(scenarios, server.url, tmp_path)
        out = tmp_path / "run"
        # every other judge call fails, so the credit replays lose most rewards: allow it (the stop has its own test)
        assert main(["run", str(path), *_settings("train.steps=2", "train.max_masked_fraction=1"), "--out", str(out),
                     "--tracker", "none"]) == 0
    rows = _rows(out / "metrics.jsonl")
    assert [row["train/step"] for row in rows] == [1, 2]
    masked = rows[-1]["judge/masked_total"]
    assert masked == sum(row["judge/masked_episodes"] for row in rows) and 0 < masked < 16
    summary = json.loads((out / "summary.json").read_text())
    assert summary["masked_episodes"] == masked
    assert f"{masked} of 16 training episodes had a masked reward" in (out / "report.md").read_text()


def test_frozen_and_endpoint_agents_play_but_are_never_trained(demo_model_dir, tmp_path):
    """left: its own frozen copy; right: an OpenAI-compatible endpoint; final: the shared trainable model."""
    from helpers.judge_server import JudgeServer

    from trainers.run import RunOptions, prepare

    def adder(body):  # the endpoint answers the addition in its last user message
        a, b = body["messages"][-1]["content"].rstrip("=").split("+")
        return ("ok", str(int(a) + int(b)))

    with JudgeServer(default=adder) as server:
        overrides = ["train.group_size=4", "train.prompts_per_step=2", "agents.0.policy=own",
                     "agents.0.trainable=false", "agents.1.policy=openai:adder", f"agents.1.base_url={server.url}",
                     "agents.1.api_key_env=null"]
        _, _, _, trainer, _ = prepare(RunOptions("relay", overrides), log=lambda *_: None)
        assert set(trainer.learners) == {"shared"}
        left = {name: p.detach().clone() for name, p in trainer.actors["left"].model.named_parameters()}
        final = {name: p.detach().clone() for name, p in trainer.actors["shared"].model.named_parameters()}
        for _ in range(2):
            metrics = trainer.step(StepPlan(reward_transform=by_seed))  # a spread in every group: the learner updates
        assert server.requests == 2 * 8  # right speaks once in each of the 8 episodes of both steps
    episodes = trainer.last_step.episodes
    rights = [turn for episode in episodes for turn in episode.turns if turn.agent == "right"]
    assert all(turn.actor is None for turn in rights)  # frozen output is never a training sample
    a, b = rights[0].observation.rstrip("=").split("+")
    assert rights[0].text == str(int(a) + int(b))
    assert not _changed(left, dict(trainer.actors["left"].model.named_parameters()))
    assert _changed(final, {name: p.detach() for name, p in trainer.actors["shared"].model.named_parameters()})
    assert "policy/left/loss" not in metrics and "policy/shared/loss" in metrics


FULL_DISK_SCRIPT = r"""
import resource, signal, sys
from trainers.records.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from trainers.run import RunOptions, prepare

out = sys.argv[1]
_, _, _, trainer, _ = prepare(RunOptions("relay", ["train.group_size=2", "train.prompts_per_step=1"]), log=lambda *_: None)
trainer.step()
save_checkpoint(trainer, out)
trainer.step()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit now fails with EFBIG, like a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
try:
    save_checkpoint(trainer, out)
except CheckpointError as error:
    print("write failed:", error)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
latest = latest_checkpoint(out)
load_checkpoint(trainer, latest)
print("latest:", latest.name, "step:", trainer.step_count)
"""


def test_a_checkpoint_write_that_runs_out_of_space_leaves_the_last_good_one(demo_model_dir, tmp_path):
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-c", FULL_DISK_SCRIPT, str(out)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert "write failed: could not write checkpoint step-000002" in result.stdout
    assert "the last complete checkpoint, step-000001, is intact" in result.stdout
    assert "latest: step-000001 step: 1" in result.stdout
    leftovers = [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the half-written temporary directory was removed


def test_resuming_with_another_scenario_setting_is_refused(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "relay", *_settings("train.steps=1"), "--out", str(out), "--tracker", "none"]) == 0
    code = main(["run", "relay", *_settings("train.steps=2", "credit.method=team"), "--out", str(out),
                 "--tracker", "none", "--resume"])
    assert code == 2
    assert "credit.method: 'shapley' -> 'team'" in capsys.readouterr().err
    assert [row["train/step"] for row in _rows(out / "metrics.jsonl")] == [1]


def test_after_a_warm_up_the_kl_reference_and_first_opponent_are_the_warmed_up_model(demo_model_dir, tmp_path):
    from trainers.run import RunOptions, prepare

    _, _, _, trainer, _ = prepare(RunOptions(str(_race_scenario(tmp_path)), ["train.beta=0.04"]), log=lambda *_: None)
    model = trainer.actors["shared"].model
    with torch.no_grad():  # what an SFT warm-up does: the weights move
        next(model.parameters()).add_(0.01)
    trainer.restart_frozen_copies()
    weights = model.state_dict()
    reference = trainer.learners["shared"].reference.state_dict()
    _, snapshot = trainer.pool.sample()
    assert all(torch.equal(weights[k], reference[k]) and torch.equal(weights[k], snapshot[k]) for k in weights)
    assert all(torch.equal(weights[k], v) for k, v in trainer.actors["opponent"].model.state_dict().items())


def test_eval_every_logs_held_out_figures_during_the_run_and_changes_no_training_step(demo_model_dir, tmp_path):
    runs = {}
    for name, extra in (("plain", []), ("eval", ["train.eval_every=2"])):
        out = tmp_path / name
        assert main(["run", "relay", *_settings("train.steps=4", "train.eval_tasks=6", *extra), "--out", str(out),
                     "--tracker", "jsonl"]) == 0
        runs[name] = (out, _rows(out / "metrics.jsonl"))
    (_, plain), (out, rows) = runs["plain"], runs["eval"]
    due = [row["train/step"] for row in rows if "eval/team_success" in row]
    assert due == [2, 4] and all(row["eval/step"] == row["train/step"] for row in rows if "eval/step" in row)
    # the last evaluation is after.json's: the same fixed set, seeds and greedy decoding
    assert rows[-1]["eval/team_success"] == json.loads((out / "after.json").read_text())["team_success"]
    training = lambda row: {k: v for k, v in row.items() if not k.startswith(("eval/", "time/"))}  # noqa: E731
    assert [training(row) for row in rows] == [training(row) for row in plain]  # evaluating changed no step
    assert (out / "plots" / "eval.png").is_file() and not (runs["plain"][0] / "plots" / "eval.png").exists()


def test_a_start_with_no_signal_is_said_plainly_and_a_learnable_one_is_not(demo_model_dir, tmp_path, capsys):
    """left and right say nothing (scripted 'null') and only the exact answer scores (no format layer), so
    final, seeing '+=', is never right: every group of plays scores alike (0), and the run says so after
    its first steps. With a final that answers right on every other play of a task (scripted, so the spread
    does not rest on what the tiny model samples), every group has a signal and nothing is said."""
    silent = ["agents.0.policy='null'", "agents.1.policy='null'", "rewards.format=[]"]
    learnable = ["agents.2.policy=helpers.scripted:every_other_play"]
    for name, extra in (("silent", silent), ("relay", learnable)):
        out = tmp_path / name
        assert main(["run", "relay", *_settings("train.steps=5", *extra), "--out", str(out), "--tracker", "jsonl"]) == 0
        printed = capsys.readouterr().out
        rows = _rows(out / "metrics.jsonl")
        assert [row["guard/weak_start"] for row in rows if "guard/weak_start" in row] == [float(name == "silent")]
        assert all(row["train/signal_groups"] == 0.0 for row in rows) == (name == "silent")
        assert ("weak start: in the first 5 steps only 0% of the agents' groups of 4 plays" in printed) == \
            (name == "silent")
        if name == "silent":
            assert "raise train.group_size" in printed and "train.warmup.sft_max_steps" in printed


@pytest.mark.slow  # builds a small tiny model for each game (4 SFT steps: the figures are logged whatever it plays)
@pytest.mark.parametrize("name, figure", [("tictactoe", "vs/minimax/not_lost"), ("kuhn_poker", "game/exploitability")])
def test_a_short_run_of_each_game_logs_its_exact_figures(name, figure, tmp_path, capsys):
    out = tmp_path / name
    assert main(["run", name, "--set", "train.steps=2", "--set", "train.eval_every=1", "--set", "train.group_size=2",
                 "--set", "train.prompts_per_step=2", "--set", "train.warmup.rl_steps=0", "--set",
                 "train.warmup.sft_max_steps=4", "--set", "train.eval_tasks=4", "--cache-dir", str(tmp_path / "cache"),
                 "--out", str(out), "--tracker", "jsonl"]) == 0
    printed = capsys.readouterr().out
    assert "held-out at step 2: team success" in printed and f"; {figure} " in printed
    before, after = (json.loads((out / f"{when}.json").read_text()) for when in ("before", "after"))
    assert 0.0 <= before[figure] <= 1.0 and 0.0 <= after[figure] <= 1.0
    # before training the learner meets its own initial copy: the same greedy games seen from each seat
    first, second = ("x", "o") if name == "tictactoe" else ("first", "second")
    assert before[f"vs/initial/{first}/reward"] == pytest.approx(-before[f"vs/initial/{second}/reward"])
    assert {"vs/initial/won", "vs/initial/not_lost"} <= set(after) and 0.0 <= after["vs/initial/won"] <= 1.0
    assert [row["train/step"] for row in _rows(out / "metrics.jsonl") if f"eval/{figure}" in row] == [1, 2]
    assert (out / "plots" / "games.png").is_file()


def test_the_evaluations_initial_opponent_keeps_the_weights_the_run_started_with(demo_model_dir, tmp_path):
    """vs/initial/* is measured against the policy as `marl run` started (before.json's, before any
    warm-up): a warm-up or a training step moves the learner, never that copy."""
    from trainers.run import RunOptions, prepare

    _, _, _, trainer, _ = prepare(RunOptions(str(_race_scenario(tmp_path)), ["tasks.eval_count=4"]), log=lambda *_: None)
    model, initial = trainer.actors["shared"].model, trainer.eval_opponents["initial"]
    start = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():  # what an SFT warm-up does: the weights move
        next(model.parameters()).add_(0.01)
    trainer.restart_frozen_copies()
    trainer.step()
    kept = initial.model.state_dict()
    assert not initial.trainable and all(torch.equal(kept[k], start[k]) for k in start)
    assert any(not torch.equal(model.state_dict()[k], start[k]) for k in start)
    # a run with no held-out set never evaluates, so it keeps no copy
    _, _, _, plain, _ = prepare(RunOptions(str(_race_scenario(tmp_path)), []), log=lambda *_: None)
    assert plain.eval_opponents == {}
