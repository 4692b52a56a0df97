"""The syntax of a tool call written in an agent's message: bracket and string scanning bounded on
hostile text, lenient JSON (single quotes, trailing commas, bare words), literal values, and binding
positional and keyword arguments to a tool's declared parameters with safe coercion.

`marl.tools.ToolRegistry.parse` finds calls in a message and uses these to read their arguments; the
accepted formats are listed in marl/tools.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Protocol


class Declared(Protocol):
    """What binding reads of a tool (marl.tools.ToolSpec has it): its name, JSON-schema parameters and
    their properties."""

    name: str
    parameters: dict[str, Any]

    @property
    def properties(self) -> dict[str, Any]:
        """Argument name -> schema."""

_STRING_RE = {'"': re.compile(r'"(?:[^"\\]|\\.)*"', re.S), "'": re.compile(r"'(?:[^'\\]|\\.)*'", re.S)}
_SPECIAL_RE = re.compile(r"[\"'()\[\]{},]")
_NUMBER_RE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_INT_RE = re.compile(r"[-+]?\d+")
_KEYWORD_RE = re.compile(r"\s*([A-Za-z_][\w\-]*)\s*(=(?!=)|:)\s*(.*)\Z", re.S)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "0": "\0"}
_LITERALS = {"true": True, "false": False, "null": None, "none": None}
_PAIRS = {"(": ")", "[": "]", "{": "}"}


class ArgError(ValueError):
    """A tool call whose arguments are broken (becomes `ParsedCall.error`)."""


class Bare(str):
    """An unquoted value from call syntax: text for string parameters, a literal otherwise."""


def tool_key(name: str) -> str:
    """A tool name as calls are matched: case-insensitive, `-` and `_` alike."""
    return name.strip().lower().replace("-", "_")


def _string_end(text: str, i: int, limit: int | None = None) -> int | None:
    """Index after the string literal opening at text[i] (a quote), or None when unterminated."""
    match = _STRING_RE[text[i]].match(text, i, len(text) if limit is None else limit)
    return match.end() if match else None


def _opens_string(text: str, i: int) -> bool:
    """A quote opens a string only where a value can start (so apostrophes in words stay text)."""
    j = i - 1
    while j >= 0 and text[j].isspace():
        j -= 1
    return j < 0 or text[j] in "([{,=:"


def scan(text: str, start: int, limit: int, split: bool = False) -> tuple[int | None, str, list[int]]:
    """Match the bracket at text[start]: (end or None, failure reason, top-level comma positions)."""
    stack, commas, j = [], [], start
    while (m := _SPECIAL_RE.search(text, j, limit)) is not None:
        j, c = m.start(), m.group()
        if c in "\"'" and _opens_string(text, j):
            end = _string_end(text, j, limit)
            if end is None:
                return None, "unterminated string", commas
            j = end
            continue
        if c in _PAIRS:
            stack.append(_PAIRS[c])
        elif c in ")]}":
            if not stack or c != stack[-1]:
                return None, f"mismatched '{c}'", commas
            stack.pop()
            if not stack:
                return j + 1, "", commas
        elif c == "," and split and len(stack) == 1:
            commas.append(j)
        j += 1
    return None, f"unbalanced brackets: missing {''.join(reversed(stack))[:8]!r}", commas


def _unescape(body: str) -> str:
    """Undo backslash escapes (\\n, \\', \\uXXXX, ...); unknown escapes are kept as written."""
    def one(m: re.Match) -> str:
        c = m.group(1)
        if len(c) == 5:
            return chr(int(c[1:], 16))
        return _ESCAPES.get(c, c if c in "\\'\"/" else m.group(0))
    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", one, body, flags=re.S)


def _decode_string(literal: str) -> str:
    """The value of a quoted literal ("..." JSON-style or '...' Python-style)."""
    if literal[0] == '"':
        try:
            return json.loads(literal, strict=False)
        except ValueError:
            pass
    return _unescape(literal[1:-1])


def _bare_literal(token: str) -> Any:
    """`12` -> 12, `2.5` -> 2.5, `true`/`True` -> True, `null`/`None` -> None, anything else: the text."""
    if token.lower() in _LITERALS:
        return _LITERALS[token.lower()]
    if _INT_RE.fullmatch(token):
        return int(token)
    if _NUMBER_RE.fullmatch(token):
        return float(token)
    return str(token)


def _normalise_json(s: str) -> str:
    """Rewrite relaxed JSON (single quotes, trailing commas, bare keys/words) as strict JSON."""
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c in "\"'" and _opens_string(s, i):
            end = _string_end(s, i)
            if end is None:
                raise ValueError("unterminated string")
            out.append(json.dumps(_decode_string(s[i:end]), ensure_ascii=False))
            i = end
        elif c in "{}[],:" or c.isspace():
            if c in "}]":
                while out and (out[-1].isspace() or out[-1] == ","):
                    out.pop()
            out.append(c)
            i += 1
        else:
            j = i
            while j < n and s[j] not in "{}[],:" and not (s[j] in "\"'" and _opens_string(s, j)):
                j += 1
            token = s[i:j].strip()
            out.append(json.dumps(_bare_literal(token), ensure_ascii=False))
            i = j
    return "".join(out)


def loads_lenient(s: str) -> Any:
    """Parse strict or relaxed JSON; ValueError when neither works."""
    try:
        return json.loads(s, strict=False)
    except ValueError:
        pass
    except RecursionError:
        raise ValueError("not valid JSON (nested too deeply)") from None
    try:
        return json.loads(_normalise_json(s), strict=False)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not valid JSON ({getattr(exc, 'msg', exc)})") from None


def _parse_value(raw: str) -> Any:
    """One argument value from call syntax: a quoted string, JSON, or a bare value (kept as `Bare`)."""
    s = raw.strip()
    if not s:
        raise ArgError("empty argument")
    if s[0] in "\"'":
        end = _string_end(s, 0)
        if end is None:
            raise ArgError(f"unterminated string {s[:40]!r}")
        if end != len(s):
            raise ArgError(f"unexpected text after string: {s[:40]!r}")
        return _decode_string(s)
    if s[0] in "{[":
        try:
            return loads_lenient(s)
        except ValueError as exc:
            raise ArgError(f"argument {s[:40]!r} is {exc}") from None
    return Bare(s)


_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "array": lambda v: isinstance(v, list), "object": lambda v: isinstance(v, dict), "null": lambda v: v is None,
}


def _coerce_one(value: Any, kind: str) -> Any:
    """`value` as JSON type `kind` when that is safe; raises ArgError otherwise."""
    if isinstance(value, Bare):
        value = str(value) if kind == "string" else _bare_literal(value)
    if kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    elif kind == "integer" and isinstance(value, float) and value.is_integer():
        value = int(value)
    elif kind in ("integer", "number") and isinstance(value, str) and _NUMBER_RE.fullmatch(value.strip()):
        value = int(value) if _INT_RE.fullmatch(value.strip()) else float(value)
        value = int(value) if kind == "integer" and isinstance(value, float) and value.is_integer() else value
    elif kind == "boolean" and str(value).strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        value = str(value).strip().lower() in ("true", "yes", "1")
    elif kind in ("array", "object") and isinstance(value, str) and value.lstrip().startswith(("[", "{")):
        value = loads_lenient(value)
    if kind in _TYPE_CHECKS and not _TYPE_CHECKS[kind](value):
        raise ArgError(f"expected {kind}, got {json.dumps(value, default=str)[:40]}")
    return value


def _coerce(value: Any, schema: dict[str, Any], name: str) -> Any:
    """Coerce to the schema (type, possibly a list of types; enum; array items); ArgError if impossible."""
    kinds = schema.get("type")
    errors = []
    for kind in (kinds if isinstance(kinds, list) else [kinds]):
        try:
            value = _coerce_one(value, kind) if kind else (_bare_literal(value) if isinstance(value, Bare) else value)
            break
        except (ArgError, ValueError) as exc:
            errors.append(str(exc))
    else:
        raise ArgError(f"argument '{name}': {'; '.join(errors)}")
    if "enum" in schema:
        match = [e for e in schema["enum"] if e == value or (isinstance(e, str) and str(value).lower() == e.lower())]
        if not match:
            raise ArgError(f"argument '{name}' must be one of {schema['enum']}, got {value!r}")
        value = match[0]
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [_coerce(v, schema["items"], f"{name}[{i}]") for i, v in enumerate(value)]
    return value


def bind_arguments(spec: Declared, positional: list[Any], keyword: dict[str, Any]) -> dict[str, Any]:
    """Map positional/keyword values to declared parameters, check them, coerce them (or ArgError)."""
    props = spec.properties
    by_key = {tool_key(p): p for p in props}
    if len(positional) == 1 and not keyword and isinstance(positional[0], dict) and (
            len(props) != 1 or set(map(tool_key, positional[0])) <= set(by_key)):
        positional, keyword = [], positional[0]
    if len(positional) > len(props):
        raise ArgError(f"takes {len(props)} argument(s), got {len(positional)} positional")
    args = dict(zip(props, positional))
    for raw_name, value in keyword.items():
        name = by_key.get(tool_key(str(raw_name)))
        if name is None and spec.parameters.get("additionalProperties"):
            name = str(raw_name)
        if name is None:
            raise ArgError(f"unknown argument '{raw_name}' (expected: {', '.join(props) or 'none'})")
        if name in args:
            raise ArgError(f"argument '{name}' given twice")
        args[name] = value
    required = list(spec.parameters.get("required") or ())
    for name in [n for n, v in args.items() if n not in required and "null" not in str(props.get(n, {}).get("type"))
                 and (v is None or (isinstance(v, Bare) and v.lower() in ("null", "none")))]:
        del args[name]  # an optional argument given as null: use the tool's default
    missing = [p for p in required if p not in args]
    if missing:
        raise ArgError(f"missing required argument(s): {', '.join(missing)}")
    return {n: _coerce(v, props.get(n, {}), n) for n, v in args.items()}


def split_call_args(spec: Declared, body: str, commas: list[int]) -> tuple[list[Any], dict[str, Any]]:
    """Split the text between the parentheses into positional and keyword values."""
    bounds = [-1, *commas, len(body)]
    pieces = [body[a + 1:b] for a, b in zip(bounds, bounds[1:])]
    if not pieces[-1].strip():  # f() or a trailing comma
        pieces.pop()
    positional, keyword = [], {}
    params = {tool_key(p) for p in spec.properties}
    for piece in pieces:
        m = _KEYWORD_RE.match(piece)
        if m and (m.group(2) != ":" or tool_key(m.group(1)) in params):
            if m.group(1) in keyword:
                raise ArgError(f"argument '{m.group(1)}' given twice")
            keyword[m.group(1)] = _parse_value(m.group(3))
        elif keyword:
            raise ArgError("positional argument after keyword argument")
        else:
            positional.append(_parse_value(piece))
    if len(spec.properties) == 1 and len(positional) > 1 and not keyword and body.lstrip()[0] not in "\"'[{":
        positional = [Bare(body.strip())]  # get_weather(Paris, France): one bare text argument
    return positional, keyword
