"""Resolve 'module:function' references (tools, task generators, experts, callable scorers).

A module is looked for first as a file next to the scenario (`<base_dir>/pkg/mod.py` for `pkg.mod`),
imported once under a private unique name (so two scenario folders with a `lib.py` each never
collide; while it loads, its folder is on sys.path so it can import its siblings), and then on the
normal import path. The part after the colon may be dotted (`Class.method`). Every failure is a
ValueError that says what was looked for and where.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def resolve_callable(ref: str, base_dir: Path | str | None = None) -> Callable[..., Any]:
    """Resolve 'module:function' (a file <base_dir>/<module as path>.py first, then a normal import)."""
    module_name, _, attr = (ref or "").partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name or not attr:
        raise ValueError(f"{ref!r} is not a 'module:function' reference (e.g. 'weather_lib:get_weather')")
    module = _import_file(ref, module_name, Path(base_dir)) if base_dir is not None else None
    if module is None:
        module = _import_module(ref, module_name, base_dir)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"cannot import {ref!r}: module {module_name} has no attribute {attr}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"cannot import {ref!r}: {module_name}.{attr} is not callable")
    return obj


def _import_file(ref: str, module_name: str, base_dir: Path) -> Any | None:
    """The module at <base_dir>/<module/as/path>.py, imported under a unique name; None if absent."""
    path = base_dir.joinpath(*module_name.removesuffix(".py").split(".")).with_suffix(".py")
    if not path.is_file():
        return None
    path = path.resolve()
    unique = "_marl_tool_" + re.sub(r"\W", "_", module_name) + "_" + hashlib.sha1(str(path).encode()).hexdigest()[:10]
    if unique in sys.modules:
        return sys.modules[unique]
    spec = importlib.util.spec_from_file_location(unique, path)
    module = importlib.util.module_from_spec(spec)
    module.__marl_source__ = (module_name, str(base_dir.resolve()))  # how a tool host imports it again
    sys.modules[unique] = module
    sys.path.insert(0, str(base_dir))  # sibling imports of the tool file resolve while it loads
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001
        del sys.modules[unique]
        raise ValueError(f"cannot import {ref!r}: loading {path} raised {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(str(base_dir))
    return module


def _import_module(ref: str, module_name: str, base_dir: Path | str | None) -> Any:
    """The module by normal import, with a clear ValueError when it is missing or fails to import."""
    where = f"{base_dir} and sys.path" if base_dir is not None else "sys.path"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ValueError(f"cannot import {ref!r}: module {module_name} not found (looked in {where})") from None
        raise ValueError(f"cannot import {ref!r}: importing {module_name} raised ModuleNotFoundError: {exc}") from exc
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"cannot import {ref!r}: importing {module_name} raised {type(exc).__name__}: {exc}") from exc
