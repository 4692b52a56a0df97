"""Strict JSON for what marl writes (reports, calibrators, run files): no NaN or Infinity.

Python's json writes NaN and Infinity as bare tokens that strict parsers (browsers, jq, most other
languages) reject. `plain` turns numpy values into plain numbers and every non-finite float into None,
recording where each one was; `all_finite` says whether a value has none. The files are written with
common.files (atomic: never a torn file). Standard library only (numpy values are read through `tolist`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


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
