"""Directories and small files written so that a crash never leaves a half-written one in place.

Everything is written into a temporary sibling first and renamed into place (a rename within one
file system is atomic), so readers see either the old complete version or the new complete one.
Used by checkpoints (`trainers/checkpoint.py`) and the tiny-model cache (`trainers/tinylm.py`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_directory_atomically(target: Path, write: Callable[[Path], None], *, keep_existing: bool = False) -> None:
    """Call `write(tmp)` on a fresh temporary sibling of `target`, then rename it to `target`.

    An existing `target` is swapped out (and put back if the rename fails); with `keep_existing` it
    is kept instead and the new copy dropped (two processes building the same cached directory). The
    temporary directory is removed whatever happens.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        if target.exists() and keep_existing:
            return
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_atomically(path: Path, text: str) -> None:
    """Write a small text file through a synced temporary file and an atomic rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename the finished directory to its name; an older one of that name is swapped out first."""
    if not target.exists():
        os.replace(tmp, target)
        return
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except OSError:
        os.replace(old, target)  # put the complete one back where readers look for it
        raise
    shutil.rmtree(old, ignore_errors=True)
