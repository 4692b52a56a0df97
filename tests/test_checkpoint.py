"""Atomic checkpoints and exact resume: a resumed run continues like an uninterrupted one."""

import json

import pytest
import torch

from marl.types import Task
from trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from trainers.grpo import GRPOConfig, GRPOTrainer

CONFIG = dict(prompts_per_step=4, group_size=4, max_new_tokens=4, lr=1e-3, beta=0.04, buckets=2, seed=7,
              lr_schedule="cosine", steps=4)


def _tasks():
    return [Task(id=f"t{i}", prompt=f"{10 + i}+{20 + i}=", answer=str(30 + 2 * i)) for i in range(12)]


def _reward(task, text):
    return float(len(text) % 3 == 1)


def _trainer(micro_policy, **overrides):
    model, tokenizer = micro_policy()
    return GRPOTrainer(model, tokenizer, _tasks(), _reward, GRPOConfig(**{**CONFIG, **overrides}))


def _comparable(metrics):
    return {k: v for k, v in metrics.items() if not k.startswith("time/")}


def test_resume_continues_exactly_like_an_uninterrupted_run(micro_policy, tmp_path):
    straight = _trainer(micro_policy)
    reference_history = [_comparable(straight.step()) for _ in range(4)]

    first = _trainer(micro_policy)
    first.step(), first.step()
    saved = save_checkpoint(first, tmp_path)
    del first
    resumed = _trainer(micro_policy)
    load_checkpoint(resumed, latest_checkpoint(tmp_path))
    assert resumed.step_count == 2
    resumed_history = [_comparable(resumed.step()) for _ in range(2)]

    assert saved.name == "step-000002"
    assert resumed_history == reference_history[2:]
    for (name, a), (_, b) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), f"{name} differs after resume"


def test_checkpoints_are_complete_pruned_and_pointed_to(micro_policy, tmp_path):
    trainer = _trainer(micro_policy)
    assert latest_checkpoint(tmp_path) is None
    for _ in range(3):
        trainer.step()
        save_checkpoint(trainer, tmp_path)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["step-000002", "step-000003"]
    assert latest_checkpoint(tmp_path).name == "step-000003"
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp leftovers
    from trainers.tinylm import load_policy

    model, _ = load_policy(latest_checkpoint(tmp_path) / "model")
    torch.testing.assert_close(model.lm_head.weight, trainer.model.lm_head.weight, rtol=0, atol=0)


def test_resuming_with_another_config_is_refused(micro_policy, tmp_path):
    trainer = _trainer(micro_policy)
    trainer.step()
    save_checkpoint(trainer, tmp_path)
    other = _trainer(micro_policy, lr=5e-4)
    with pytest.raises(ValueError, match="lr"):
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
