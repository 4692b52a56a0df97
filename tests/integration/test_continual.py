"""Continual RL (`marl run SCENARIO --init-from RUN`): the earlier policy restored exactly, the KL to it 0 at
the first step, replay steps played on the earlier scenario, both held-out sets reported, bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.cli import one_error_line
from helpers.inprocess import marl_in_process
from trainers.cli.main import main

SMALL = ["train.prompts_per_step=2", "train.group_size=4", "tasks.count=60", "tasks.eval_count=8",
         "train.warmup.rl_steps=0", "train.checkpoint_every=1", "train.steps=2"]
NEW = ["tasks.seed=1"]  # the new tasks: relay's family, other numbers (the bench uses a second family)


def _quiet(message: str) -> None:
    pass


def _finished_run(out: Path, *extra: str) -> Path:
    """A finished run whose steps had a reward spread in every group (helpers/signal.py), so its policy
    differs from the model it started from whatever the tiny model samples on this CPU."""
    from helpers.signal import with_signal
    from trainers.run import RunOptions, run_scenario

    with pytest.MonkeyPatch.context() as patch:
        with_signal(patch)
        run_scenario(RunOptions("relay", SMALL + list(extra), out=str(out), tracker="none"), log=_quiet)
    return out


# make test (--dist loadgroup): this module's tests run on one worker, so earlier is built once
pytestmark = pytest.mark.xdist_group("continual")


@pytest.fixture(scope="module")
def earlier(tmp_path_factory, demo_model_dir) -> Path:
    """A finished two-step relay run (full fine-tuning of the shared tiny model)."""
    return _finished_run(tmp_path_factory.mktemp("continual") / "earlier")


def _checkpoint(run: Path) -> Path:
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


def _logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)


def _continual(earlier: Path, *extra: str):
    """The trainer of a continual run of `earlier` (`.features`: its Continual)."""
    from trainers.run import RunOptions, prepare

    return prepare(RunOptions("relay", SMALL + NEW + list(extra), init_from=str(earlier)), log=_quiet)


def test_init_from_restores_the_earlier_policy_exactly_and_the_kl_to_it_is_0_at_the_first_step(
        earlier, demo_model_dir):
    from trainers.policy.tinylm import load_policy

    trainer = _continual(earlier, "train.continual.kl=0.1").trainer
    saved, tokenizer = load_policy(_checkpoint(earlier) / "model")
    base, _ = load_policy(demo_model_dir)
    ids = torch.tensor([tokenizer.encode("12+35=47"), tokenizer.encode("(20+31)+(44+18)=")[:8]])
    restored = _logprobs(trainer.actors["shared"].model, ids)
    assert torch.equal(restored, _logprobs(saved, ids))  # the same logprobs, bit for bit
    assert not torch.equal(restored, _logprobs(base, ids))  # and not those of the model the earlier run started from
    assert trainer.grpo.beta == 0.1 and "warmup" not in trainer.config.stages.names
    assert "warmup" not in trainer.spec.train.stages  # the scenario says so too: resume fingerprints, W&B config
    assert trainer.step()["train/kl"] == 0.0  # the reference is the earlier policy itself


def test_a_replay_step_plays_the_earlier_scenarios_tasks_there(earlier):
    from marl.scenario.load import load_scenario

    prepared = _continual(earlier, "train.continual.replay=0.5")
    trainer, (continual,) = prepared.trainer, prepared.features
    assert [continual.replay_due(step) for step in range(4)] == [False, True, False, True]
    old_prompts = {task.prompt for task in load_scenario("relay", SMALL).split()[0]}
    new_prompts = {task.prompt for task in trainer.tasks.values()}
    assert continual.step_plan(trainer, "main", 0) is None  # not due: the stage plays its own step
    plan = continual.step_plan(trainer, "main", 1)
    metrics = {**trainer.step(plan), **continual.after_step(trainer, {})}
    played = {episode.job.task.prompt for episode in trainer.last_step.episodes}
    assert metrics["continual/replay"] == 1.0 and played <= old_prompts and not played & new_prompts
    assert trainer.buckets.state_dict()["task_ids"] == list(trainer.tasks)  # replayed tasks stay out of the sampler
    trainer.step()
    assert {episode.job.task.prompt for episode in trainer.last_step.episodes} <= new_prompts


def test_lora_adapters_are_restored_and_the_reference_is_the_earlier_adapter(tmp_path, demo_model_dir):
    from trainers.policy.adapters import load_adapter_dir

    run = _finished_run(tmp_path / "lora", "train.lora.r=4", "train.lr=1e-3")
    trainer = _continual(run, "train.lora.r=4", "train.lr=1e-3", "train.continual.kl=0.05").trainer
    saved, tokenizer = load_adapter_dir(_checkpoint(run) / "model")
    ids = torch.tensor([tokenizer.encode("12+35=47")])
    policy, learner = trainer.actors["shared"].model, trainer.learners["shared"]
    assert torch.equal(_logprobs(policy, ids), _logprobs(saved, ids))
    assert torch.equal(_logprobs(learner.reference, ids), _logprobs(saved, ids))  # not the bare base
    assert trainer.step()["train/kl"] == 0.0


def test_a_continual_run_reports_both_held_out_sets_before_and_after(earlier, tmp_path):
    out = tmp_path / "next"
    args = [f"--set={item}" for item in SMALL + NEW + ["train.continual.replay=0.5", "train.continual.kl=0.1"]]
    assert main(["run", "relay", *args, "--init-from", str(earlier), "--out", str(out), "--tracker", "none"]) == 0
    state = json.loads((out / "continual.json").read_text())
    summary = json.loads((out / "summary.json").read_text())["continual"]
    earlier_after = json.loads((earlier / "after.json").read_text())["team_success"]
    assert state["old_before"]["team_success"] == earlier_after  # the earlier policy, measured the same way
    assert summary["old"]["forgetting"] == summary["old"]["before"] - summary["old"]["after"]
    assert summary["eval/new/team_success"] == json.loads((out / "after.json").read_text())["team_success"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["continual/replay"] for row in rows] == [0.0, 1.0]
    report = (out / "report.md").read_text()
    assert "## Continual RL" in report and "| old: relay | 8 |" in report and "| new: relay | 8 |" in report


def _refused(tmp_path: Path, init_from, *extra: str, capsys) -> str:
    out = tmp_path / "refused"
    args = [f"--set={item}" for item in SMALL + NEW + list(extra)]
    assert main(["run", "relay", *args, "--init-from", str(init_from), "--out", str(out), "--tracker", "none"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("marl: error: ") and "Traceback" not in error[0]
    assert not out.exists()  # nothing written
    return error[0]


def test_a_directory_without_a_finished_run_is_one_line_and_nothing_is_written(tmp_path, capsys):
    assert "no such directory" in _refused(tmp_path, tmp_path / "missing", capsys=capsys)
    stopped = tmp_path / "stopped"
    (stopped / "checkpoints").mkdir(parents=True)
    line = _refused(tmp_path, stopped, capsys=capsys)
    assert f"--init-from {stopped}" in line and "holds no finished run" in line


def test_an_incompatible_model_or_team_is_refused(earlier, demo_model_dir, tmp_path, capsys):
    line = _refused(tmp_path, earlier, "train.lora.r=4", capsys=capsys)
    assert f"--init-from {earlier}" in line and "full models" in line and "LoRA" in line
    line = _refused(tmp_path, earlier, f"train.model={demo_model_dir}", capsys=capsys)
    assert "incompatible model" in line and "train.model=tiny" in line
    line = _refused(tmp_path, earlier, "agents.0.policy=own", capsys=capsys)
    assert "team" in line and "left=own" in line


def test_the_command_line_error_is_one_line_with_status_2(tmp_path):
    result = marl_in_process("run", "relay", "--init-from", str(tmp_path), "--out", str(tmp_path / "out"))
    assert "holds no finished run" in one_error_line(result) and not (tmp_path / "out").exists()


def test_a_frozen_agent_plays_the_base_model_not_the_earlier_trained_policy(tmp_path, demo_model_dir):
    from trainers.policy.tinylm import load_policy

    frozen = ["agents.2.policy=own", "agents.2.trainable=false"]
    run = _finished_run(tmp_path / "frozen", *frozen)
    trainer = _continual(run, *frozen).trainer
    base, _ = load_policy(demo_model_dir)
    saved, _ = load_policy(_checkpoint(run) / "model")
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(_logprobs(trainer.actors["final"].model, ids), _logprobs(base, ids))
    assert torch.equal(_logprobs(trainer.actors["shared"].model, ids), _logprobs(saved, ids))
    assert not torch.equal(_logprobs(saved, ids), _logprobs(base, ids))


def test_a_continual_run_stopped_before_its_first_checkpoint_resumes_as_continual(earlier, tmp_path, monkeypatch):
    from trainers.continual import Continual
    from trainers.run import RunOptions, run_scenario

    out, settings = tmp_path / "stopped", SMALL + NEW + ["train.continual.kl=0.1"]
    real = Continual.evaluate_old

    def dies(self):
        raise RuntimeError("killed while measuring the old held-out set")

    monkeypatch.setattr(Continual, "evaluate_old", dies)
    with pytest.raises(RuntimeError, match="killed"):
        run_scenario(RunOptions("relay", settings, out=str(out), tracker="none", init_from=str(earlier)), log=_quiet)
    monkeypatch.setattr(Continual, "evaluate_old", real)
    summary = run_scenario(RunOptions("relay", settings, out=str(out), tracker="none", resume=True), log=_quiet)
    assert summary["continual"]["init_from"] == str(earlier.resolve())
    assert json.loads((out / "continual.json").read_text())["old_before"]["team_success"] >= 0


def test_an_earlier_run_whose_scenario_file_changed_is_refused(tmp_path):
    from helpers.scenario_files import GOOD

    from trainers.continual import ContinualError, _earlier_scenario, _file_sha256

    source = tmp_path / "tiny.yaml"
    source.write_text(GOOD)
    record = {"source": str(source), "source_sha256": _file_sha256(source), "overrides": []}
    assert _earlier_scenario(tmp_path, record).spec.name == "tiny"
    source.write_text(GOOD.replace('answer: "2"', 'answer: "3"'))
    with pytest.raises(ContinualError, match="changed since the run"):
        _earlier_scenario(tmp_path, record)
