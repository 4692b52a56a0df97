"""A scenario's problems, each located: `FILE:LINE:COL: key.path: what is wrong (how to fix it)`.

`Problem` is one of them and `ScenarioError` carries all of a pass. `shape_problems` turns a pydantic
ValidationError of any strict schema (a scenario, or settings given on the command line) into
located problems: a key given by `--set` is located at that override, every other key at its line
and column in the file.
"""

from __future__ import annotations

import difflib
import errno
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from marl.scenario.yaml_positions import locate


@dataclass(frozen=True)
class Problem:
    """One problem in a scenario: where it is and what to do about it."""

    file: str
    line: int
    column: int
    path: tuple
    message: str

    def __str__(self) -> str:
        dotted = ".".join(str(part) for part in self.path) or "(file)"
        return f"{self.file}:{self.line}:{self.column}: {dotted}: {self.message}"


class ScenarioError(Exception):
    """A scenario with problems; `problems` holds each one, str() gives one line per problem."""

    def __init__(self, problems: list[Problem]):
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


def override_of(path: tuple, positions: dict, overridden) -> tuple | None:
    """The key path of the `--set` that gave `path`: one that set it or a section above it, or, for a key
    the file does not have, one that set a key below it (`--set trian.steps=5` made the key `trian`)."""
    path = tuple(path)
    for prefix in overridden:
        if path[:len(prefix)] == prefix:
            return prefix
    if path and path not in positions:
        for prefix in overridden:
            if prefix[:len(path)] == path:
                return prefix
    return None


def where(path: tuple, positions: dict, file: str, overridden) -> tuple[str, int, int]:
    """(file label, line, column) of a key path: the `--set` that gave it, else its place in the file."""
    prefix = override_of(path, positions, overridden)
    if prefix is not None:
        return f"{file} (--set {'.'.join(map(str, prefix))})", 0, 0
    line, column = locate(positions, path)
    return file, line, column


def shape_problems(error: ValidationError, schema: type[BaseModel], data, positions: dict, file: str,
                   overridden: set) -> list[Problem]:
    """Every error of validating `data` against `schema`, as a located Problem with a fix."""
    return [_shape_problem(e, schema, data, positions, file, overridden) for e in error.errors()]


def _data_path(loc: tuple, data: Any) -> tuple:
    """The prefix of a pydantic error location that really indexes into the data."""
    path, node = [], data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and not path[-1:] == [part]:
            path.append(part)  # a missing key: point at it by name
            break
        else:
            break
        path.append(part)
    return tuple(path)


def os_error_problem(data: Any, error: OSError) -> tuple[tuple, str]:
    """(key path, message) for an OSError a check met on a path the scenario names (a name of 300 characters:
    ENAMETOOLONG, which pathlib's exists() raises rather than answers): the key whose value holds the path's
    longest part, found in `data` (the spec as plain data); () when none does."""
    parts = str(error.filename or "").split("/")
    name = max(parts, key=len).rsplit(".", 1)[0]  # a module's file: 'tools.py' of the value 'tools:f'
    what = error.strerror or error.__class__.__name__
    fix = ("a file name is at most 255 bytes: give a shorter path" if error.errno == errno.ENAMETOOLONG
           else "give another path")
    stack: list[tuple[tuple, Any]] = [((), data)]
    while stack and name:
        path, node = stack.pop()
        if isinstance(node, str) and name in node:
            return path, f"the path {node[:60]!r}{'...' if len(node) > 60 else ''} cannot be checked ({what}); {fix}"
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend((path + (key,), child) for key, child in children)
    return (), f"a path cannot be checked ({what}: {str(error.filename)[:60]}...); {fix}"


def _allowed_keys(schema: type[BaseModel], path: tuple) -> list[str]:
    model: Any = schema
    for part in path:
        if isinstance(part, int):
            continue
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return []
        model = _model_of(fields[part].annotation)
    return sorted(getattr(model, "model_fields", {}))


def _model_of(annotation) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in getattr(annotation, "__args__", ()):
        found = _model_of(argument)
        if found is not None:
            return found
    return None


def _shape_problem(error: dict, schema, data, positions, file, overridden) -> Problem:
    kind, loc = error["type"], tuple(error["loc"])
    path = _data_path(loc, data)
    if kind == "extra_forbidden":
        message = _unknown_key_message(path, _allowed_keys(schema, path[:-1]), positions, overridden)
    elif kind == "missing":
        message = f"required key {loc[-1]!r} is missing (add it)"
        path = path if path and path[-1] == loc[-1] else path + (loc[-1],)
    else:
        got = error.get("input")
        shown = repr(got) if not isinstance(got, dict | list) else type(got).__name__
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        message = f"{error['msg'].removeprefix('Value error, ')} (got {shown})"
        if got is None and any(path[:len(p)] == p for p in overridden):
            message += "; --set values are YAML, where null and ~ mean nothing: quote a word, e.g. KEY=\"'null'\""
    file_label, line, column = where(path, positions, file, overridden)
    return Problem(file_label, line, column, path, message)


def _unknown_key_message(path: tuple, allowed: list[str], positions: dict, overridden) -> str:
    """What is wrong with an unknown key: the `--set` it came from, the close spellings, the keys allowed."""
    key = str(path[-1])
    close = difflib.get_close_matches(key, allowed, n=3, cutoff=0.6)
    guess = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    prefix = override_of(path, positions, overridden)
    given = overridden.get(prefix) if prefix is not None and isinstance(overridden, dict) else None
    if given is not None:  # the user typed it on the command line: quote what they typed
        return f"unknown key {key!r} in --set {given} ({guess}allowed here: {', '.join(allowed)})"
    return f"unknown key {key!r} ({guess}remove it or fix its spelling; allowed here: {', '.join(allowed)})"
