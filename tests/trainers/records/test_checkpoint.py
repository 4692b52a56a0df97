"""Atomic checkpoints and exact resume: a resumed run continues like an uninterrupted one.

The trainer is `marl demo`'s: MultiAgentTrainer on the one-agent addition scenario, its solver played by the
micro policy; every step has a signal (`by_seed`), so every step updates the model and the optimizer.
"""

import json

import pytest
import torch

from marl.scenario.load import load_scenario
from trainers.config import resolve_config
from trainers.grpo.config import GRPOConfig
from trainers.policy.actors import ModelActor
from trainers.records.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from trainers.team.trainer import MultiAgentTrainer, StepPlan
from helpers.signal import by_seed

CONFIG = dict(prompts_per_step=4, group_size=4, max_new_tokens=4, lr=1e-3, beta=0.04, buckets=2, seed=7,
              lr_schedule="cosine", steps=4)
SIGNAL = StepPlan(reward_transform=by_seed)


def _trainer(micro_policy, **overrides):
    spec = load_scenario("addition")
    model, tokenizer = micro_policy()
    actors = {"shared": ModelActor("shared", model, tokenizer, trainable=True, seed=0)}
    config = resolve_config(spec, grpo=GRPOConfig(**{**CONFIG, **overrides}))
    return MultiAgentTrainer(spec, actors, {"solver": "shared"}, spec.split()[0], config, log=lambda message: None)


def _model(trainer):
    return trainer.actors["shared"].model


def _comparable(metrics):
    return {k: v for k, v in metrics.items() if not k.startswith("time/")}


def test_resume_continues_exactly_like_an_uninterrupted_run(micro_policy, tmp_path):
    straight = _trainer(micro_policy)
    reference_history = [_comparable(straight.step(SIGNAL)) for _ in range(4)]

    first = _trainer(micro_policy)
    first.step(SIGNAL), first.step(SIGNAL)
    saved = save_checkpoint(first, tmp_path)
    del first
    resumed = _trainer(micro_policy)
    load_checkpoint(resumed, latest_checkpoint(tmp_path))
    assert resumed.step_count == 2
    resumed_history = [_comparable(resumed.step(SIGNAL)) for _ in range(2)]

    assert saved.name == "step-000002"
    assert resumed_history == reference_history[2:]
    for (name, a), (_, b) in zip(_model(straight).named_parameters(), _model(resumed).named_parameters()):
        assert torch.equal(a, b), f"{name} differs after resume"


def test_checkpoints_are_complete_pruned_and_pointed_to(micro_policy, tmp_path):
    trainer = _trainer(micro_policy)
    assert latest_checkpoint(tmp_path) is None
    for _ in range(3):
        trainer.step(SIGNAL)
        save_checkpoint(trainer, tmp_path)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["step-000002", "step-000003"]
    assert latest_checkpoint(tmp_path).name == "step-000003"
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp leftovers
    from trainers.policy.tinylm import load_policy

    model, _ = load_policy(latest_checkpoint(tmp_path) / "model")
    torch.testing.assert_close(model.lm_head.weight, _model(trainer).lm_head.weight, rtol=0, atol=0)


def test_resuming_with_another_config_is_refused(micro_policy, tmp_path):
    trainer = _trainer(micro_policy)
    trainer.step(SIGNAL)
    save_checkpoint(trainer, tmp_path)
    other = _trainer(micro_policy, lr=5e-4)
    with pytest.raises(CheckpointError, match="different config.*lr"):
        load_checkpoint(other, latest_checkpoint(tmp_path))
    longer = _trainer(micro_policy, steps=10)  # more steps is a continuation, not a different run
    load_checkpoint(longer, latest_checkpoint(tmp_path))
    assert longer.step_count == 1


def test_loading_a_non_checkpoint_says_what_to_pass(micro_policy, tmp_path):
    with pytest.raises(FileNotFoundError, match="state.pt"):
        load_checkpoint(_trainer(micro_policy), tmp_path)


def test_a_dangling_latest_pointer_is_ignored(micro_policy, tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text(json.dumps("step-000009"))
    assert latest_checkpoint(tmp_path) is None


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    return len(data), int(len(data) * keep)


def _two_checkpoints(micro_policy, tmp_path):
    trainer = _trainer(micro_policy)
    for _ in range(2):
        trainer.step(SIGNAL)
        save_checkpoint(trainer, tmp_path)
    return trainer


def test_every_checkpoint_has_a_manifest_of_sizes_and_checksums(micro_policy, tmp_path):
    import hashlib

    _two_checkpoints(micro_policy, tmp_path)
    checkpoint = tmp_path / "checkpoints" / "step-000002"
    files = json.loads((checkpoint / "manifest.json").read_text())["files"]
    on_disk = sorted(p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*")
                     if p.is_file() and p.name != "manifest.json")
    assert sorted(files) == on_disk and "state.pt" in files and "model/model.safetensors" in files
    state = (checkpoint / "state.pt").read_bytes()
    assert files["state.pt"] == {"bytes": len(state), "sha256": hashlib.sha256(state).hexdigest()}


@pytest.mark.parametrize("damaged", ["state.pt", "model/model.safetensors"])
def test_a_truncated_file_makes_resume_fall_back_to_the_newest_intact_checkpoint(micro_policy, tmp_path, damaged):
    from trainers.records.checkpoint import resume_checkpoint

    _two_checkpoints(micro_policy, tmp_path)
    full, cut = _truncate(tmp_path / "checkpoints" / "step-000002" / damaged)
    lines = []
    assert resume_checkpoint(tmp_path, lines.append).name == "step-000001"
    assert lines == [f"checkpoint step-000002 ({damaged} is {cut} bytes, the manifest says {full}) is damaged; "
                     "resuming from step-000001, the newest intact one"]
    assert latest_checkpoint(tmp_path).name == "step-000001"


def test_a_changed_byte_is_caught_by_the_checksum(micro_policy, tmp_path):
    from trainers.records.checkpoint import checkpoint_problem

    _two_checkpoints(micro_policy, tmp_path)
    path = tmp_path / "checkpoints" / "step-000002" / "model" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert checkpoint_problem(path.parent.parent) == "model/model.safetensors does not match its sha256 in the manifest"
    assert checkpoint_problem(path.parent.parent, full=False) is None  # same size: only the checksum sees it
    assert latest_checkpoint(tmp_path).name == "step-000001"


def test_no_intact_checkpoint_is_refused_with_advice(micro_policy, tmp_path):
    from trainers.records.checkpoint import resume_checkpoint

    _two_checkpoints(micro_policy, tmp_path)
    for name in ("step-000001", "step-000002"):
        _truncate(tmp_path / "checkpoints" / name / "state.pt")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint in .*all are damaged: step-000002 \(state.pt is "
                       r".*start a new run with --out NEWDIR"):
        resume_checkpoint(tmp_path, print)


def test_a_damaged_latest_checkpoint_is_never_kept_as_the_final_one(micro_policy, tmp_path):
    from trainers.records.checkpoint import checkpoint_problem, final_checkpoint

    trainer = _two_checkpoints(micro_policy, tmp_path)
    _truncate(tmp_path / "checkpoints" / "step-000002" / "model" / "model.safetensors")
    final = final_checkpoint(trainer, tmp_path)
    assert final.name == "step-000002" and checkpoint_problem(final) is None
    from trainers.policy.tinylm import load_policy

    model, _ = load_policy(final / "model")
    torch.testing.assert_close(model.lm_head.weight, _model(trainer).lm_head.weight, rtol=0, atol=0)


def test_loading_a_damaged_checkpoint_is_one_clear_error(micro_policy, tmp_path):
    from trainers.records.checkpoint import CheckpointError

    _two_checkpoints(micro_policy, tmp_path)
    checkpoint = tmp_path / "checkpoints" / "step-000002"
    full, cut = _truncate(checkpoint / "state.pt")
    with pytest.raises(CheckpointError, match=rf"checkpoint {checkpoint} is damaged: state.pt is {cut} bytes, the "
                       rf"manifest says {full}; pass an intact checkpoints/step-N directory"):
        load_checkpoint(_trainer(micro_policy), checkpoint)
    (checkpoint / "manifest.json").unlink()  # an older checkpoint without a manifest: torch's error, in one line
    with pytest.raises(CheckpointError, match=r"state.pt cannot be read \(.*\); resume from an older"):
        load_checkpoint(_trainer(micro_policy), checkpoint)
