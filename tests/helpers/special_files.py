"""Special files where a regular file is expected: what the hostile-input tests put in a file's place."""

from __future__ import annotations

import os
from pathlib import Path

SPECIAL_KINDS = ("fifo", "dev_zero", "folder")


def make_special(path: Path, kind: str) -> None:
    """Put a named pipe, a link to /dev/zero or a folder at `path` (kind: one of SPECIAL_KINDS)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "folder":
        path.mkdir()
    else:
        raise ValueError(f"unknown special file kind {kind!r}: one of {SPECIAL_KINDS}")
