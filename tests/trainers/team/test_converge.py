"""`train.selfplay.converge`: self-play that converges in zero-sum games (mmd | average | none).

- mmd is the GRPO KL term toward a magnet reset every K steps; with K = infinity (magnet_every 0) and no
  magnet weight it is the plain update, bit for bit;
- average serves the mixture of the iterates' snapshots, one drawn per game: the held-out evaluation
  plays each game with the snapshot it drew, and the live weights are back afterwards;
- the setting is refused in one line where there is no self-play, and where mmd's KL would be set twice;
- a short `marl run kuhn_poker` completes with each.
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers.scenario_files import race_yaml
from helpers.signal import by_seed
from marl.rollout import EpisodeJob
from marl.scenario.load import ScenarioError, load_scenario
from trainers.cli.main import main
from trainers.config import resolve_config
from trainers.team.trainer import StepPlan

RACE = ["train.prompts_per_step=2", "train.group_size=4", "tasks.eval_count=4", "train.lr=5e-3"]


def _weights(model) -> dict:
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def _race(tmp_path, *settings):
    from trainers.run import RunOptions, prepare

    path = tmp_path / "race.yaml"
    path.write_text(race_yaml(8, train="  stages: [main]\n"))
    return prepare(RunOptions(str(path), [*RACE, *settings]), log=lambda *_: None)


def test_mmd_resolves_to_a_kl_toward_a_magnet_and_none_changes_nothing():
    plain = resolve_config(load_scenario("kuhn_poker"))
    assert plain.selfplay.converge == "none" and plain.grpo.beta == 0 and plain.grpo.ref_update_every == 0
    mmd = resolve_config(load_scenario("kuhn_poker", ["train.selfplay.converge=mmd"]))
    assert (mmd.grpo.beta, mmd.grpo.ref_update_every) == (0.1, 10)  # the defaults: magnet_weight, magnet_every
    mmd = resolve_config(load_scenario("kuhn_poker", ["train.selfplay.converge=mmd", "train.selfplay.magnet_every=0",
                                                      "train.selfplay.magnet_weight=0"]))
    assert (mmd.grpo.beta, mmd.grpo.ref_update_every) == (0, 0)
    assert plain.grpo == resolve_config(load_scenario("kuhn_poker", ["train.selfplay.converge=average"])).grpo


@pytest.mark.parametrize("settings, words", [
    (("train.selfplay.converge=mmd",), "cooperative"),
    (("train.selfplay.converge=average",), "cooperative"),
])
def test_a_cooperative_scenario_refuses_converge_in_one_line(settings, words):
    with pytest.raises(ScenarioError) as error:
        load_scenario("relay", list(settings))
    assert len(error.value.problems) == 1 and words in str(error.value) and "converge" in str(error.value)


@pytest.mark.parametrize("settings, words", [
    (("train.selfplay.converge=mmd", "train.beta=0.04"), "leave train.beta"),
    (("train.selfplay.converge=average", "train.selfplay.enabled=false"), "needs self-play"),
])
def test_converge_is_refused_where_it_cannot_apply(settings, words):
    with pytest.raises(ScenarioError) as error:
        load_scenario("kuhn_poker", list(settings))
    assert len(error.value.problems) == 1 and words in str(error.value)


def test_mmd_with_no_magnet_is_the_plain_update_bit_for_bit(demo_model_dir, tmp_path):
    after = {}
    for name, settings in (("none", ()), ("mmd", ("train.selfplay.converge=mmd", "train.selfplay.magnet_every=0",
                                                   "train.selfplay.magnet_weight=0"))):
        trainer = _race(tmp_path, *settings).trainer
        assert trainer.learners["shared"].reference is None  # no magnet: no KL term, no reference built
        trainer.step(StepPlan(reward_transform=by_seed))  # a spread in every group: the step updates
        after[name] = _weights(trainer.actors["shared"].model)
    assert _same(after["none"], after["mmd"])


def test_mmd_pulls_toward_a_magnet_that_is_reset_every_k_steps(demo_model_dir, tmp_path):
    trainer = _race(tmp_path, "train.selfplay.converge=mmd", "train.selfplay.magnet_every=2").trainer
    model, learner = trainer.actors["shared"].model, trainer.learners["shared"]
    start = _weights(model)
    assert learner.config.beta == 0.1
    trainer.step(StepPlan(reward_transform=by_seed))
    assert _same(_weights(learner.reference), start) and not _same(_weights(model), start)  # the magnet stays
    trainer.step(StepPlan(reward_transform=by_seed))
    assert _same(_weights(learner.reference), _weights(model))  # reset to the current policy at step 2


def test_average_plays_each_game_with_the_snapshot_it_drew(demo_model_dir, tmp_path):
    prepared = _race(tmp_path, "train.selfplay.converge=average")
    trainer = prepared.trainer
    model = trainer.actors["shared"].model
    snapshots = [_weights(model)]
    for _ in range(3):
        metrics = trainer.step(StepPlan(reward_transform=by_seed))
        snapshots.append(_weights(model))
    assert metrics["selfplay/average/snapshots"] == 4.0
    live = _weights(model)
    jobs = [EpisodeJob(task, index) for index, task in enumerate(prepared.eval_tasks * 4)]
    with trainer.serving() as player:
        assert player.weights == [0.25] * 4
        served = player.play(jobs, greedy=True).episodes
        draws = [player.draw(f"{job.task.id}:{job.seed}") for job in jobs]
        assert _same(_weights(model), live)  # the live weights are back after each play
    assert len(set(draws)) > 1
    for component in set(draws):  # each game is what its snapshot plays
        model.load_state_dict(snapshots[component])
        index = [i for i, drawn in enumerate(draws) if drawn == component]
        alone = trainer.player.play([jobs[i] for i in index], greedy=True).episodes
        assert [e.transcript for e in alone] == [served[i].transcript for i in index]
    model.load_state_dict(live)


def test_averages_snapshots_survive_a_checkpoint_and_the_evaluation_serves_them(demo_model_dir, tmp_path):
    from trainers.stages.loop import evaluate_held_out

    prepared = _race(tmp_path, "train.selfplay.converge=average", "train.selfplay.average_every=2")
    trainer = prepared.trainer
    for _ in range(3):
        trainer.step(StepPlan(reward_transform=by_seed))
    state = trainer.state_dict()
    assert [entry["step"] for entry in state["pool"]["average"]["entries"]] == [0, 2]
    live = _weights(trainer.actors["shared"].model)
    figures = evaluate_held_out(trainer, prepared.eval_tasks)
    assert "team_success" in figures and _same(_weights(trainer.actors["shared"].model), live)
    fresh = _race(tmp_path, "train.selfplay.converge=average", "train.selfplay.average_every=2").trainer
    fresh.load_state_dict(state)
    assert [e.step for e in fresh.selfplay.average.mixture.entries] == [0, 2]


@pytest.mark.slow  # builds a small tiny model of Kuhn poker (4 SFT steps), shared by both runs
@pytest.mark.parametrize("converge", ["mmd", "average"])
def test_a_short_kuhn_poker_run_completes_with_each_converge(converge, tmp_path_factory):
    cache, out = tmp_path_factory.getbasetemp() / "kuhn-cache", tmp_path_factory.mktemp(converge) / "run"
    settings = [f"train.selfplay.converge={converge}", "train.steps=2", "train.eval_every=1", "train.group_size=2",
                "train.prompts_per_step=2", "train.warmup.rl_steps=0", "train.warmup.sft_max_steps=4",
                "train.eval_tasks=4"]
    args = [arg for setting in settings for arg in ("--set", setting)]
    assert main(["run", "kuhn_poker", *args, "--cache-dir", str(cache), "--out", str(out), "--tracker", "jsonl"]) == 0
    after = json.loads((out / "after.json").read_text())
    assert 0.0 <= after["game/exploitability"] <= 1.0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [row["train/step"] for row in rows if "eval/game/exploitability" in row] == [1, 2]
    if converge == "average":
        assert [row["selfplay/average/snapshots"] for row in rows if "selfplay/average/snapshots" in row] == [2, 3]
    # marl eval plays what the run served: the mixture of the iterates, with the run's final figures exactly
    served, last = out / "served", out / "last"
    assert main(["eval", "kuhn_poker", "--checkpoint", str(out), "--cache-dir", str(cache), "--tasks", "4",
                 "--out", str(served)]) == 0
    assert main(["eval", "kuhn_poker", "--checkpoint", str(out), "--cache-dir", str(cache), "--tasks", "4",
                 "--out", str(last), "--last-iterate"]) == 0
    served, last = (json.loads((folder / "eval.json").read_text()) for folder in (served, last))
    assert last["served"] == "last iterate"
    assert served["served"] == ("mixture of 3 iterates (steps 0..2)" if converge == "average" else "last iterate")
    mine = served if converge == "average" else last
    assert abs(mine["metrics"]["game/exploitability"] - after["game/exploitability"]) < 1e-9
    if converge == "average":  # snapshots that do not fit the model the checkpoint is played by: one clear error
        import torch
        from types import SimpleNamespace

        from trainers.checkpoint_eval import served_player
        from trainers.records.checkpoint import CheckpointError, latest_checkpoint

        with pytest.raises(CheckpointError, match="--last-iterate"):
            served_player(None, {"shared": SimpleNamespace(model=torch.nn.Linear(2, 2))}, latest_checkpoint(out))
