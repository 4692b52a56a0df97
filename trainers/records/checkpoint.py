"""Atomic checkpoints of a trainer (trainers/team/trainer.py) and exact resume.

Layout under a run directory:

    checkpoints/step-000010/state.pt   trainer.state_dict(): model, optimizer, schedule, RNGs, sampler, guards
    checkpoints/step-000010/model/     the policy as a Hugging Face directory (loadable by load_policy);
                                       a multi-agent run adds model-<actor>/ for each agent with its own model;
                                       with train.lora each is the actor's LoRA adapter only (peft's
                                       save_pretrained, plus marl_base.json: the base directory and its
                                       fingerprint), and state.pt holds adapter weights, not models
    checkpoints/step-000010/manifest.json  size and sha256 of every file above (trainers/records/manifest.py)
    checkpoints/latest                 the name of the newest complete checkpoint

Every checkpoint is written into a temporary directory, its manifest last, and renamed into place,
and `latest` is replaced atomically, so a crash mid-write never leaves a half checkpoint that resume
would read; what such a crash leaves is removed at the next start and the next write
(trainers/records/interrupted.py). A checkpoint damaged later (a file cut short or changed) fails its manifest: resume skips
it for the newest intact one and says so, and it is never kept as a run's final checkpoint.
"""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from common.files import write_directory_atomically, write_text_atomically
from trainers.records.interrupted import checkpoints_lock, remove_leftovers_locked
from trainers.records.manifest import manifest_problem, write_manifest

KEEP_LAST = 2  # complete checkpoints kept on disk


def save_checkpoint(trainer, run_dir: str | Path) -> Path:
    """Write the trainer's full state under run_dir/checkpoints/step-N atomically; return its path.

    The write holds the lock of the checkpoints folder (trainers/records/interrupted.py), and first
    removes what interrupted writes left there."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{trainer.step_count:06d}"
    target = root / name
    try:
        with checkpoints_lock(root) as held:
            if held:
                remove_leftovers_locked(root)
            write_directory_atomically(target, lambda tmp: _write_state(trainer, tmp))
            write_text_atomically(root / "latest", name)
    except (OSError, RuntimeError) as error:  # a full disk: torch raises RuntimeError, the rest OSError
        last = latest_checkpoint(run_dir, full=False)
        kept = (f"the last complete checkpoint, {last.name}, is intact: free some space and continue with --resume"
                if last else "there is no complete checkpoint yet: free some space and run again with --resume "
                "(it starts again from step 0)")
        raise CheckpointError(f"could not write checkpoint {name} in {root} ({_first_line(error)}); {kept}") from error
    for old in checkpoint_dirs(run_dir)[KEEP_LAST:]:
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
            last = latest_checkpoint(run_dir, full=False)
            log("\nstopped at once: no checkpoint written; " + (f"the last one is {last.name}" if last else
                "there is none yet (--resume starts again from step 0)"))
            raise
        save_checkpoint(trainer, run_dir)
        log(f"\ninterrupted: checkpoint written at step {trainer.step_count}; continue with --resume")
        raise
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (the previous complete one is untouched), or cannot be resumed
    from (damaged, or made with other settings)."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else error.__class__.__name__


def _write_state(trainer, directory: Path) -> None:
    """state.pt and every trainable model as a Hugging Face directory, then the manifest of them all."""
    torch.save(trainer.state_dict(), directory / "state.pt")
    models = trainer.export_models() if hasattr(trainer, "export_models") else \
        {"model": (trainer.model, trainer.tokenizer)}
    for name, (model, tokenizer) in models.items():
        model.save_pretrained(directory / name)
        tokenizer.save_pretrained(directory / name)
    write_manifest(directory)  # last: its presence means every file above was written whole


def final_checkpoint(trainer, run_dir: str | Path) -> Path:
    """The checkpoint of the trainer's current step: the latest one when it is already written and
    intact (a damaged one is written again)."""
    latest = Path(run_dir) / "checkpoints" / f"step-{trainer.step_count:06d}"
    if checkpoint_problem(latest) is None:
        return latest
    return save_checkpoint(trainer, run_dir)


def checkpoint_problem(path: str | Path, full: bool = True) -> str | None:
    """Why `path` is not an intact checkpoint (no state.pt, a file that fails the manifest), or None."""
    path = Path(path)
    if not (path / "state.pt").is_file():
        return "no state.pt"
    return manifest_problem(path, full=full)


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Every step-N directory of a run, newest first."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step-*") if p.is_dir() and p.name[5:].isdigit()] if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)


def latest_checkpoint(run_dir: str | Path, full: bool = True) -> Path | None:
    """The newest intact checkpoint of a run directory, or None if it has none.

    `checkpoints/latest` names the newest complete one; a newer directory can only be a complete one
    whose pointer update was cut off, and a damaged one (see `checkpoint_problem`) is skipped.
    """
    return next((p for p in checkpoint_dirs(run_dir) if checkpoint_problem(p, full) is None), None)


def resume_checkpoint(run_dir: str | Path, log: Callable[[str], None] = print) -> Path | None:
    """The checkpoint a resume starts from: the newest intact one, saying in one line which newer
    ones were damaged. None when the run has no checkpoint at all; CheckpointError when it has some
    but none is intact."""
    damaged = []
    for path in checkpoint_dirs(run_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            if damaged:
                verb = "is" if len(damaged) == 1 else "are"
                log(f"checkpoint {', '.join(damaged)} {verb} damaged; resuming from {path.name}, the newest intact one")
            return path
        damaged.append(f"{path.name} ({problem})")
    if damaged:
        raise CheckpointError(f"no intact checkpoint in {Path(run_dir) / 'checkpoints'}, all are damaged: "
                              f"{'; '.join(damaged)}; "
                              "start a new run with --out NEWDIR, or remove that checkpoints directory and "
                              "run again with --resume to start from step 0")
    return None


def verified_checkpoint(path: str | Path) -> Path:
    """`path` itself when it is an intact checkpoint (or a model directory without a manifest);
    CheckpointError naming the damaged file otherwise."""
    problem = manifest_problem(Path(path))
    if problem:
        raise CheckpointError(f"checkpoint {path} is damaged: {problem}; pass an intact checkpoints/step-N "
                              "directory or the run directory (its newest intact checkpoint)")
    return Path(path)


def read_state(checkpoint: str | Path) -> dict:
    """The trainer state (state.pt) of a verified checkpoint, read as weights only (no pickled code runs);
    FileNotFoundError without one, CheckpointError when it is damaged."""
    state_path = Path(checkpoint) / "state.pt"
    if not state_path.exists():
        raise FileNotFoundError(f"{checkpoint} is not a checkpoint (no state.pt); "
                                "pass a run directory's checkpoints/step-N directory")
    verified_checkpoint(checkpoint)
    try:
        return torch.load(state_path, weights_only=True)
    except Exception as error:  # a damaged file without a manifest: torch raises many types
        raise CheckpointError(f"{state_path} cannot be read ({_first_line(error)}); resume from an older "
                              "checkpoints/step-N directory or start a new run with --out NEWDIR") from None


def load_checkpoint(trainer, checkpoint: str | Path) -> None:
    """Restore a trainer (built with the same config and tasks) from a checkpoint directory."""
    state = read_state(checkpoint)
    saved, current = state["config"], _config_dict(trainer)
    changed = {k for k in saved if k not in ("steps", "threads") and saved.get(k) != current.get(k)}
    if changed:
        details = ", ".join(f"{k}: {saved[k]!r} -> {current.get(k)!r}" for k in sorted(changed))
        raise CheckpointError(f"checkpoint {checkpoint} was made with a different config ({details}); "
                         "resume with the same settings or start a new run directory")
    _check_adapter_bases(trainer, Path(checkpoint))
    trainer.load_state_dict(state)


def _check_adapter_bases(trainer, checkpoint: Path) -> None:
    """LoRA adapters resume only on the base they were trained on: CheckpointError naming both otherwise."""
    models = trainer.export_models() if hasattr(trainer, "export_models") else {}
    for name, (model, _) in models.items():
        check = getattr(model, "check_saved_base", None)  # an adapter policy (trainers/policy/adapters.py)
        if check is not None and (checkpoint / name).is_dir():
            try:
                check(checkpoint / name)
            except ValueError as error:
                raise CheckpointError(f"cannot resume from {checkpoint}: {error}") from None


def _config_dict(trainer) -> dict:
    return trainer.grpo.model_dump()
