"""Public names at a package's top, imported on first use (PEP 562).

A package lists its public names as `{name: "module:attribute"}`; `lazy_names` gives it the module-level
`__getattr__` and `__dir__` that import each name's module only when the name is first read, so
`import marl` loads nothing but the package, and moving a module never breaks a user's import (only the
mapping changes).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_names(package: str, public: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """(__getattr__, __dir__) of the package `package` (its `__name__`) for its `public` mapping; `namespace`
    is the package's globals() (what `dir()` lists besides the public names)."""

    def __getattr__(name: str):
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = public[name].partition(":")
        return getattr(importlib.import_module(module), attribute)

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(public))

    return __getattr__, __dir__
