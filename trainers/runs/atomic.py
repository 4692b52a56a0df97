"""Directories and files written so that a crash never leaves a half-written one in place.

Everything is written into a temporary sibling first, synced, and renamed into place (a rename within
one file system is atomic; the file writers live in judges.strict_json, the lowest layer, so that
judges and trainers share one), so readers see either the old complete version or the new complete one.
A write that fails (a full disk, `ulimit -f`, a read-only directory) leaves the old version as it was
and no temporary file behind. Used by checkpoints (`trainers/runs/checkpoint.py`), the tiny-model cache
(`trainers/policy/tinylm.py`), the metrics and table rewrites of a resume and every report file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from judges.strict_json import atomic_file, write_bytes_atomically, write_text_atomically

__all__ = ["atomic_file", "write_bytes_atomically", "write_directory_atomically", "write_text_atomically"]

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
