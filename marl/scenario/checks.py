"""Checks that make `marl validate` refuse what `marl run` would fail on, and bounded task generation.

- Observation templates: only the known fields, no positional or attribute/index fields, no format
  spec wider than `MAX_TEMPLATE_WIDTH` (`{prompt:>2000000000}` would allocate 2 GB per observation).
- Endpoint URLs (`base_url`): http(s) with a host, so a missing scheme fails validation, not every call.
- Patterns (`graph.end_on`): compiled with RE2 now, so a bad one is a located problem, not a crash.
- Tool functions: model-written arguments reach them, so they must be defined in a `.py` file inside
  the scenario's own folder or in an allow-listed module (`ALLOWED_TOOL_MODULES`); `os:system`,
  `subprocess:run`, `builtins:eval`, `shutil:rmtree` and re-exports of them are refused.
- SQL databases: a `sql` scorer's `database` must be an SQLite file (checked by its header).
- `run_generator`: a task generator runs under `tasks.timeout_s` and must return task mappings.
"""

from __future__ import annotations

import itertools
import re
import string
import threading
import urllib.parse
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from common.files import FileProblem, read_user_head
from common.imports import resolve_callable
from judges.rules.patterns import compile_pattern

ALLOWED_TOOL_MODULES = frozenset({"math", "statistics"})
MAX_TEMPLATE_WIDTH = 10_000
PLAIN_FIELDS = ("prompt", "role", "history", "tools", "tool_results", "state")
_DOTTED_FIELD = re.compile(r"(task|msg)\.([A-Za-z0-9][A-Za-z0-9_]*)")  # no _private or __dunder__ attributes
_SQLITE_HEADER = b"SQLite format 3\x00"


class GeneratorProblem(Exception):
    """A task generator that hung, failed, or returned something that is not a list of tasks."""


def template_problems(template: str, agent_names: list[str]) -> list[str]:
    """What is wrong with one observation template (empty when it is sound)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        return [f"{error} (write {{{{ and }}}} for literal braces)"]
    problems = []
    for _, field, spec, _ in parsed:
        if field is None:
            continue
        problem = _field_problem(field, agent_names) or _spec_problem(field, spec or "")
        if problem:
            problems.append(problem)
    return problems


def task_fields(template: str) -> list[str]:
    """The metadata keys a template reads as {task.KEY}, in order (none when it does not parse)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        return []
    found = [_DOTTED_FIELD.fullmatch(field) for _, field, _, _ in parsed if field]
    return list(dict.fromkeys(match.group(2) for match in found if match and match.group(1) == "task"))


def _field_problem(field: str, agent_names: list[str]) -> str | None:
    known = ", ".join(f"{{{name}}}" for name in PLAIN_FIELDS) + ", {task.KEY}, {msg.AGENT}"
    if field in PLAIN_FIELDS:
        return None
    dotted = _DOTTED_FIELD.fullmatch(field)
    if dotted is None:
        return f"unknown field {{{field}}} (fields: {known}; write {{{{ and }}}} for literal braces)"
    if dotted.group(1) == "msg" and dotted.group(2) not in agent_names:
        return f"{{msg.{dotted.group(2)}}} names no agent (known: {', '.join(agent_names)})"
    return None


def _spec_problem(field: str, spec: str) -> str | None:
    if not spec:
        return None
    if "{" in spec:
        return f"{{{field}:{spec}}}: nested fields in a format spec are not supported"
    widths = [int(digits) for digits in re.findall(r"\d+", spec)]
    if any(width > MAX_TEMPLATE_WIDTH for width in widths):
        return f"{{{field}:{spec}}}: width {max(widths):,} is too large (at most {MAX_TEMPLATE_WIDTH:,})"
    try:
        format("", spec)
    except ValueError as error:
        return f"{{{field}:{spec}}}: {error} (fields are text: use e.g. {{{field}:>20}} or no spec)"
    return None


def url_problem(url: str) -> str | None:
    """Why `url` is not an endpoint's http(s) URL with a host (and a numeric port, if any), or None.

    Checked at validation: an OpenAI client given `localhost:8000/v1` fails every call, and a run would
    otherwise play on with every judgment masked.
    """
    parsed = urllib.parse.urlsplit(url.strip())
    example = f"http://{url.strip()}" if "://" not in url else "http://127.0.0.1:8000/v1"
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"expected an http:// or https:// URL with a host, e.g. {example}"
    try:
        parsed.port  # noqa: B018 - urllib checks the port only when it is read
    except ValueError:
        return f"the port of {url!r} is not a number from 0 to 65535 (e.g. http://127.0.0.1:8000/v1)"
    return None


def pattern_problem(pattern: str) -> str | None:
    """Why RE2 cannot compile `pattern`, or None."""
    try:
        compile_pattern(pattern)
    except ValueError as error:
        return str(error)
    return None


def resolve_tool(reference: str, base_dir: Path):
    """The tool function named by `reference`, if it is defined where tools may live; else ValueError."""
    module_name = (reference or "").partition(":")[0].strip()
    function = resolve_callable(reference, base_dir)
    defined_in = getattr(function, "__module__", None) or ""
    if module_name in ALLOWED_TOOL_MODULES and defined_in == module_name:
        return function
    file = base_dir.joinpath(*module_name.removesuffix(".py").split(".")).with_suffix(".py")
    inside = file.is_file() and file.resolve().is_relative_to(base_dir.resolve())
    if inside and defined_in.startswith("_marl_tool_"):
        return function
    where = f"it is defined in module {defined_in!r}" if inside else f"{module_name!r} is not a .py file there"
    raise ValueError(f"tool function {reference!r} must be defined in a .py file in the scenario's folder "
                     f"({base_dir}) or in an allowed module ({', '.join(sorted(ALLOWED_TOOL_MODULES))}), but "
                     f"{where}: write the tool as a function in a *_lib.py next to the scenario")


def database_problem(database, base_dir: Path) -> str | None:
    """Why the `database` of a sql scorer is not an SQLite file, or None."""
    try:  # a FIFO or /dev/zero named as the database: refused unopened, never waited on
        header = read_user_head(Path(base_dir) / str(database), len(_SQLITE_HEADER), "an SQLite file")
    except FileProblem as problem:
        return f"database {str(database)!r} {problem.reason}"
    if header != _SQLITE_HEADER:
        return f"database {str(database)!r} is not an SQLite file (its first bytes are not 'SQLite format 3'); " \
               "give the path of an SQLite database"
    return None


def call_within(function, timeout_s: float, late: str):
    """function() in a daemon thread, its result or its exception within `timeout_s`; GeneratorProblem(late)
    when it is not done by then (a Python thread cannot be killed: it is left running until the process
    exits)."""
    future: Future = Future()

    def work() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(function())
            except BaseException as error:  # noqa: BLE001 - user code: reported by the caller
                future.set_exception(error)

    threading.Thread(target=work, name="scenario-code", daemon=True).start()
    try:
        return future.result(timeout=timeout_s)
    except FutureTimeout:
        if future.done():
            raise
        raise GeneratorProblem(late) from None


def run_generator(generator, reference: str, seed: int, count: int, timeout_s: float) -> list[dict]:
    """The first `count` tasks of `generator(seed=, count=)` as dicts, computed within `timeout_s`.

    The generator runs in a daemon thread: one that never returns is reported after `timeout_s`
    (a Python thread cannot be killed, so it is left running until the process exits).
    """
    return call_within(lambda: _collect(generator(seed=seed, count=count), reference, count), timeout_s,
                       f"{reference} did not return within {timeout_s:g} s (make it faster, or raise tasks.timeout_s)")


def _collect(produced, reference: str, count: int) -> list[dict]:
    shape = "it must return a list of task mappings such as {prompt: '1+1=', answer: '2'}"
    if isinstance(produced, (str, bytes, dict)) or not hasattr(produced, "__iter__"):
        raise GeneratorProblem(f"{reference} returned {_shown(produced)}; {shape}")
    tasks = []
    for index, task in enumerate(itertools.islice(produced, count)):
        if isinstance(task, dict):
            tasks.append(task)
        elif hasattr(task, "__dict__") and not isinstance(task, type):
            tasks.append(dict(vars(task)))
        else:
            raise GeneratorProblem(f"{reference} returned {_shown(task)} as task {index}; {shape}")
    return tasks


def _shown(value) -> str:
    text = repr(value)
    return f"{text[:40]}{'...' if len(text) > 40 else ''} (of type {type(value).__name__})"
