"""A run directory's life: opened fresh, resumed, or started again; its state file; write failures.

    OUT/run.json   {"wandb_run_id": ..., "starts": [{"step": 0, "time": ...}, {"step": 4, ...}]}

A directory that holds a run with a checkpoint continues only with `--resume` (from its newest intact
checkpoint; what interrupted checkpoint writes left is removed first, trainers/records/interrupted.py). One that holds the files of a run that stopped before its first checkpoint is never
appended to: `--resume` starts it again from step 0, replacing those files, and without `--resume`
marl refuses and says so. A directory marl cannot write to is refused before any work, and a write
that fails mid-run (a full disk, `ulimit -f`) stops the run with one line naming the file, the intact
checkpoint and the command that continues.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from common.files import write_text_atomically
from trainers.records.interrupted import remove_leftovers
from trainers.records.runfiles import RESTORE, RunFileProblem, read_run_json

STATE_FILE = "run.json"
RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a W&B run id as run.json may hold it (marl writes 8 hex digits)
# everything a run writes into its directory (a run that stopped before its first checkpoint leaves some)
RUN_FILES = ("metrics.jsonl", "tables", "before.json", "warmup.json", "after.json", "summary.json", "report.md",
             "plots", "checkpoints", "wandb", "scenario.json", "continual.json", STATE_FILE)


class RunDirectoryError(RuntimeError):
    """The run directory cannot be used as asked (the message says why and what to do)."""


def open_run_directory(out: Path, resume: bool, log: Callable[[str], None] = print) -> Path | None:
    """Make `out` ready for a run; return the checkpoint to resume from (None: start at step 0).

    Raises RunDirectoryError (or CheckpointError when every checkpoint is damaged) with the advice
    that works: the command line to pass next.
    """
    from trainers.records.checkpoint import resume_checkpoint

    out = Path(out)
    if resume and not out.exists():
        raise RunDirectoryError(f"--resume: {out} does not exist; pass --out with the run directory to continue")
    ensure_writable(out)
    found = [name for name in RUN_FILES if (out / name).exists()]
    if not resume:
        if found:
            raise RunDirectoryError(_holds_a_run(out, found))
        return None
    removed = remove_leftovers(out)
    if removed:
        log(f"removed what interrupted checkpoint writes left in {out / 'checkpoints'}: {', '.join(removed)}")
    checkpoint = resume_checkpoint(out, log)
    if checkpoint is None and found:
        log(f"--resume: {out} has no checkpoint (the run stopped before its first one); starting again from "
            f"step 0, replacing {', '.join(found)}")
        for name in found:
            _remove(out / name)
    return checkpoint


def _holds_a_run(out: Path, found: list[str]) -> str:
    from trainers.records.checkpoint import checkpoint_dirs

    if checkpoint_dirs(out):
        return f"{out} already holds a run; pass --resume to continue it or --out NEWDIR"
    return (f"{out} holds a run that stopped before its first checkpoint ({', '.join(found)}); pass --resume to "
            "start it again from step 0 (those files are replaced) or --out NEWDIR")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def check_folder_path(out: Path) -> None:
    """RunDirectoryError when a file, a FIFO or a device stands where the run directory or one of its parents
    should be (named as such, not as 'not writable'); nothing is created, so a run checks it before any work."""
    out = Path(out)
    blocker = next((path for path in (out, *out.parents) if path.exists() and not path.is_dir()), None)
    if blocker is not None:
        where = " is" if blocker == out else f": {blocker} is"
        raise RunDirectoryError(f"run directory {out}{where} a file, not a folder; pass --out with a folder path (a "
                                "new one, or the run directory to continue with --resume)")


def ensure_writable(out: Path) -> None:
    """Create `out` if needed and prove a file can be created in it; RunDirectoryError otherwise."""
    check_folder_path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".marl-write-test.", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise RunDirectoryError(f"run directory {out} is not writable ({error.strerror or error}); make it "
                                "writable (chmod u+w) or pass --out with a writable directory") from None


def wandb_run_id(out: Path, step: int) -> str:
    """The W&B run id of this run directory (made on its first start), recording this start's step,
    so every resume continues the same W&B run."""
    path = Path(out) / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    state = _read_state(path)
    state.setdefault("wandb_run_id", secrets.token_hex(4))
    state.setdefault("starts", []).append({"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    write_text_atomically(path, json.dumps(state, indent=2) + "\n")
    return state["wandb_run_id"]


def _read_state(path: Path) -> dict:
    """run.json ({} before the first start), read as every file of a run folder is (runfiles.py): a FIFO, a
    link to /dev/zero, bytes that are not UTF-8 or JSON, a 5,000-digit integer are one line, never a hang."""
    try:
        state = read_run_json(path, missing={})
    except RunFileProblem as error:
        raise RunDirectoryError(str(error)) from None
    starts, run_id = state.get("starts", []), state.get("wandb_run_id", "0")
    # the id names W&B's offline folders, which a resume globs and removes: letters, digits, - and _ only
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id) or not isinstance(starts, list) \
            or not all(isinstance(start, dict) for start in starts):
        raise RunDirectoryError(f"{path} is not a marl run state file (its wandb_run_id or starts are not as marl "
                                f"writes them); {RESTORE}")
    return state


def write_failure(out: Path, error: OSError, step: int) -> str:
    """The one line for a write that failed mid-run: which file, why, what is intact, how to go on."""
    from trainers.records.checkpoint import latest_checkpoint

    where = f"{error.filename}: " if error.filename else ""
    last = latest_checkpoint(out, full=False)
    kept = (f"the last complete checkpoint, {last.name}, is intact" if last
            else "there is no checkpoint yet, so --resume starts again from step 0")
    return (f"cannot write {where}{error.strerror or error} (stopped at step {step}; nothing already written "
            f"is lost, {kept}); free some space, raise the file size limit (ulimit -f) or make {out} "
            "writable, then continue with --resume")


@contextmanager
def failed_writes_stop_the_run(out: Path, steps_done: Callable[[], int], error: type[Exception] = RunDirectoryError):
    """Inside the block, a write under `out` that fails (a full disk, `ulimit -f`, a read-only file)
    raises `error` with `write_failure`'s one line; a missing input file elsewhere passes through."""
    try:
        yield
    except OSError as failure:
        if isinstance(failure, FileNotFoundError) and not str(failure.filename or "").startswith(str(out)):
            raise  # a missing input file, not a failed write
        raise error(write_failure(Path(out), failure, steps_done())) from None
