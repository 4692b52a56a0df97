"""`--set KEY=VALUE`: the one way a setting is overridden on the command line, for every command.

    data, overridden = apply_overrides(data, ["train.lr=1e-4"], file)       # marl run, demo, validate, ...

It reads the KEY=VALUE grammar (`split_override`: a dotted key path, `=`, the value; the value is YAML,
so it may be a list or a section) into the scenario as plain data, which the caller then validates
against the one schema, `marl.scenario.spec.ScenarioSpec` (problems located by `marl.scenario.problems`).
"""

from __future__ import annotations

import copy

from marl.scenario.problems import Problem, ScenarioError
from marl.scenario.yaml_positions import YamlSyntaxError, YamlValueError, load_with_positions

SHOWN_CHARS = 60  # of a --set item quoted in a message: a 5,000-digit value is not repeated in full


def split_override(item: str, example: str) -> tuple[str, tuple]:
    """(key, key path) of a `KEY=VALUE` item; digits in the path are list indices (`agents.0.name`).

    ValueError (one line, `example` shows the form) when there is no `=` or a part of the key is empty.
    """
    key, _, _ = item.partition("=")
    # a list index is a few digits: a longer run stays a name (int() of 5,000 digits raises; no list is that long)
    path = tuple(int(part) if part.isdigit() and len(part) <= 9 else part for part in key.strip().split("."))
    if "=" not in item or not all(str(part) for part in path):
        raise ValueError(f"--set {shown(item)}: expected KEY=VALUE, e.g. {example}")
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
        except YamlValueError as error:  # YAML, but a value no setting holds (a date, a 5,000-digit number)
            raise _override_error(file, key, f"--set {shown(item)}: {error.message}") from None
        except YamlSyntaxError as error:
            raise _override_error(file, key, f"--set {shown(item)}: the value is not valid YAML ({error.message}); "
                                             "quote text, e.g. KEY=\"'[1'\"") from None
        _set_path(data, path, value, item, file)
        overridden[path] = item
    return data, overridden


def shown(item: str) -> str:
    """A `--set` item as a message quotes it: repr, cut to SHOWN_CHARS with its full length when longer."""
    if len(item) <= SHOWN_CHARS:
        return repr(item)
    return f"{item[:SHOWN_CHARS]!r}... ({len(item):,} characters)"


def _override_error(file: str, key: str, message: str) -> ScenarioError:
    key = key.strip()
    key = key if len(key) <= SHOWN_CHARS else f"{key[:SHOWN_CHARS]}..."
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
                given = shown(part) if isinstance(part, str) else part
                raise _override_error(file, key, f"--set {shown(item)}: {where} is a list of {len(node)} entries "
                                                 f"({span}); {given} is not one of them")
            if last:
                node[part] = value
            else:
                node = node[part]
        else:
            raise _override_error(file, key, f"--set {shown(item)}: {where} is a {type(node).__name__} ({node!r:.40}), "
                                             f"not a section with keys; set {where}=VALUE instead")
