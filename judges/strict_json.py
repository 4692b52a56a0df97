"""Strict JSON and atomic files for what marl writes (reports, calibrators, run files): no NaN or
Infinity, never a torn file.

Python's json writes NaN and Infinity as bare tokens that strict parsers (browsers, jq, most other
languages) reject. `plain` turns numpy values into plain numbers and every non-finite float into None,
recording where each one was; `atomic_file` and `write_text_atomically` write through a synced temporary
sibling and a rename, so a reader sees the old complete file or the new one (trainers.runs.atomic adds
whole directories). Standard library and numpy only.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any


def plain(value: Any, nulls: dict[str, str] | None = None, path: str = "") -> Any:
    """`value` as plain JSON data: numpy scalars and arrays become numbers and lists, tuples become lists,
    and every NaN or infinity becomes None, with `nulls[path] = "nan: not a finite number, written as null"`."""
    if isinstance(value, Mapping):
        return {str(k): plain(v, nulls, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()  # a numpy or torch scalar or array
    if isinstance(value, list | tuple):
        return [plain(v, nulls, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        if nulls is not None:
            nulls[path] = f"{value!r}: not a finite number, written as null"
        return None
    return value


def all_finite(value: Any) -> bool:
    """Whether every float inside `value` (nested dicts and lists) is finite."""
    if isinstance(value, dict):
        return all(all_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(all_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


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
