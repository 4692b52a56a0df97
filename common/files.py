"""Files written so that a crash never leaves a half-written one in place, and user files read so that
no file can hang, flood or crash the reader.

Writing: everything is written into a temporary sibling first, synced, and renamed into place (a rename
within one file system is atomic), so readers see either the old complete version or the new complete
one. A write that fails (a full disk, `ulimit -f`, a read-only directory) leaves the old version as it
was and no temporary file behind.

    atomic_file(path, mode)                           a handle on a temporary sibling, renamed to `path` on a clean exit
    write_text_atomically(path, text)                 a UTF-8 text file
    write_bytes_atomically(path, data)                a binary file
    write_directory_atomically(target, write, ...)    a whole directory, filled by `write(tmp)`

Reading: a file a user names (a scenario, its tasks file, judge items, preference pairs, a calibrator)
may be anything: a FIFO (a read would block forever), /dev/zero (it never ends), a folder, a file of
mode 000, latin-1 text, a number of 5,000 digits, JSON nested 100,000 deep. Each is a `FileProblem`: a
ValueError of one line naming the file (and the line, for JSON lines), what is wrong and the fix.

    read_user_file(path, max_bytes=...)               the bytes of a regular file, at most max_bytes
    read_user_text(path, max_bytes=...)               the same, decoded as UTF-8 (the line of a bad byte)
    read_user_head(path, size)                        its first `size` bytes (a format's header)
    user_file_problem(path)                           why `path` is not a readable regular file, or None
    text_lines(text)                                  (number, line) of the non-blank lines, split at \\n only
    parse_json_line(path, number, line)               one JSON value, bounded in nesting and digits
    read_json_file(path, max_bytes=...)               the JSON value of a whole file, bounded the same way
    read_json_objects(path, what=...)                 (number, object) of a JSON-lines file

Writing is used by checkpoints (`trainers/records/checkpoint.py`), the tiny-model cache
(`trainers/policy/tinylm.py`), saved calibrators, the metrics and table rewrites of a resume and every
report file; reading by the scenario loader (`marl/scenario/load.py`), `marl judges` (`judges/workflows.py`),
`marl rm train` (`trainers/reward/pairs.py`) and calibrator files. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

MAX_DATA_BYTES = 256 << 20  # a JSON-lines data file (tasks, judge items, preference pairs): 256 MiB
MAX_INT_DIGITS = 4300  # Python's own default for int(str) (sys.get_int_max_str_digits): no setting needs more
MAX_JSON_DEPTH = 100  # levels of nesting of one JSON value; data files need a few, deeper is hostile


@contextlib.contextmanager
def atomic_file(path: Path | str, mode: str = "w") -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; on a clean exit it is synced and renamed to
    `path`, on an exception it is removed and `path` is left untouched."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        _keep_mode(path, tmp)
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)  # a failed write() names no file; the message should
        raise
    _sync_directory(path.parent)


def write_text_atomically(path: Path | str, text: str) -> None:
    """Write a text file (UTF-8) through a synced temporary file and an atomic rename."""
    with atomic_file(path) as handle:
        handle.write(text)


def write_bytes_atomically(path: Path | str, data: bytes) -> None:
    """Write a binary file through a synced temporary file and an atomic rename."""
    with atomic_file(path, "wb") as handle:
        handle.write(data)


def _keep_mode(path: Path, tmp: str) -> None:
    """mkstemp creates 0600 files; a file that replaces another keeps its permissions, a new one gets
    the usual 0666 minus the umask."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)


def _sync_directory(directory: Path) -> None:
    """fsync a directory so a rename in it survives a power loss (best effort: not every FS allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_directory_atomically(target: Path, write: Callable[[Path], None], *, keep_existing: bool = False) -> None:
    """Call `write(tmp)` on a fresh temporary sibling of `target`, then rename it to `target`.

    An existing `target` is swapped out (and put back if the rename fails); with `keep_existing` it
    is kept instead and the new copy dropped (two processes building the same cached directory). The
    temporary directory is removed whatever happens.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        if target.exists() and keep_existing:
            return
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename the finished directory to its name; an older one of that name is swapped out first."""
    if not target.exists():
        os.replace(tmp, target)
        return
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except OSError:
        os.replace(old, target)  # put the complete one back where readers look for it
        raise
    shutil.rmtree(old, ignore_errors=True)


# -- reading files a user names -------------------------------------------------------------------------------
class FileProblem(ValueError):
    """A user file that cannot be used: one line, `FILE: reason` or `FILE:LINE: reason` (a JSON line)."""

    def __init__(self, path, reason: str, line: int = 0, column: int = 0):
        self.path, self.reason, self.line, self.column = str(path), reason, line, column
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")


class NotJSON(FileProblem):
    """A line (or file) that is not JSON at all: a reader of files a crash may cut short (a run's metrics)
    skips such a torn line, where a hostile one (too deep, too many digits) is still refused."""


class FileTooLarge(FileProblem):
    """A user file over its size limit: `size` its bytes (at least that many when not `exact`), `limit`."""

    def __init__(self, path, size: int, limit: int, exact: bool = True):
        self.size, self.limit, self.exact = size, limit, exact
        over = "" if exact else "more than "
        super().__init__(path, f"is {over}{size if exact else limit:,} bytes, over the limit of {limit:,} bytes "
                               "for this file; give a smaller one")


_KINDS = ((stat.S_ISDIR, "a folder", ""),
          (stat.S_ISFIFO, "a named pipe (FIFO)", " (reading one waits for a writer that may never come)"),
          (stat.S_ISCHR, "a character device", " (a device such as /dev/zero never ends)"),
          (stat.S_ISBLK, "a block device", ""), (stat.S_ISSOCK, "a socket", ""))


def _kind_problem(mode: int, expected: str) -> str | None:
    """Why a file of this st_mode is not read (it is not a regular file), or None."""
    if stat.S_ISREG(mode):
        return None
    kind, why = next(((name, why) for test, name, why in _KINDS if test(mode)), ("something else", ""))
    return f"is {kind}, not a regular file{why}; give {expected}"


def _os_problem(error: OSError, expected: str) -> str:
    """An OSError of opening or reading a user file, in words with the fix."""
    if isinstance(error, FileNotFoundError):
        return f"cannot be read: no such file; check the path, which should name {expected}"
    if isinstance(error, PermissionError):
        return "cannot be read: permission denied; make it readable (chmod u+r) or give another file"
    return f"cannot be read ({error.strerror or error}); give {expected}"


def user_file_problem(path, expected: str = "a regular file") -> str | None:
    """Why `path` is not a readable regular file (in words, with the fix), or None; nothing is opened."""
    try:
        mode = os.stat(path).st_mode  # follows a link: a user may name a link to their file
    except OSError as error:
        return _os_problem(error, expected)
    except ValueError:  # a path with a NUL byte in it (from YAML's "\0"): no file has that name
        return f"cannot be read: the path holds a NUL byte, which no file name can; give {expected}"
    if (problem := _kind_problem(mode, expected)) is not None:
        return problem
    if not os.access(path, os.R_OK):
        return _os_problem(PermissionError(), expected)
    return None


@contextlib.contextmanager
def _open_regular(path, expected: str) -> Iterator[tuple[IO[bytes], os.stat_result]]:
    """(binary handle, fstat) of the regular file `path`, checked before the open and after it (the path may
    be swapped meanwhile); the open is non-blocking, so a FIFO cannot make it wait for a writer."""
    if (problem := user_file_problem(path, expected)) is not None:
        raise FileProblem(path, problem)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise FileProblem(path, _os_problem(error, expected)) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if (problem := _kind_problem(info.st_mode, expected)) is not None:
            raise FileProblem(path, problem)
        yield handle, info


def _read(handle: IO[bytes], size: int, path, expected: str) -> bytes:
    try:
        return handle.read(size)
    except OSError as error:  # EIO, EISDIR on odd file systems: the message, never a traceback
        raise FileProblem(path, _os_problem(error, expected)) from None


def read_user_file(path, *, max_bytes: int = MAX_DATA_BYTES, expected: str = "a regular file") -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` of them; FileProblem otherwise.

    A FIFO, a device, a folder or a socket is refused before it is opened (os.stat), and again after it
    (fstat of the open file decides: the open is non-blocking, so a FIFO swapped in cannot make it wait).
    A file larger than `max_bytes` is refused unread (FileTooLarge); `expected` names what to give instead.
    """
    with _open_regular(path, expected) as (handle, info):
        if info.st_size > max_bytes:
            raise FileTooLarge(path, info.st_size, max_bytes)
        data = _read(handle, max_bytes + 1, path, expected)  # a file that grows as it is read stops here too
    if len(data) > max_bytes:  # st_size said less: a file that grew, or one of /proc (st_size 0)
        raise FileTooLarge(path, len(data), max_bytes, exact=False)
    return data


def read_user_head(path, size: int, expected: str = "a regular file") -> bytes:
    """The first `size` bytes of the regular file `path` (fewer when it is shorter), e.g. a format's magic
    header; FileProblem when it is not a readable regular file (checked as read_user_file does)."""
    with _open_regular(path, expected) as (handle, _):
        return _read(handle, size, path, expected)


def decode_utf8(data: bytes, path) -> str:
    """`data` as UTF-8 text (a leading byte-order mark dropped); FileProblem at the line of a bad byte."""
    for bom, name in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
                      (b"\xfe\xff", "UTF-16")):
        if data.startswith(bom):
            raise FileProblem(path, f"is {name} text; save it as UTF-8")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise FileProblem(path, f"not UTF-8 text (byte 0x{data[error.start]:02x} at column {column}; perhaps "
                                "latin-1 or cp1252): save the file as UTF-8", line, column) from None


def read_user_text(path, *, max_bytes: int = MAX_DATA_BYTES, expected: str = "a regular file") -> str:
    """The UTF-8 text of the regular file `path` (read_user_file, then decode_utf8); FileProblem otherwise."""
    return decode_utf8(read_user_file(path, max_bytes=max_bytes, expected=expected), path)


def text_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based number, line) of each non-blank line; split at \\n only (str.splitlines would also split at
    U+2028 and other separators a JSON string may hold), a trailing \\r dropped."""
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if line.strip():
            yield number, line


class _Refused(ValueError):
    """A number the JSON reader refuses: `token` (to find its column) and why."""

    def __init__(self, token: str, reason: str):
        super().__init__(reason)
        self.token = token


def _bounded_int(token: str) -> int:
    """A JSON integer, refused past MAX_INT_DIGITS digits (whatever the interpreter's own limit is set to:
    converting a number of a million digits takes seconds)."""
    limit = min(MAX_INT_DIGITS, sys.get_int_max_str_digits() or MAX_INT_DIGITS)
    digits = len(token.lstrip("-"))
    if digits > limit:
        raise _Refused(token, f"an integer of {digits:,} digits (at most {limit:,} are read); no value needs "
                              "that many: write it as a string if it is text")
    return int(token)


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _Refused(token, f"the number {token[:20]}{'...' if len(token) > 20 else ''} is too large for a "
                              "float; write a smaller number, or a string")
    return value


def _no_constant(token: str):
    raise _Refused(token, f"{token} is not a JSON number (JSON has no NaN or Infinity); write a number or null")


def _too_deep(value: Any, limit: int) -> bool:
    """Whether `value` nests lists and objects more than `limit` levels deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def parse_json_line(path, number: int, line: str, *, constants: bool = False) -> Any:
    """The JSON value of line `number` of `path`; FileProblem (`FILE:LINE: ...`, one line) when it is not
    JSON (NotJSON), nests deeper than MAX_JSON_DEPTH, or holds an integer past MAX_INT_DIGITS digits, NaN,
    Infinity or a float that overflows. `constants` accepts NaN and Infinity (what Python's json.dumps writes
    for them: a run's own metrics hold them). A whole JSON file (a calibrator) is line 1 with all of its text
    as `line`: a problem then names the line of the file it is on."""
    deep = f"JSON nested more than {MAX_JSON_DEPTH} levels deep; flatten it (data needs a few levels)"
    try:
        value = json.loads(line, parse_int=_bounded_int, parse_float=_finite_float,
                           parse_constant=float if constants else _no_constant)
    except json.JSONDecodeError as error:
        line_no = number + error.lineno - 1
        raise NotJSON(path, f"not valid JSON ({error.msg} at column {error.colno})", line_no, error.colno) from None
    except _Refused as error:
        offset = max(line.find(error.token), 0)
        column = offset - (line.rfind("\n", 0, offset) + 1) + 1
        raise FileProblem(path, f"{error} (column {column})", number + line.count("\n", 0, offset), column) from None
    except RecursionError:  # the C decoder recurses per level: thousands of '[' end here
        raise FileProblem(path, deep, number) from None
    except ValueError as error:  # int() under a lower interpreter limit (PYTHONINTMAXSTRDIGITS)
        raise FileProblem(path, f"a number that cannot be read ({str(error).split(';')[0]})", number) from None
    if _too_deep(value, MAX_JSON_DEPTH):
        raise FileProblem(path, deep, number)
    return value


def read_json_file(path, *, max_bytes: int = MAX_DATA_BYTES, expected: str = "a JSON file",
                   constants: bool = False) -> Any:
    """The JSON value of the whole regular file `path` (read_user_text, then parse_json_line: bounded in
    size, nesting and digits); FileProblem naming the file and the line of the problem otherwise."""
    return parse_json_line(path, 1, read_user_text(path, max_bytes=max_bytes, expected=expected), constants=constants)


def read_json_objects(path, *, what: str = "", max_bytes: int = MAX_DATA_BYTES) -> list[tuple[int, dict]]:
    """(line number, object) of each non-blank line of the JSON-lines file `path`; FileProblem for the file
    (read_user_text) or its first bad line, e.g. a line that is not an object (`what` says what a line
    holds: 'with prompt, chosen, rejected')."""
    an_object = f"a JSON object {what}" if what else "a JSON object"
    text = read_user_text(path, max_bytes=max_bytes, expected=f"a JSON-lines file ({an_object} per line)")
    rows = []
    for number, line in text_lines(text):
        data = parse_json_line(path, number, line)
        if not isinstance(data, dict):
            raise FileProblem(path, f"expected {an_object}, got {json_type(data)}", number)
        rows.append((number, data))
    return rows


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type: object, array, string, number, true/false, null."""
    if isinstance(value, bool):
        return "true" if value else "false"
    names = ((dict, "an object"), (list, "an array"), (str, "a string"), (int | float, "a number"))
    return next((name for kind, name in names if isinstance(value, kind)), "null")
