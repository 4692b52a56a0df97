"""Build rule verifiers from reward specs: `build_scorer(kind, params, base_dir)`.

A scenario's YAML names a verifier by `kind` and gives its constructor parameters; this module checks
them (unknown or missing names are errors that list the expected ones), resolves paths (`database`)
against the scenario folder and `module:function` references (`callable`'s `function`), and builds
the verifier. `scorer_parameters(kind)` describes each kind's parameters for schema validation.

Kinds and parameters (REQUIRED marks the ones without a default):
  exact:       expected=None, case_sensitive=False, collapse_whitespace=True, strip_punctuation=False, markers
  numeric:     expected=None, abs_tol=1e-6, rel_tol=1e-6, markers
  regex:       pattern (REQUIRED), ignore_case=False, whole_text=False, markers
  contains:    substrings (REQUIRED), mode="all", case_sensitive=False
  json_schema: schema (REQUIRED), markers
  callable:    function (REQUIRED, "module:function")
  sql:         database (REQUIRED), reference_field="reference_query", variants=2, seed=0, timeout_s=2.0,
               max_rows=10000, ordered=False, float_digits=6
  code_tests:  tests=None, entry=None, timeout_s=10.0, cpu_s=None, memory_mb=512, require_all=False,
               output_limit=256000
  tool_use:    required (REQUIRED), ordered=False, forbidden=[], caller=None
  process:     markers (REQUIRED), regex=False
  format:      max_chars=None, min_chars=None, pattern=None, require_marker=False, forbidden=[], markers
Every kind also takes `name` (default: the kind). markers defaults to DEFAULT_MARKERS of judges.rules.basic.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.imports import resolve_callable
from judges.types import Scorer


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()

_KINDS: dict[str, tuple[str, str]] = {
    "exact": ("judges.rules.basic", "ExactVerifier"),
    "numeric": ("judges.rules.basic", "NumericVerifier"),
    "regex": ("judges.rules.basic", "RegexVerifier"),
    "contains": ("judges.rules.basic", "ContainsVerifier"),
    "json_schema": ("judges.rules.basic", "JSONSchemaVerifier"),
    "callable": ("judges.rules.basic", "CallableVerifier"),
    "sql": ("judges.rules.sql", "SQLVerifier"),
    "code_tests": ("judges.rules.code", "CodeTestsVerifier"),
    "tool_use": ("judges.rules.basic", "ToolUseVerifier"),
    "process": ("judges.rules.basic", "ProcessVerifier"),
    "format": ("judges.rules.basic", "FormatVerifier"),
}
KNOWN_KINDS: tuple[str, ...] = tuple(_KINDS)
_PATH_PARAMS = {"sql": ("database",)}


def verifier_class(kind: str) -> type:
    """The verifier class of `kind` (its module is imported on first use)."""
    if kind not in _KINDS:
        raise ValueError(f"unknown scorer kind {kind!r}; known kinds: {', '.join(KNOWN_KINDS)}")
    module, name = _KINDS[kind]
    return getattr(importlib.import_module(module), name)


def scorer_parameters(kind: str) -> dict[str, tuple[Any, Any]]:
    """name -> (type annotation, default or REQUIRED) of the parameters `kind` accepts."""
    cls = verifier_class(kind)
    hints = typing.get_type_hints(cls.__init__)
    parameters = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        default = REQUIRED if parameter.default is parameter.empty else parameter.default
        annotation = str if (kind, name) == ("callable", "function") else hints.get(name, Any)
        parameters[name] = (annotation, default)
    return parameters


def _describe(parameters: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(name if default is REQUIRED else f"{name}={default!r}"
                     for name, (_, default) in parameters.items())


def _check_type(kind: str, name: str, value: Any, annotation: Any) -> None:
    """TypeError when a simple-typed parameter (bool, int, float, str, optionally None) has another type."""
    options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    simple = {bool, int, float, str, type(None)}
    if not options or not set(options) <= simple:
        return
    if value is None and type(None) in options or isinstance(value, bool) and bool in options:
        return
    if not isinstance(value, bool) and any(isinstance(value, option) for option in options if option is not bool) \
            or float in options and isinstance(value, int) and not isinstance(value, bool):
        return
    names = " or ".join("None" if option is type(None) else option.__name__ for option in options)
    raise TypeError(f"{kind}: parameter {name!r} must be {names}, got {type(value).__name__} {value!r}")


def build_scorer(kind: str, params: dict[str, Any] | None = None, base_dir: str | Path | None = None) -> Scorer:
    """The verifier of `kind` built from `params`; relative paths resolve against base_dir.

    Raises ValueError for an unknown kind, unknown or missing parameters (the message lists the
    expected ones), a bad 'module:function' reference, or a value the verifier refuses; TypeError
    for a parameter of the wrong type.
    """
    params = dict(params or {})
    expected = scorer_parameters(kind)
    unknown = sorted(set(params) - set(expected))
    missing = sorted(name for name, (_, default) in expected.items() if default is REQUIRED and name not in params)
    if unknown or missing:
        problems = ([f"unknown parameters {unknown}"] if unknown else []) + (
            [f"missing required parameters {missing}"] if missing else [])
        raise ValueError(f"{kind}: {' and '.join(problems)}; expected: {_describe(expected)}")
    for name, value in params.items():
        if (kind, name) != ("callable", "function"):  # a "module:function" string or the function itself
            _check_type(kind, name, value, expected[name][0])
    base = Path(base_dir) if base_dir is not None else None
    for name in _PATH_PARAMS.get(kind, ()):
        if name in params and base is not None and not Path(params[name]).is_absolute():
            params[name] = base / params[name]
    if kind == "callable" and isinstance(params.get("function"), str):
        params["function"] = resolve_callable(params["function"], base)
    return verifier_class(kind)(**params)


__all__ = ["KNOWN_KINDS", "REQUIRED", "build_scorer", "resolve_callable", "scorer_parameters", "verifier_class"]
