"""What a run wrote into its folder, read back so that no file there can hang, flood or crash the reader.

A run folder is named by the user (`marl run --resume --out RUN`, `--init-from RUN`, `marl eval --checkpoint
RUN`) and may hold anything by then: a FIFO or a link to /dev/zero in place of before.json, latin-1 bytes
in metrics.jsonl, a 5,000-digit integer or JSON nested 100,000 deep in run.json. Every such file is read
through common/files.py (stat before open, a non-blocking open, a size bound, UTF-8, bounded JSON), and a
problem is a `RunFileProblem`: one line naming the file (and line), what is wrong and the fix.

    read_run_json(path, what=..., missing=...)    the JSON object of run.json, before.json, continual.json...
    read_run_figures(path)                        the held-out figures of before.json (metric -> number)
    figures_problem(value)                        why a value is not such figures, or None
    read_run_rows(path)                           (text, [(line, row)]) of metrics.jsonl or tables/*.jsonl
    run_file_problem(problem, fix)                a FileProblem of common/files.py as a run file's one line
    what_is_wrong(reason)                         a FileProblem's reason without the fix it suggests

NaN and Infinity are accepted (Python's json.dumps writes them for a NaN figure). In a JSON-lines record a
line that is not JSON at all is skipped, as it always was: a crash while a row was appended leaves a torn
one, and resume drops it (trainers/records/report.py); a line nested too deep or with too many digits is
never torn, and is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from common.files import (FileProblem, NotJSON, decode_utf8, json_type, parse_json_line, read_json_file,
                          read_user_file, text_lines)

MAX_JSON_BYTES = 64 << 20  # one JSON file of a run (run.json, before.json, a manifest): a few KB in practice
MAX_ROWS_BYTES = 1 << 30  # metrics.jsonl or a table: about 1.5 KB a step, so a million steps fit
RESTORE = "restore it from a copy, or start a new run with --out NEWDIR"
_MISSING = object()


class RunFileProblem(FileProblem):
    """A file of a run folder that cannot be used as marl wrote it (a ValueError: one line, exit 2)."""


def what_is_wrong(reason: str) -> str:
    """The part of a common/files.py reason that says what is wrong, without the fix it suggests for a data
    file ('flatten it', 'give a JSON-lines file'): a run file's fix is to restore it."""
    depth = 0
    for index, char in enumerate(reason):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == ";" and depth == 0:
            return reason[:index]
    return reason.removesuffix(": save the file as UTF-8")


def run_file_problem(problem: FileProblem, fix: str = RESTORE) -> RunFileProblem:
    """`problem` (a file of a run folder that failed to read) as one line: where, what is wrong, `fix`."""
    return RunFileProblem(problem.path, f"{what_is_wrong(problem.reason)} (not as marl writes it); {fix}",
                          problem.line, problem.column)


def read_run_json(path: Path | str, *, what: type = dict, missing: Any = _MISSING, fix: str = RESTORE) -> Any:
    """The JSON value of a run's file `path`, of type `what` (an object by default); `missing` when no file
    of that name exists (a dangling link is a problem, not a missing file), FileNotFoundError without it.

    RunFileProblem (one line, ending with `fix`) for a file that is not a regular file, is over MAX_JSON_BYTES,
    is not UTF-8 or not JSON, nests too deep, holds a 5,000-digit integer, or is not of type `what`."""
    if missing is not _MISSING and not os.path.lexists(path):
        return missing
    try:
        value = read_json_file(path, max_bytes=MAX_JSON_BYTES, expected="a JSON file", constants=True)
    except FileProblem as problem:
        if missing is _MISSING and not os.path.lexists(path):
            raise FileNotFoundError(2, "No such file or directory", str(path)) from None
        raise run_file_problem(problem, fix) from None
    if not isinstance(value, what):
        raise RunFileProblem(path, f"holds {json_type(value)}, not {json_type(what())} (not as marl writes it); "
                                   f"{fix}")
    _check_numbers(path, 1, value, fix)
    return value


def _check_numbers(path, line: int, value: Any, fix: str) -> None:
    """RunFileProblem when `value` holds an integer a float cannot hold (|n| >= 2**63: marl writes counts and
    steps far below): the digit bound lets 400 digits through, and a report's float of it raises OverflowError."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, int) and not isinstance(node, bool) and abs(node) >= 2**63:
            raise RunFileProblem(path, f"an integer of {len(str(abs(node))):,} digits, more than any count or step "
                                       f"(not as marl writes it); {fix}", line)
        stack.extend(node.values() if isinstance(node, dict) else node if isinstance(node, list) else ())


def figures_problem(figures: Any) -> str | None:
    """Why `figures` is not a run's held-out figures (an object of metric -> number, NaN allowed), or None."""
    if not isinstance(figures, dict):
        return f"the figures are {json_type(figures)}, not an object of metric -> number"
    bad = next((key for key, value in figures.items() if isinstance(value, bool) or not isinstance(value, (int, float))),
               None)
    return None if bad is None else f"figure {bad[:80]!r} is {json_type(figures[bad])}, not a number"


def read_run_figures(path: Path | str, *, fix: str = RESTORE) -> dict | None:
    """A run's held-out figures (before.json: metric -> number), None when the file does not exist;
    RunFileProblem when it cannot be read or holds anything but numbers (a report would print them)."""
    figures = read_run_json(path, missing=None, fix=fix)
    if figures is not None and (problem := figures_problem(figures)) is not None:
        raise RunFileProblem(path, f"{problem} (not as marl writes it); {fix}")
    return figures


def read_run_rows(path: Path | str, *, fix: str = RESTORE) -> tuple[str, list[tuple[str, dict]]]:
    """(the file's text, [(line, row)] of its JSON-object lines) of a run's JSON-lines record `path`.

    A line that is not JSON (torn by a crash while it was appended) or not an object is left out of the
    rows; a last line cut in the middle of a UTF-8 character is such a torn line too. Any other problem (a
    FIFO, a device, a folder, over MAX_ROWS_BYTES, a bad byte before the last line, a line too deep or with
    too many digits) is a RunFileProblem naming the file and line."""
    try:
        data = read_user_file(path, max_bytes=MAX_ROWS_BYTES, expected="a JSON-lines file")
        body, newline, tail = data.rpartition(b"\n")
        text = decode_utf8(body + newline, path)
        rows = []
        for number, line in text_lines(text + _torn_tail(tail)):
            row = _row(path, number, line)
            if isinstance(row, dict):
                _check_numbers(path, number, row, fix)
                rows.append((line, row))
    except RunFileProblem:
        raise
    except FileProblem as problem:
        raise run_file_problem(problem, fix) from None
    return text + tail.decode("utf-8", "replace"), rows  # the text as it is, for a rewrite to compare with


def _torn_tail(tail: bytes) -> str:
    """The text after the last newline, for the rows: a line being appended when the run stopped, so bytes of
    it that are not UTF-8 (a character cut in two) make it a torn line, dropped, not a bad file."""
    try:
        return tail.decode("utf-8")
    except UnicodeDecodeError:
        return ""


def _row(path, number: int, line: str) -> Any:
    """The JSON value of one line, None for a line that is not JSON (a torn row)."""
    try:
        return parse_json_line(path, number, line, constants=True)
    except NotJSON:
        return None
