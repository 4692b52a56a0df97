"""YAML loading that remembers where every key and value stands, for errors that say FILE:LINE:COL.

`load_with_positions(text)` returns the plain data (as `yaml.safe_load` would) and a map from key
paths (tuples of keys and list indices) to 1-based (line, column) positions. `locate(positions,
path)` finds the closest known position of a path (falling back to its parents), so an error about
`agents.1.tools` points at that key even when the problem is deep inside its value.

The loader is bounded, because a scenario file may come from anyone: nesting deeper than
`MAX_DEPTH`, more than `MAX_NODES` values after alias expansion (a "billion laughs" bomb), duplicate
keys, keys that are not plain text (complex keys, `yes:` read as a bool), values that are not plain data
(YAML dates, `!!binary`, `!!set`) and integers of more than `MAX_INT_DIGITS` digits (Python refuses to
convert them, and no setting needs one) are each a `YamlSyntaxError` at their position; the last two
are `YamlValueError`s, YAML that parses but holds a value a scenario cannot.
`decode_yaml_bytes` refuses files that are too large, binary, UTF-16/32 or otherwise not UTF-8.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from common.files import MAX_INT_DIGITS

Path_ = tuple  # a key path: ("agents", 1, "name")

MAX_BYTES = 1 << 20  # a scenario file; task data belongs in a JSONL file
MAX_DEPTH = 64
MAX_NODES = 300_000  # more than a 1 MiB file can hold without aliases
_PLAIN_SCALARS = {"tag:yaml.org,2002:" + name for name in ("str", "int", "float", "bool", "null")}
_PLAIN_COLLECTIONS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}
_UNCLOSED = ("flow", "quoted", "scanning")  # contexts whose start is where the user must look
_INT_TAG = "tag:yaml.org,2002:int"
_INT_BOUND = 10 ** MAX_INT_DIGITS  # a hex, octal or binary integer has no digit limit of Python's: bound its size


@dataclass(frozen=True)
class YamlSyntaxError(Exception):
    """A YAML document that cannot be loaded, with the position (and key path) of the problem."""

    line: int
    column: int
    message: str
    path: tuple = ()

    def __str__(self) -> str:
        return f"{self.line}:{self.column}: {self.message}"


class YamlValueError(YamlSyntaxError):
    """YAML that parses, holding a value a scenario cannot hold: a date, a `!!tag`, an integer too long."""


def _at(node_or_mark, message: str, path: Path_ = (), kind: type = YamlSyntaxError) -> YamlSyntaxError:
    mark = getattr(node_or_mark, "start_mark", node_or_mark)
    return kind(mark.line + 1, mark.column + 1, message, tuple(path))


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses nesting deeper than MAX_DEPTH (it recurses per level)."""

    def __init__(self, text: str):
        super().__init__(text)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _at(self.peek_event().start_mark, f"nesting deeper than {MAX_DEPTH} levels (flatten the "
                                                        "structure; scenario files need only a few levels)")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Builder:
    """Turns composed nodes into plain data, recording positions and counting every value built."""

    def __init__(self, loader: yaml.SafeLoader):
        self.loader, self.positions, self.count = loader, {}, 0

    def build(self, node, path: Path_):
        self.count += 1
        if self.count > MAX_NODES:  # reported at the top-level key whose value explodes
            line, column = self.positions.get(path[:1], (node.start_mark.line + 1, node.start_mark.column + 1))
            raise YamlSyntaxError(line, column, f"the document expands to more than {MAX_NODES} values (YAML "
                                                "aliases such as *name repeat their anchor's value: remove the "
                                                "nested aliases)", path[:1])
        self.positions.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if node.tag not in _PLAIN_SCALARS | _PLAIN_COLLECTIONS:
            raise _at(node, _tag_message(node), path, YamlValueError)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(child, path + (index,)) for index, child in enumerate(node.value)]
        return self._scalar(node, path)

    def _scalar(self, node, path: Path_):
        """A scalar's value; an integer of more than MAX_INT_DIGITS digits is refused before Python's int()
        raises on it (or, in hex, octal or binary, which int() converts whatever their length, after)."""
        written = node.value.replace("_", "").lstrip("+-")
        digits = len(written) - (2 if written[:2].lower() in ("0x", "0o", "0b") else 0) if node.tag == _INT_TAG else 0
        value = None if digits > MAX_INT_DIGITS else self.loader.construct_object(node, deep=True)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _INT_BOUND:
            digits = int(abs(value).bit_length() * 0.30103) + 1  # in decimal: log10(2) per bit, at most one over
        if digits > MAX_INT_DIGITS:
            raise _at(node, f"an integer of {digits:,} digits (at most {MAX_INT_DIGITS:,} are read; no setting "
                            "needs that many): write a smaller number, or quote it if it is text", path,
                      YamlValueError)
        return value

    def _mapping(self, node, path: Path_) -> dict:
        result, first_line = {}, {}
        for key_node, value_node in node.value:
            key = self._key(key_node, path)
            if key in result:
                raise _at(key_node, f"duplicate key {key!r} (first given at line {first_line[key]}; keep one)",
                          path + (key,))
            first_line[key] = key_node.start_mark.line + 1
            self.positions[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            result[key] = self.build(value_node, path + (key,))
            self.positions[path + (key, "<value>")] = (value_node.start_mark.line + 1,
                                                       value_node.start_mark.column + 1)
        return result

    def _key(self, key_node, path: Path_) -> str:
        if not isinstance(key_node, yaml.ScalarNode):
            kind = "mapping" if isinstance(key_node, yaml.MappingNode) else "list"
            raise _at(key_node, f"a key must be plain text, not a {kind} (a '? ' complex key or a flow "
                                "collection used as a key): write a name", path)
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise _at(key_node, "merge keys ('<<') are not supported (write the keys out)", path)
        if key_node.tag not in _PLAIN_SCALARS:
            raise _at(key_node, _tag_message(key_node), path)
        key = self._scalar(key_node, path)
        if not isinstance(key, str):
            raise _at(key_node, f"key {key_node.value!r} is read by YAML as {type(key).__name__} {key!r}, but "
                                f"keys must be text (quote it: '{key_node.value}')", path)
        return key


def _tag_message(node) -> str:
    tag = node.tag.removeprefix("tag:yaml.org,2002:")
    if tag == "timestamp":
        return (f"{node.value!r} is read by YAML as a date/time, which scenarios do not use (quote it if you "
                f"mean text: \"{node.value}\")")
    if tag == "binary":
        return "!!binary values are not supported (write the value as text)"
    shown = f"!!{tag}" if tag != node.tag else node.tag
    return f"values tagged {shown} are not supported (use plain text, numbers, lists and mappings)"


def _syntax_error(error: yaml.MarkedYAMLError) -> YamlSyntaxError:
    """A located syntax error: an unclosed bracket or quote is reported where it began."""
    problem, context = error.problem or "", error.context or ""
    noticed, began = error.problem_mark, error.context_mark
    if began is not None and noticed is not None and any(word in context for word in _UNCLOSED):
        construct = context.removeprefix("while parsing ").removeprefix("while scanning ").removeprefix("a ")
        message = (f"YAML syntax error: the {construct} that begins here is not closed ({problem} at line "
                   f"{noticed.line + 1} column {noticed.column + 1}); close it")
        return _at(began, message)
    mark = noticed or began
    message = f"YAML syntax error: {' '.join(part for part in (context, problem) if part)}"
    if began is not None and noticed is not None and began.line != noticed.line:
        message += f" (the {context.removeprefix('while parsing ').removeprefix('a ')} begins at line " \
                   f"{began.line + 1}; check the indentation)"
    return _at(mark, message) if mark else YamlSyntaxError(1, 1, message)


def _runaway_string(text: str, noticed) -> YamlSyntaxError | None:
    """A quoted string spanning lines that ends just before the error: most often a missing closing
    quote, which YAML only notices where the next quote closes the string by accident."""
    last = None
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if token.start_mark.index >= noticed.index:
                break
            if isinstance(token, yaml.ScalarToken):
                last = token
    except yaml.YAMLError:
        pass
    if last is None or last.style not in ('"', "'") or last.start_mark.line == last.end_mark.line:
        return None
    return _at(last.start_mark, f"YAML syntax error: the quoted string that begins here runs on to line "
                                f"{last.end_mark.line + 1} (the parser stopped at line {noticed.line + 1} column "
                                f"{noticed.column + 1}); is its closing {last.style} missing?")


def load_with_positions(text: str) -> tuple[object, dict[Path_, tuple[int, int]]]:
    """Parse one YAML document; return (data, positions). Raises YamlSyntaxError on bad or unbounded YAML."""
    loader = None
    try:
        loader = _BoundedLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None, {}
        builder = _Builder(loader)
        return builder.build(node, ()), builder.positions
    except yaml.MarkedYAMLError as error:
        runaway = _runaway_string(text, error.problem_mark) if error.problem_mark is not None else None
        raise (runaway or _syntax_error(error)) from None
    except yaml.reader.ReaderError as error:
        line, column = _line_column(text, error.position)
        shown = chr(error.character) if isinstance(error.character, int) else error.character
        raise YamlSyntaxError(line, column, f"character {shown!r} is not allowed in YAML ({error.reason}; "
                                            "remove it or save the file as plain UTF-8 text)") from None
    except yaml.YAMLError as error:
        raise YamlSyntaxError(1, 1, f"YAML error: {error}") from None
    except RecursionError:
        raise YamlSyntaxError(1, 1, "YAML nested too deeply to read (flatten the structure)") from None
    except (ValueError, OverflowError) as error:  # a constructor's own refusal that the checks above missed
        raise YamlSyntaxError(1, 1, f"a value YAML cannot read ({str(error).splitlines()[0][:200]})") from None
    finally:
        if loader is not None:
            loader.dispose()


def _line_column(text: str, offset: int) -> tuple[int, int]:
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def decode_yaml_bytes(data: bytes, max_bytes: int = MAX_BYTES) -> str:
    """The text of a YAML file's bytes, or a YamlSyntaxError saying why it is not UTF-8 text."""
    if len(data) > max_bytes:
        raise YamlSyntaxError(1, 1, f"the file is {len(data):,} bytes; scenario files are limited to {max_bytes:,} "
                                    "(move task data into a tasks.jsonl file)")
    for bom, name in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
                      (b"\xfe\xff", "UTF-16")):
        if data.startswith(bom):
            raise YamlSyntaxError(1, 1, f"the file is {name} text; save it as UTF-8")
    if b"\x00" in data:
        line, column = _line_column(data.decode("latin-1"), data.index(b"\x00"))
        raise YamlSyntaxError(line, column, "the file is binary (a NUL byte), not YAML text (UTF-16 without a "
                                            "byte-order mark looks like this too: save it as UTF-8)")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        line, column = _line_column(data.decode("latin-1"), error.start)
        raise YamlSyntaxError(line, column, f"the file is not UTF-8 (byte 0x{data[error.start]:02x}; perhaps "
                                            "latin-1 or cp1252): save it as UTF-8") from None


def locate(positions: dict[Path_, tuple[int, int]], path: Path_) -> tuple[int, int]:
    """Position of `path`, or of its closest ancestor that has one; (1, 1) if none does."""
    path = tuple(path)
    while path:
        if path in positions:
            return positions[path]
        path = path[:-1]
    return positions.get((), (1, 1))
