"""Strict JSON for what judges write (reports, calibrators): no NaN or Infinity, never a torn file.

Python's json writes NaN and Infinity as bare tokens that strict parsers (browsers, jq, most other
languages) reject. `plain` turns numpy values into plain numbers and every non-finite float into None,
recording where each one was; `write_text_atomically` writes through a synced temporary sibling and a
rename, so a reader sees the old complete file or the new one. Standard library and numpy only.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any


def plain(value: Any, nulls: dict[str, str] | None = None, path: str = "") -> Any:
    """`value` as plain JSON data: numpy scalars and arrays become numbers and lists, tuples become lists,
    and every NaN or infinity becomes None, with `nulls[path] = "nan: not a finite number, written as null"`."""
    if isinstance(value, dict):
        return {str(k): plain(v, nulls, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()  # a numpy scalar or array
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


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write `text` to a synced temporary sibling of `path`, then rename it into place (the temporary file
    is removed if anything fails, so nothing half-written is left beside it)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
