"""YAML loading that remembers where every key and value stands, for errors that say FILE:LINE:COL.

`load_with_positions(text)` returns the plain data (as `yaml.safe_load` would) and a map from key
paths (tuples of keys and list indices) to 1-based (line, column) positions. `locate(positions,
path)` finds the closest known position of a path (falling back to its parents), so an error about
`agents.1.tools` points at that key even when the problem is deep inside its value.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

Path_ = tuple  # a key path: ("agents", 1, "name")


@dataclass(frozen=True)
class YamlSyntaxError(Exception):
    """A YAML document that cannot be parsed, with the position of the problem."""

    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.line}:{self.column}: {self.message}"


def _construct(node, path: Path_, positions: dict[Path_, tuple[int, int]], loader):
    positions.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
    if isinstance(node, yaml.MappingNode):
        result = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if isinstance(key, list):
                key = tuple(key)
            positions[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            result[key] = _construct(value_node, path + (key,), positions, loader)
            positions[path + (key, "<value>")] = (value_node.start_mark.line + 1, value_node.start_mark.column + 1)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_construct(child, path + (index,), positions, loader) for index, child in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_with_positions(text: str) -> tuple[object, dict[Path_, tuple[int, int]]]:
    """Parse one YAML document; return (data, positions). Raises YamlSyntaxError on bad YAML."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        positions: dict[Path_, tuple[int, int]] = {}
        return _construct(node, (), positions, loader), positions
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        message = " ".join(part for part in (error.context, error.problem) if part)
        raise YamlSyntaxError(line, column, f"YAML syntax error: {message}") from None
    finally:
        loader.dispose()


def locate(positions: dict[Path_, tuple[int, int]], path: Path_) -> tuple[int, int]:
    """Position of `path`, or of its closest ancestor that has one; (1, 1) if none does."""
    path = tuple(path)
    while path:
        if path in positions:
            return positions[path]
        path = path[:-1]
    return positions.get((), (1, 1))
