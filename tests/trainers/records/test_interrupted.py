"""What an interrupted checkpoint write leaves is removed at the next start, never taken for a checkpoint,
and never removed from under a live write (issue 31, item 2: 67 MB of temporary folders after 10 kills)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT
from trainers.records.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from trainers.records.interrupted import checkpoints_lock, is_unfinished, remove_leftovers
from trainers.records.layout import resolve_checkpoint
from trainers.records.rundir import open_run_directory

# A child that saves step 1, then starts step 2's checkpoint and stops inside it, after the state and
# the model are written and before the manifest (which would make it complete): it says so and waits.
WRITER = r"""
import sys, threading
sys.path[:0] = [sys.argv[2], sys.argv[2] + "/tests"]
from helpers.char_model import micro_char_llama
from marl.scenario.load import load_scenario
from trainers.config import resolve_config
from trainers.grpo.config import GRPOConfig
from trainers.policy.actors import ModelActor
from trainers.records import checkpoint
from trainers.team.trainer import MultiAgentTrainer

spec = load_scenario("addition")
model, tokenizer = micro_char_llama()
actors = {"shared": ModelActor("shared", model, tokenizer, trainable=True, seed=0)}
config = resolve_config(spec, grpo=GRPOConfig(prompts_per_step=2, group_size=2, max_new_tokens=4, seed=7, steps=4))
trainer = MultiAgentTrainer(spec, actors, {"solver": "shared"}, spec.split()[0], config, log=lambda message: None)
trainer.step()
checkpoint.save_checkpoint(trainer, sys.argv[1])
trainer.step()

def stuck(directory):
    print("writing", directory, flush=True)
    threading.Event().wait()

checkpoint.write_manifest = stuck
checkpoint.save_checkpoint(trainer, sys.argv[1])
"""


def _trainer(micro_policy):
    from marl.scenario.load import load_scenario
    from trainers.config import resolve_config
    from trainers.grpo.config import GRPOConfig
    from trainers.policy.actors import ModelActor
    from trainers.team.trainer import MultiAgentTrainer

    spec = load_scenario("addition")
    model, tokenizer = micro_policy()
    actors = {"shared": ModelActor("shared", model, tokenizer, trainable=True, seed=0)}
    config = resolve_config(spec, grpo=GRPOConfig(prompts_per_step=2, group_size=2, max_new_tokens=4, seed=7, steps=4))
    return MultiAgentTrainer(spec, actors, {"solver": "shared"}, spec.split()[0], config, log=lambda message: None)


def test_a_write_killed_with_minus_9_is_removed_at_the_next_start_and_resume_takes_the_last_complete(
        tmp_path, micro_policy):
    out = tmp_path / "run"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(out), str(ROOT)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        said = writer.stdout.readline().split()
        assert said[:1] == ["writing"], said
        unfinished = Path(said[1])
        assert unfinished.parent == out / "checkpoints" and is_unfinished(unfinished)
        assert (unfinished / "state.pt").is_file() and (unfinished / "model").is_dir()
        assert remove_leftovers(out) == [] and unfinished.is_dir()  # its writer is alive: left alone
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert writer.returncode == -signal.SIGKILL and unfinished.is_dir()  # what a kill -9 leaves

    lines = []
    resumed_from = open_run_directory(out, resume=True, log=lines.append)
    assert resumed_from == out / "checkpoints" / "step-000001"
    assert not unfinished.exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-000001"]
    assert lines[0].startswith(f"removed what interrupted checkpoint writes left in {out / 'checkpoints'}: "
                               f"{unfinished.name} (") and lines[0].endswith(" MB)")
    trainer = _trainer(micro_policy)
    load_checkpoint(trainer, resumed_from)
    assert trainer.step_count == 1


def test_the_next_checkpoint_write_removes_what_an_interrupted_one_left(tmp_path, micro_policy):
    leftover = tmp_path / "checkpoints" / ".step-000007.abcdefgh"
    (leftover / "model").mkdir(parents=True)
    (leftover / "state.pt").write_bytes(b"half a checkpoint")
    saved = save_checkpoint(_trainer(micro_policy), tmp_path)
    assert sorted(p.name for p in saved.parent.iterdir()) == ["latest", "step-000000"]


def test_hand_made_leftovers_are_removed_or_put_back_and_nothing_else_is_touched(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    (root / "step-000004").mkdir(parents=True)
    (root / "latest").write_text("step-000004")
    for name in (".step-000005.abc_1234", ".step-000001.old", ".step-000002.old"):
        (root / name).mkdir()
        (root / name / "state.pt").write_bytes(b"x" * 1000)
    (root / "step-000001").mkdir()  # beside its swapped-out copy: the copy goes
    (root / ".latest.k3j4ab_c.tmp").write_text("step-000005")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (root / ".step-000009.zzzzzzzz").symlink_to(outside, target_is_directory=True)  # a link of that name
    (root / ".step-000005.abc_1234" / "link").symlink_to(outside, target_is_directory=True)  # a link inside one
    (root / ".step-000010.short").mkdir()  # not a name mkdtemp makes
    (root / "notes.txt").write_text("mine too")

    done = remove_leftovers(tmp_path / "run")
    assert done == [".latest.k3j4ab_c.tmp", ".step-000001.old (0.0 MB)", ".step-000002.old (put back as step-000002)",
                    ".step-000005.abc_1234 (0.0 MB)"]
    assert sorted(p.name for p in root.iterdir()) == [".step-000009.zzzzzzzz", ".step-000010.short", "latest",
                                                      "notes.txt", "step-000001", "step-000002", "step-000004"]
    assert (outside / "keep.txt").read_text() == "mine" and (root / "step-000002" / "state.pt").is_file()


def test_nothing_is_removed_while_another_write_holds_the_lock(tmp_path):
    root = tmp_path / "checkpoints"
    (root / ".step-000003.abcdefgh").mkdir(parents=True)
    with checkpoints_lock(root) as held:
        assert held and remove_leftovers(tmp_path) == [] and (root / ".step-000003.abcdefgh").is_dir()
    assert remove_leftovers(tmp_path) == [".step-000003.abcdefgh (0.0 MB)"]


def test_a_linked_checkpoints_folder_is_not_followed(tmp_path):
    real = tmp_path / "elsewhere"
    (real / ".step-000003.abcdefgh").mkdir(parents=True)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").symlink_to(real, target_is_directory=True)
    assert remove_leftovers(tmp_path / "run") == [] and (real / ".step-000003.abcdefgh").is_dir()


def test_an_unfinished_checkpoint_is_never_taken_for_one(tmp_path):
    unfinished = tmp_path / "run" / "checkpoints" / ".step-000002.abcdefgh"
    (unfinished / "model").mkdir(parents=True)
    (unfinished / "model" / "config.json").write_text("{}")  # looks like a model directory without a manifest
    with pytest.raises(CheckpointError, match=r"an unfinished checkpoint, left by a write that was interrupted"):
        resolve_checkpoint(str(unfinished))
    with pytest.raises(CheckpointError, match="the run has no complete checkpoint"):
        resolve_checkpoint(str(tmp_path / "run"))
