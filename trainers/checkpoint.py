"""Atomic checkpoints of a GRPOTrainer and exact resume.

Layout under a run directory:

    checkpoints/step-000010/state.pt   trainer.state_dict(): model, optimizer, schedule, RNGs, sampler, guards
    checkpoints/step-000010/model/     the policy as a Hugging Face directory (loadable by load_policy);
                                       a multi-agent run adds model-<actor>/ for each agent with its own model
    checkpoints/latest                 the name of the newest complete checkpoint

Every checkpoint is written into a temporary directory and renamed into place, and `latest` is
replaced atomically, so a crash mid-write never leaves a half checkpoint that resume would read.
"""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from trainers.atomic import write_directory_atomically, write_text_atomically

KEEP_LAST = 2  # complete checkpoints kept on disk


def save_checkpoint(trainer, run_dir: str | Path) -> Path:
    """Write the trainer's full state under run_dir/checkpoints/step-N atomically; return its path."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{trainer.step_count:06d}"
    target = root / name
    try:
        write_directory_atomically(target, lambda tmp: _write_state(trainer, tmp))
        write_text_atomically(root / "latest", name)
    except (OSError, RuntimeError) as error:  # a full disk: torch raises RuntimeError, the rest OSError
        last = latest_checkpoint(run_dir)
        raise CheckpointError(f"could not write checkpoint {name} in {root} ({error}); the last complete "
                              f"checkpoint, {last.name if last else 'none'}, is intact: free some space and "
                              "continue with --resume") from error
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-KEEP_LAST]:
        shutil.rmtree(old, ignore_errors=True)
    return target


@contextmanager
def checkpoint_on_interrupt(trainer, run_dir: str | Path, log: Callable[[str], None] = print) -> Iterator:
    """Ctrl-C stops the run at the next step boundary with a checkpoint, then re-raises KeyboardInterrupt.

    Yields `stop_requested()`, which the step loop checks after every step. A checkpoint written in
    the middle of a step would hold the update of a step it does not count, so the first Ctrl-C only
    asks; a second one stops at once, without a checkpoint (the last periodic one stands).
    """
    state = {"requested": False, "aborted": False}

    def request(signum, frame):
        if state["requested"]:
            state["aborted"] = True
            raise KeyboardInterrupt
        state["requested"] = True
        log("\nCtrl-C: stopping after this step with a checkpoint (press it again to stop at once, without one)")

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, request) if in_main_thread else None
    try:
        yield lambda: state["requested"]
    except KeyboardInterrupt:
        if state["aborted"] or not state["requested"] and in_main_thread:
            last = latest_checkpoint(run_dir)
            log(f"\nstopped at once: no checkpoint written; the last one is {last.name if last else 'none'}")
            raise
        save_checkpoint(trainer, run_dir)
        log(f"\ninterrupted: checkpoint written at step {trainer.step_count}; continue with --resume")
        raise
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the previous complete one is untouched."""


def _write_state(trainer, directory: Path) -> None:
    """state.pt and every trainable model as a Hugging Face directory."""
    torch.save(trainer.state_dict(), directory / "state.pt")
    models = trainer.export_models() if hasattr(trainer, "export_models") else \
        {"model": (trainer.model, trainer.tokenizer)}
    for name, (model, tokenizer) in models.items():
        model.save_pretrained(directory / name)
        tokenizer.save_pretrained(directory / name)


def final_checkpoint(trainer, run_dir: str | Path) -> Path:
    """The checkpoint of the trainer's current step: the latest one when it is already written."""
    latest = latest_checkpoint(run_dir)
    if latest is not None and latest.name == f"step-{trainer.step_count:06d}":
        return latest
    return save_checkpoint(trainer, run_dir)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None if it has none."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / "state.pt").exists() else None


def load_checkpoint(trainer, checkpoint: str | Path) -> None:
    """Restore a trainer (built with the same config and tasks) from a checkpoint directory."""
    state_path = Path(checkpoint) / "state.pt"
    if not state_path.exists():
        raise FileNotFoundError(f"{checkpoint} is not a checkpoint (no state.pt); "
                                "pass a run directory's checkpoints/step-N directory")
    state = torch.load(state_path, weights_only=True)
    saved, current = state["config"], _config_dict(trainer)
    changed = {k for k in saved if k not in ("steps", "threads") and saved.get(k) != current.get(k)}
    if changed:
        details = ", ".join(f"{k}: {saved[k]!r} -> {current.get(k)!r}" for k in sorted(changed))
        raise ValueError(f"checkpoint {checkpoint} was made with a different config ({details}); "
                         "resume with the same settings or start a new run directory")
    trainer.load_state_dict(state)


def _config_dict(trainer) -> dict:
    from dataclasses import asdict

    return asdict(trainer.config)
