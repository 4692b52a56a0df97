"""Which models a checkpoint holds, and which checkpoint a path names (what `marl eval --checkpoint` reads).

    RUN/checkpoints/step-000200/model/          the 'shared' policy (every agent with policy: shared)
    RUN/checkpoints/step-000200/model-<agent>/  the policy of the agent with that name (policy: own)
    RUN/checkpoints/latest                      the name of the newest complete checkpoint

With train.lora the model directories are LoRA adapters (peft's adapter_config.json and
adapter_model.safetensors, plus marl_base.json naming the base directory and its fingerprint;
trainers/policy/adapters.py), never full models.

A path is a checkpoint when it holds such a model directory (a directory with a config.json, or an
adapter's adapter_config.json), and a run directory when it holds checkpoints/; a run directory means its newest complete checkpoint. Every
wrong path is a CheckpointError whose message says what to pass instead. The full layout, and how
checkpoints are written, is in trainers/records/checkpoint.py (imported only when a path is resolved,
since it loads torch).
"""

from __future__ import annotations

from pathlib import Path

from trainers.records.interrupted import is_unfinished

MODEL_FILES = ("config.json", "adapter_config.json")  # a full model, or a LoRA adapter (peft)


def checkpoint_models(checkpoint: Path) -> dict[str, Path]:
    """Actor name -> model (or adapter) directory of a checkpoint ('shared' for model/, the agent for model-<agent>/)."""
    found = {}
    for directory in sorted(checkpoint.glob("model*")):
        if any((directory / name).exists() for name in MODEL_FILES) and (directory.name == "model" or directory.name.startswith("model-")):
            found["shared" if directory.name == "model" else directory.name.removeprefix("model-")] = directory
    return found


def resolve_checkpoint(path: str | None) -> Path | None:
    """The checkpoint directory named by `path` (a run directory means its newest checkpoint); None for None.

    CheckpointError when the path is no directory, a damaged checkpoint, a run without a complete
    checkpoint, or neither a run directory nor a checkpoint.
    """
    from trainers.records.checkpoint import CheckpointError, latest_checkpoint, verified_checkpoint

    if path is None:
        return None
    given = Path(path)
    if is_unfinished(given) and given.parent.name == "checkpoints":
        raise CheckpointError(f"--checkpoint {path}: an unfinished checkpoint, left by a write that was interrupted "
                              "(it is removed when the run next starts); pass a checkpoints/step-N directory or the "
                              "run directory")
    if not given.is_dir():
        raise CheckpointError(f"--checkpoint {path}: no such directory (pass a run directory or its "
                              "checkpoints/step-N directory)")
    if checkpoint_models(given):
        return verified_checkpoint(given)  # a damaged checkpoint is one line, not a load traceback
    if (given / "checkpoints").is_dir():
        latest = latest_checkpoint(given)
        if latest is None:
            raise CheckpointError(f"--checkpoint {path}: the run has no complete checkpoint (checkpoints/latest "
                                  "names none); pass a checkpoints/step-N directory")
        return latest
    raise CheckpointError(f"--checkpoint {path}: neither a run directory (no checkpoints/) nor a checkpoint "
                          "(no model/ or model-<agent>/ directory)")


def run_dir_of(checkpoint: Path | None) -> Path | None:
    """The run directory a checkpoint belongs to (RUN/checkpoints/step-N -> RUN), else None."""
    if checkpoint is not None and checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent
    return None
