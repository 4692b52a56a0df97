"""`--set KEY=VALUE`: the one way a setting is overridden on the command line, for every command.

    data, overridden = apply_overrides(data, ["train.lr=1e-4"], file)       # marl run, validate, rollout, ...
    data = apply_typed_overrides(data, schema, ["grpo.lr=1e-4"])          # marl demo

Both read the same KEY=VALUE grammar (`split_override`: a dotted key path, `=`, the value) into the
settings as plain data, which the caller then validates against its one schema: a scenario against
`marl.scenario.spec.ScenarioSpec` (problems located by `marl.scenario.problems`), the demo's GRPO knobs
against `trainers.grpo.config.GRPOConfig`. Values differ in one way only: in a
scenario a value is YAML (it may be a list or a section), while for typed settings it is read as the
type its key declares (a number, true/false, comma-separated numbers, text).
"""

from __future__ import annotations

import copy
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from marl.scenario.problems import Problem, ScenarioError
from marl.scenario.yaml_positions import YamlSyntaxError, load_with_positions


class SettingsError(ValueError):
    """A bad `--set` of typed settings: str() is one line saying what is wrong and how to fix it."""


def split_override(item: str, example: str) -> tuple[str, tuple]:
    """(key, key path) of a `KEY=VALUE` item; digits in the path are list indices (`agents.0.name`).

    ValueError (one line, `example` shows the form) when there is no `=` or a part of the key is empty.
    """
    key, _, _ = item.partition("=")
    path = tuple(int(part) if part.isdigit() else part for part in key.strip().split("."))
    if "=" not in item or not all(str(part) for part in path):
        raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. {example}")
    return key.strip(), path


def set_flag_problem(argv: list[str]) -> str | None:
    """One line for the first `--set` on a command line that is not one KEY=VALUE word, else None.

    `--set train.steps 50` would otherwise reach argparse as a flag and a stray argument ("unrecognized
    arguments: 50"); this names the `--set` and writes the fix. A `--set` with no value at all is left
    to argparse, which says so.
    """
    for index, arg in enumerate(argv):
        if arg == "--set" and index + 1 < len(argv) and not argv[index + 1].startswith("-"):
            item, following = argv[index + 1], argv[index + 2:index + 3]
        elif arg.startswith("--set="):
            item, following = arg.removeprefix("--set="), argv[index + 1:index + 2]
        else:
            continue
        if "=" in item:
            continue
        key = item.strip() or "train.steps"
        value = following[0] if following and not following[0].startswith("-") else "VALUE"
        return (f"--set {item}: expected KEY=VALUE as one word (no spaces around '='; quote an item whose "
                f"value has spaces), e.g. --set {key}={value}")
    return None


def apply_overrides(data: dict, overrides: list[str], file: str = "<scenario>") -> tuple[dict, dict]:
    """Apply `a.b=value` overrides (value parsed as YAML) to a copy of data; return it and the paths set,
    each mapped to the `KEY=VALUE` item that set it (so a problem can quote what the user typed).

    A path may go through mappings (created when missing) and existing list entries (`agents.0.name`);
    anything else (`name.x`, `agents.9.name`, a value that is not YAML) is a ScenarioError located at
    that `--set`. Unknown keys are left for the schema to report.
    """
    data = copy.deepcopy(data)
    overridden = {}
    for item in overrides:
        try:
            key, path = split_override(item, "train.lr=1e-4")
        except ValueError as error:
            raise _override_error(file, item.partition("=")[0], str(error)) from None
        raw = item.partition("=")[2]
        try:
            value = load_with_positions(raw)[0]
        except YamlSyntaxError as error:
            raise _override_error(file, key, f"--set {item!r}: the value is not valid YAML ({error.message}); "
                                             "quote text, e.g. KEY=\"'[1'\"") from None
        _set_path(data, path, value, item, file)
        overridden[path] = item
    return data, overridden


def _override_error(file: str, key: str, message: str) -> ScenarioError:
    key = key.strip()
    label = f"{file} (--set {key})" if key else file
    return ScenarioError([Problem(label, 0, 0, tuple(key.split(".")) if key else (), message)])


def _set_path(data, path: tuple, value, item: str, file: str) -> None:
    """data[path] = value, through existing mappings and list entries; ScenarioError where it cannot go."""
    node, key = data, ".".join(map(str, path))
    for depth, part in enumerate(path):
        where = ".".join(map(str, path[:depth])) or "the file"
        last = depth == len(path) - 1
        if isinstance(node, dict):
            part = str(part)
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
        elif isinstance(node, list):
            if not isinstance(part, int) or part >= len(node):
                span = f"indices 0-{len(node) - 1}" if node else "none"
                raise _override_error(file, key, f"--set {item!r}: {where} is a list of {len(node)} entries "
                                                 f"({span}); {part!r} is not one of them")
            if last:
                node[part] = value
            else:
                node = node[part]
        else:
            raise _override_error(file, key, f"--set {item!r}: {where} is a {type(node).__name__} ({node!r:.40}), "
                                             f"not a section with keys; set {where}=VALUE instead")


def apply_typed_overrides(data: dict, schema: Mapping[str, Any], overrides: list[str],
                          example: str = "--set grpo.lr=1e-4") -> dict:
    """Apply `a.b=value` overrides to a copy of typed settings; every key must be one `schema` declares.

    `schema` maps each key to its type, or to a nested mapping for a section (`{"grpo": {"lr": float}}`).
    A value is read as its key's type (`typed_value`). SettingsError (one line) for an unknown key or
    section, a path through a setting, or a value that is not of the type.
    """
    data = copy.deepcopy(data)
    for item in overrides:
        try:
            key, path = split_override(item, example)
        except ValueError as error:
            raise SettingsError(str(error)) from None
        *parents, leaf = (str(part) for part in path)
        node, types = data, schema
        for depth, part in enumerate(parents):
            if not isinstance(types, Mapping) or part not in types:
                raise SettingsError(f"--set {key}: unknown section {part!r}")
            if not isinstance(types[part], Mapping):
                where = ".".join(parents[:depth + 1])
                raise SettingsError(f"--set {key}: {where} is a setting, not a section with keys "
                                    f"(set {where}=VALUE instead)")
            node, types = node[part], types[part]
        if isinstance(types.get(leaf), Mapping):
            raise SettingsError(f"--set {key}: {key} is a section; set one of its keys ({key}.KEY=VALUE)")
        if leaf not in types:
            known = ", ".join(sorted(name for name in types if not isinstance(types[name], Mapping)))
            raise SettingsError(f"--set {key}: unknown key {leaf!r}; known keys: {known}")
        raw = item.partition("=")[2]
        try:
            node[leaf] = typed_value(raw, types[leaf])
        except ValueError as error:
            raise SettingsError(f"--set {key}={raw}: {error}") from None
    return data


def typed_value(raw: str, annotation) -> Any:
    """`raw` read as `annotation`: true/false for a flag, comma-separated for a tuple, a finite number
    for int and float, the text itself otherwise (choices and bounds are the schema's to check)."""
    kind = typing.get_origin(annotation)
    if kind is typing.Annotated:
        return typed_value(raw, typing.get_args(annotation)[0])
    if kind in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation):
        if raw.lower() in ("none", "null", "~"):  # an optional setting back to its default (none)
            return None
        return typed_value(raw, next(a for a in typing.get_args(annotation) if a is not type(None)))
    if annotation is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {raw!r}")
    if kind is tuple:
        parts, kinds = raw.split(","), typing.get_args(annotation)
        if len(kinds) == 2 and kinds[1] is Ellipsis:
            kinds = (kinds[0],) * len(parts)
        if len(parts) != len(kinds):
            raise ValueError(f"expected {len(kinds)} comma-separated values, got {raw!r}")
        return tuple(typed_value(part, kind_) for part, kind_ in zip(parts, kinds))
    if annotation in (int, float):
        parsed = annotation(raw)
        if isinstance(parsed, float) and not math.isfinite(parsed):
            raise ValueError(f"expected a finite number, got {raw!r}")
        return parsed
    return raw
