"""Files and directories written so that a crash never leaves a half-written one in place.

Everything is written into a temporary sibling first, synced, and renamed into place (a rename within
one file system is atomic), so readers see either the old complete version or the new complete one.
A write that fails (a full disk, `ulimit -f`, a read-only directory) leaves the old version as it was
and no temporary file behind.

    atomic_file(path, mode)                           a handle on a temporary sibling, renamed to `path` on a clean exit
    write_text_atomically(path, text)                 a UTF-8 text file
    write_bytes_atomically(path, data)                a binary file
    write_directory_atomically(target, write, ...)    a whole directory, filled by `write(tmp)`

Used by checkpoints (`trainers/records/checkpoint.py`), the tiny-model cache (`trainers/policy/tinylm.py`),
saved calibrators, the metrics and table rewrites of a resume and every report file. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_file(path: Path | str, mode: str = "w") -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; on a clean exit it is synced and renamed to
    `path`, on an exception it is removed and `path` is left untouched."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        _keep_mode(path, tmp)
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)  # a failed write() names no file; the message should
        raise
    _sync_directory(path.parent)


def write_text_atomically(path: Path | str, text: str) -> None:
    """Write a text file (UTF-8) through a synced temporary file and an atomic rename."""
    with atomic_file(path) as handle:
        handle.write(text)


def write_bytes_atomically(path: Path | str, data: bytes) -> None:
    """Write a binary file through a synced temporary file and an atomic rename."""
    with atomic_file(path, "wb") as handle:
        handle.write(data)


def _keep_mode(path: Path, tmp: str) -> None:
    """mkstemp creates 0600 files; a file that replaces another keeps its permissions, a new one gets
    the usual 0666 minus the umask."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)


def _sync_directory(directory: Path) -> None:
    """fsync a directory so a rename in it survives a power loss (best effort: not every FS allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
