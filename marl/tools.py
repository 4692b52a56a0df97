"""Tools for scenario agents: a registry, a tolerant call parser, execution under a timeout, validity stats.

Agents (often tiny, sloppy LLMs) write tool calls inside their text turn. `ToolRegistry.parse` finds
them; `ToolRegistry.call` runs one; `ToolRegistry.run_all` does both. Nothing here raises on agent
text: a malformed call or a failing tool becomes an error *observation* (`ToolCallRecord(ok=False,
result="error: ...")`) and counts as an invalid (resp. failed) call of that agent.

Accepted call formats (tool names match case-insensitively, `-` and `_` alike):

1. A JSON object naming the tool under `tool`, `tool_name`, `name` or `function` and its arguments
   under `arguments`, `args`, `parameters`, `params` or `input`:
       {"tool": "get_weather", "arguments": {"city": "Paris"}}
   Also: `{"function": {"name": ..., "arguments": "<JSON string>"}}` (OpenAI style), arguments given
   flat (`{"tool": "get_weather", "city": "Paris"}`), single quotes, trailing commas, unquoted keys
   and bare-word values, True/False/None; text after the closing brace is ignored.
2. A function call, whitespace tolerant, optionally prefixed by `functions.` or the like:
       get_weather(city="Paris")   get_weather(city='Paris')   GET_WEATHER ( city = Paris )
       get_weather("Paris")   get_weather(Paris)   get_weather(city: "Paris")   get_weather({"city": "Paris"})
   Positional arguments map to the parameters in declared order; `key: value` is accepted for declared
   parameter names; bare values are literals (`12`, `2.5`, `true`/`True`, `null`/`None`) or text.
3. Either form may be wrapped: `CALL get_weather(...)`, a ```json fence, `<tool>...</tool>` or
   `<tool_call>...</tool_call>`.

Function-call syntax with a name that is not a registered tool is prose (`print(x)`) and is ignored,
unless it is marked as a call (upper-case `CALL foo(...)`, `<tool>foo(...)</tool>`); a JSON object
that names an unknown tool (an identifier) under `tool`/`function`, or next to an arguments key, is
also a call. Such calls, and calls with broken arguments (unbalanced brackets, unterminated strings,
invalid JSON, unknown or missing arguments, a value that cannot be coerced to its schema type), are
returned with `error` set. Values are coerced to the schema type when safe ("12" -> 12 for an integer;
bare `007` stays "007" for a string); an optional argument given as null is dropped (the tool's
default applies). Only the first `max_text_chars` characters are searched, and at most `max_calls`
calls are returned per text. A tool name that is an ordinary word followed by "(" in prose reads as a
call: prefer distinctive tool names (`get_weather`, not `add`).

Execution (marl/tool_host.py): a tool with a timeout runs in another process (a tool host, or a child
forked for the call), under `timeout_s` and `memory_mb` (what it may add to the address space), and
that process is killed when either runs out: a tool that loops, sleeps or allocates without end
becomes an error observation, and its memory is returned at once. A tool without a timeout
(`timeout_s=None`, trusted code only) runs in the calling thread. Results become text (JSON for
dicts/lists/tuples, `str` otherwise), clipped.
"""

from __future__ import annotations

import bisect
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.imports import resolve_callable as load_tool  # noqa: F401 - re-exported
from judges.types import ToolCallRecord
from marl.tool_host import run_tool
from marl.tool_syntax import ArgError, Bare, bind_arguments, loads_lenient, scan, split_call_args, tool_key
from marl.tool_process import DEFAULT_MEMORY_MB, clip_text

_NAME_KEYS = ("tool", "tool_name", "name", "function")
_ARG_KEYS = ("arguments", "args", "parameters", "params", "input")
_CALL_RE = re.compile(r"(?<![\w\-])([A-Za-z_][\w\-]*)[ \t]*\(")
_MARKED_RE = re.compile(r"(?:\bCALL\b\s*:?|(?i:<tool(?:_call)?>))\s*$")
_JSON_KEY_RE = re.compile(r"""["']?(?:tool|tool_name|name|function)["']?\s*:""", re.I)
_JSON_HEAD_RE = re.compile(r"""\{\s*["']?(tool|tool_name|name|function)["']?\s*:\s*["']?([\w\-]+)""", re.I)
_MAX_ATTEMPTS = 256  # bracket scans per parse: bounds the work on adversarial text


@dataclass(frozen=True)
class ToolSpec:
    """A tool: `function(**arguments)` described by a JSON-schema-like `parameters` object. A call may
    take `timeout_s` seconds and add `memory_mb` to its process's address space (None: no limit);
    `timeout_s=None` runs it in the calling thread, with neither limit (trusted code only)."""

    name: str
    function: Callable[..., Any]
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    timeout_s: float | None = 5.0
    memory_mb: int | None = DEFAULT_MEMORY_MB

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z_][\w\-]*", self.name or ""):
            raise ValueError(f"tool name {self.name!r} must be an identifier (letters, digits, '_' or '-')")
        if not callable(self.function):
            raise ValueError(f"tool {self.name!r}: function {self.function!r} is not callable")
        if self.memory_mb is not None and not (isinstance(self.memory_mb, int) and self.memory_mb > 0):
            raise ValueError(f"tool {self.name!r}: memory_mb must be a whole number of MB > 0 (or None), "
                             f"got {self.memory_mb!r}")
        props = self.parameters.get("properties") or {}
        if not isinstance(props, dict) or not all(isinstance(v, dict) for v in props.values()):
            raise ValueError(f"tool {self.name!r}: parameters.properties must map each argument name to a schema")
        for name in self.parameters.get("required") or ():
            if name not in props:
                raise ValueError(f"tool {self.name!r}: required argument {name!r} is not in parameters.properties")

    @property
    def properties(self) -> dict[str, dict[str, Any]]:
        """Parameter name -> schema, in declared order."""
        return dict(self.parameters.get("properties") or {})

    def usage(self) -> str:
        """One line for a prompt: `get_weather(city: string, days?: integer) - Current weather`."""
        required = set(self.parameters.get("required") or ())
        params = []
        for name, schema in self.properties.items():
            kind = "|".join(json.dumps(v) for v in schema["enum"]) if "enum" in schema else schema.get("type")
            params.append(f"{name}{'' if name in required else '?'}" + (f": {kind}" if kind else ""))
        line = f"{self.name}({', '.join(params)})"
        return f"{line} - {' '.join(self.description.split())}" if self.description.strip() else line


@dataclass(frozen=True)
class ParsedCall:
    """A tool call found in text. `error` is set when it cannot run (it then counts as invalid)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    text: str = ""
    start: int = 0
    end: int = 0

    @property
    def ok(self) -> bool:
        """True when the call is well formed and names a registered tool."""
        return self.error is None


class ToolRegistry:
    """The tools of a scenario: describe them, parse calls out of agent text, run them, count validity."""

    def __init__(self, specs: list[ToolSpec], max_result_chars: int = 2000, max_calls: int = 8,
                 max_text_chars: int = 20_000, max_call_chars: int = 4000):
        self.specs: dict[str, ToolSpec] = {}
        for spec in specs:
            if tool_key(spec.name) in self.specs:
                raise ValueError(f"duplicate tool name {spec.name!r} (names are compared case-insensitively, "
                                 "'-' and '_' alike)")
            self.specs[tool_key(spec.name)] = spec
        self.max_result_chars, self.max_calls = max_result_chars, max_calls
        self.max_text_chars, self.max_call_chars = max_text_chars, max_call_chars
        self._stats: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        """Registered tool names, in declaration order."""
        return [spec.name for spec in self.specs.values()]

    def get(self, name: str) -> ToolSpec | None:
        """The tool called `name` (case-insensitive, '-' and '_' alike), or None."""
        return self.specs.get(tool_key(name))

    def describe(self) -> str:
        """A compact listing for prompts, one `name(arg: type) - description` line per tool."""
        return "\n".join(spec.usage() for spec in self.specs.values())

    def parse(self, text: str) -> list[ParsedCall]:
        """Every tool call in `text`, in order (see the module docstring); never raises."""
        if not isinstance(text, str) or not self.specs:
            return []
        text = text[:self.max_text_chars]
        starts: list[tuple[int, Any]] = [(i, "json") for i in self._json_starts(text)]
        starts += [(m.start(1), m) for m in _CALL_RE.finditer(text)]
        calls: list[ParsedCall] = []
        pos, attempts = 0, 0
        for start, how in sorted(starts, key=lambda item: item[0]):
            if start < pos or len(calls) >= self.max_calls or attempts >= _MAX_ATTEMPTS:
                continue
            if how != "json" and not (self.get(how.group(1)) or _MARKED_RE.search(text, max(0, start - 32), start)):
                continue
            attempts += 1
            limit = min(len(text), start + self.max_call_chars)
            try:
                found = self._json_call(text, start, limit) if how == "json" else self._syntax_call(text, how, limit)
            except Exception:  # noqa: BLE001 - last-resort guard: agent text must never crash the environment
                continue
            if found is not None:
                calls.append(found)
                pos = found.end
        return calls

    def _json_starts(self, text: str) -> list[int]:
        """Positions of '{' followed, within max_call_chars, by a tool-name key (cheap pre-filter)."""
        keys = [m.start() for m in _JSON_KEY_RE.finditer(text)]
        starts = []
        for m in re.finditer(r"\{", text):
            k = bisect.bisect_right(keys, m.start())
            if k < len(keys) and keys[k] < m.start() + self.max_call_chars:
                starts.append(m.start())
        return starts

    def _make(self, name: str, text: str, start: int, end: int, positional: list[Any] | None = None,
              keyword: dict[str, Any] | None = None, error: str | None = None) -> ParsedCall:
        """A ParsedCall for `name`, binding the arguments (or carrying the error)."""
        spec, keyword = self.get(name), keyword or {}
        if spec is None:
            error = f"unknown tool '{name}' (available: {', '.join(self.names)})"
        elif error is None:
            try:
                return ParsedCall(spec.name, bind_arguments(spec, positional or [], keyword), None, text[start:end], start, end)
            except (ArgError, ValueError) as exc:
                error = str(exc)
        plain = {str(k): (str(v) if isinstance(v, Bare) else v) for k, v in keyword.items()}
        return ParsedCall(spec.name if spec else name, plain, error, text[start:end], start, end)

    def _syntax_call(self, text: str, match: re.Match, limit: int) -> ParsedCall | None:
        """A `name(args)` call whose opening parenthesis ends `match`."""
        name, open_at = match.group(1), match.end() - 1
        end, reason, commas = scan(text, open_at, limit, split=True)
        if end is None:
            return self._make(name, text, match.start(1), limit, error=reason)
        spec = self.get(name)
        if spec is None:
            return self._make(name, text, match.start(1), end)
        try:
            positional, keyword = split_call_args(spec, text[open_at + 1:end - 1], [c - open_at - 1 for c in commas])
        except ArgError as exc:
            return self._make(name, text, match.start(1), end, error=str(exc))
        return self._make(name, text, match.start(1), end, positional, keyword)

    def _json_call(self, text: str, start: int, limit: int) -> ParsedCall | None:
        """A call written as a JSON object at text[start] ('{'), or None when the object is not a call."""
        head = _JSON_HEAD_RE.match(text, start)
        marked = head is not None and (self.get(head.group(2)) is not None or head.group(1).lower() != "name")
        end, reason, _ = scan(text, start, limit)
        if end is None:
            return self._make(head.group(2), text, start, head.end(), error=f"broken JSON: {reason}") if marked \
                else None
        try:
            obj = loads_lenient(text[start:end])
        except ValueError as exc:
            return self._make(head.group(2), text, start, end, error=f"arguments {exc}") if marked else None
        if not isinstance(obj, dict):
            return None
        lower = {str(k).lower(): v for k, v in obj.items()}
        if isinstance(lower.get("function"), dict):
            lower = {str(k).lower(): v for k, v in lower["function"].items()} | {"function": None}
        name_key = next((k for k in _NAME_KEYS if isinstance(lower.get(k), str)), None)
        arg_key = next((k for k in _ARG_KEYS if k in lower), None)
        if name_key is None or not (self.get(lower[name_key]) or (
                (name_key != "name" or arg_key) and re.fullmatch(r"[A-Za-z_][\w\-.]*", lower[name_key]))):
            return None
        if arg_key is None:
            args: Any = {k: v for k, v in obj.items() if str(k).lower() not in (name_key, "type", "id")}
        else:
            args = lower[arg_key]
        if args is None or (isinstance(args, str) and not args.strip()):
            args = {}
        if isinstance(args, str) and args.lstrip().startswith(("{", "[")):
            try:
                args = loads_lenient(args)
            except ValueError as exc:
                return self._make(lower[name_key], text, start, end, error=f"arguments {exc}")
        if isinstance(args, dict):
            return self._make(lower[name_key], text, start, end, [], args)
        return self._make(lower[name_key], text, start, end, args if isinstance(args, list) else [args])

    def call(self, agent: str, parsed: ParsedCall) -> ToolCallRecord:
        """Run one parsed call for `agent`; errors and timeouts become an `ok=False` record, never raise."""
        spec = self.get(parsed.name)
        error = parsed.error
        args = dict(parsed.arguments)
        if error is None and spec is None:
            error = f"unknown tool '{parsed.name}' (available: {', '.join(self.names)})"
        if error is None:
            try:
                args = bind_arguments(spec, [], args)
            except (ArgError, ValueError) as exc:
                error = str(exc)
        if error is not None:
            self._count(agent, valid=False, ok=False)
            usage = f"; usage: {spec.usage().split(' - ')[0]}" if spec else ""
            return ToolCallRecord(agent, parsed.name, args, False, self._clip(f"error: invalid call: {error}{usage}"))
        kind, text = run_tool(spec.function, args, timeout_s=spec.timeout_s, memory_mb=spec.memory_mb,
                              max_chars=self.max_result_chars)
        ok = kind == "ok"
        self._count(agent, valid=True, ok=ok)
        return ToolCallRecord(agent, spec.name, args, ok, text if kind in ("ok", "error") else
                              self._clip(_stopped(spec, kind, text)))

    def run_all(self, agent: str, text: str) -> list[ToolCallRecord]:
        """Parse `text` and run every call in it, in order."""
        return [self.call(agent, parsed) for parsed in self.parse(text)]

    def _clip(self, text: str) -> str:
        return clip_text(text, self.max_result_chars)

    def _count(self, agent: str, valid: bool, ok: bool) -> None:
        with self._lock:
            stats = self._stats.setdefault(agent, {"calls": 0, "valid": 0, "invalid": 0, "failed": 0})
            stats["calls"] += 1
            stats["valid" if valid else "invalid"] += 1
            stats["failed"] += int(valid and not ok)

    def stats(self, agent: str) -> dict[str, int]:
        """{"calls", "valid", "invalid", "failed"} for `agent`; failed = valid calls whose tool raised/timed out."""
        with self._lock:
            return dict(self._stats.get(agent, {"calls": 0, "valid": 0, "invalid": 0, "failed": 0}))

    def validity(self, agent: str) -> float | None:
        """Fraction of `agent`'s calls that were well formed, or None before its first call."""
        stats = self.stats(agent)
        return stats["valid"] / stats["calls"] if stats["calls"] else None

    def reset_stats(self) -> None:
        """Forget every agent's counters."""
        with self._lock:
            self._stats.clear()


def _stopped(spec: ToolSpec, kind: str, how: str) -> str:
    """The observation of a call that was stopped: out of time, out of memory, or dead without a result."""
    if kind == "timeout":
        return f"error: TimeoutError: {spec.name} did not finish within {spec.timeout_s} s"
    if kind == "memory":
        limited = spec.timeout_s is not None and spec.memory_mb is not None
        return f"error: MemoryError: {spec.name} " + (f"went over its memory limit of {spec.memory_mb} MB" if limited
                                                       else "ran out of memory")
    return f"error: ToolError: {spec.name} stopped without a result: {how}"
