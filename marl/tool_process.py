"""Tool calls in child processes that a timeout and a memory limit can stop: the pieces.

A Python thread cannot be killed: a tool that loops, sleeps or allocates past its timeout went on in
the background (issue 31: the allow-listed `statistics.quantiles(data, n=60000000)` kept running after
its timeout and took 1.8 GB). So a tool with a timeout runs in another process, which is killed (and
reaped, so its memory is returned at once) when the timeout passes. marl/tool_host.py runs calls in a
pool of long-lived tool hosts (the fast path); this module holds what both paths share and the other
path, `in_child`, which forks a child for one call (for a tool a host cannot import: a lambda, a
closure). A forked child:

- calls the tool, turns its result (or its exception) into the observation text, sends that back over
  a pipe as length-prefixed JSON (never pickle: nothing a child sends can run code in the parent) and
  ends with os._exit (no atexit handlers, no second flush of the parent's buffers);
- may grow its address space by `memory_mb` at most over what it inherited (RLIMIT_AS): an allocation
  past that raises MemoryError in the tool; its CPU time is capped just above the timeout (RLIMIT_CPU),
  it dies with the thread that forked it (PR_SET_PDEATHSIG) and it writes no core file.

Forking costs what the parent maps (about 20 ms with torch loaded, 60 ms with 1 GB of tensors), which
is why the hosts exist. The limits stop a runaway call; they are no sandbox against the scenario's
own code, which runs with the user's rights as before.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import select
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

DEFAULT_MEMORY_MB = 1024  # what a tool call may add to its address space (a lookup needs little)
HEADER = 4  # bytes of the big-endian length in front of every message
NO_MESSAGE_EXIT = 70  # a child that could not even send its message
_PR_SET_PDEATHSIG = 1

# a call's outcome: ("ok", text), ("error", text), ("memory", ""), ("timeout", "") or ("died", how)
Outcome = tuple[str, str]


def to_text(value: Any) -> str:
    """A tool result as observation text: JSON for dicts/lists/tuples, str otherwise."""
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def clip_text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, ending with a note of how many were cut."""
    if len(text) <= limit:
        return text
    note = f"... [clipped {len(text) - limit} chars]"
    return text[:max(0, limit - len(note))] + note[:limit]


def call_here(function: Callable[..., Any], args: dict[str, Any], max_chars: int) -> Outcome:
    """function(**args) in this thread: ("ok", its clipped text), ("error", "error: Type: message")
    or ("memory", "") for a MemoryError."""
    try:
        return "ok", clip_text(to_text(function(**args)), max_chars)
    except MemoryError:
        pass  # leave the except clause first: its traceback holds the frames that hold the memory
    except BaseException as exc:  # noqa: BLE001 - a tool failure is an observation, never a crash
        try:
            return "error", clip_text(f"error: {type(exc).__name__}: {exc}", max_chars)
        except BaseException:  # noqa: BLE001 - an exception whose text cannot be made
            return "error", clip_text(f"error: {type(exc).__name__}", max_chars)
    return "memory", ""


def max_message_bytes(max_chars: int) -> int:
    """The longest message a result of `max_chars` characters makes (ASCII JSON: 12 bytes per astral char)."""
    return 12 * max_chars + 1024


def encode(message: Any) -> bytes:
    """A message as written on a pipe: its length, then ASCII JSON (a lone surrogate travels as \\udXXX)."""
    payload = json.dumps(message).encode()
    return len(payload).to_bytes(HEADER, "big") + payload


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to a blocking descriptor."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def decode_outcome(payload: bytes, kinds: tuple[str, ...] = ("ok", "error", "memory")) -> Outcome:
    """A message's (kind, text), `kind` one of `kinds`; ("died", why) for a message that is not one."""
    try:
        kind, text = json.loads(payload.decode("ascii"))
    except (ValueError, TypeError):  # not ASCII JSON, not a pair, or cut: longer than allowed
        return "died", "its result was too long or not readable"
    if kind not in kinds or not isinstance(text, str):
        return "died", "its result was not readable"
    return kind, text


# -- limits ---------------------------------------------------------------------------------------------------
def lower_limit(kind: int, soft: int, hard: int | None = None) -> None:
    """Set a limit of this process (hard None: keep the hard one), never above the hard limit in force."""
    infinity = resource.RLIM_INFINITY
    _, current = resource.getrlimit(kind)
    hard = current if hard is None else hard
    if current != infinity:
        hard = current if hard == infinity else min(hard, current)
    if hard != infinity:
        soft = hard if soft == infinity else min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def address_space() -> int | None:
    """Bytes of address space this process maps now (/proc/self/statm); None without /proc."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def memory_cap(memory_mb: int | None) -> int | None:
    """The RLIMIT_AS that lets this process grow by `memory_mb` (it counts what is mapped already:
    for a fork, all the parent had); None for no cap."""
    mapped = address_space()
    return None if memory_mb is None or mapped is None else mapped + memory_mb * 2**20


def cpu_seconds() -> float:
    """CPU time this process has used so far (user and system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- waiting for a child ----------------------------------------------------------------------------------------
def pidfd_of(pid: int) -> int | None:
    """A descriptor that becomes readable when the process exits (Linux 5.3+), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def receive(pid: int, pidfd: int | None, read_fd: int, deadline: float,
            max_bytes: int) -> tuple[str, bytes, int | None]:
    """The next message on `read_fd` from process `pid`: ("message", payload, None), ("exited", b"",
    wait status or None) when it ended without one, or ("timeout", b"", None) at `deadline`."""
    poller = select.poll()  # not select.select: a big process may hold descriptors above 1024
    poller.register(read_fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    os.set_blocking(read_fd, False)
    data = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout", b"", None
        tick = remaining if pidfd is not None else min(remaining, 0.02)  # without a pidfd: ask waitpid often
        ready = {fd for fd, _ in poller.poll(math.ceil(tick * 1000))}
        ended = _drain(read_fd, data) if read_fd in ready else False
        payload = _complete(data, max_bytes)
        if payload is not None:
            return "message", payload, None
        status = None if pidfd is not None else _exited(pid)
        if ended or pidfd in ready or status is not None:
            _drain(read_fd, data)  # a process that wrote and exited: what it wrote is still in the pipe
            payload = _complete(data, max_bytes)
            return ("message", payload, None) if payload is not None else ("exited", b"", status)


def _drain(fd: int, data: bytearray) -> bool:
    """Read what the pipe holds into `data`; True at end of file."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return False
        if not chunk:
            return True
        data += chunk


def _complete(data: bytearray, max_bytes: int) -> bytes | None:
    """The payload once all of it has come; b"" for one longer than `max_bytes` (never decoded)."""
    if len(data) < HEADER:
        return None
    size = int.from_bytes(data[:HEADER], "big")
    if size > max_bytes:
        return b""
    return bytes(data[HEADER:HEADER + size]) if len(data) >= HEADER + size else None


def _exited(pid: int) -> int | None:
    """The wait status of a child that has exited (it is then reaped; -1: reaped elsewhere), else None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return -1
    return status if done else None


def stop(pid: int, pidfd: int | None, status: int | None = None) -> int | None:
    """Kill a child (whatever it is doing) and reap it; its wait status (None when unknown)."""
    try:
        if status is not None:
            return status  # reaped already
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # never another process that reused the pid
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, AttributeError, OSError):
            pass
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:  # reaped by someone else (a SIGCHLD handler)
            return None
    finally:
        if pidfd is not None:
            os.close(pidfd)


def describe_status(status: int | None) -> str:
    """How a process that sent no result ended, in words."""
    if status is None or status == -1:
        return "it ended without a result"
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum == signal.SIGXCPU:
            return "it used more CPU time than its timeout allows"
        return f"it was killed by {signal.Signals(signum).name}"
    code = os.WEXITSTATUS(status)
    return "its result could not be sent" if code == NO_MESSAGE_EXIT else f"it exited with status {code}"


# -- one call in a forked child -------------------------------------------------------------------------------
def in_child(function: Callable[..., Any], args: dict[str, Any], timeout_s: float, memory_mb: int | None,
             max_chars: int) -> Outcome:
    """function(**args) in a child forked for this call; its outcome, or ("timeout", "") / ("died", how)."""
    prctl, parent = _prctl(), os.getpid()
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()  # Python 3.12 warns when other threads run: the child only runs the tool, then exits
    except OSError as error:
        os.close(read_fd)
        os.close(write_fd)
        return "died", f"it could not be started: {error.strerror or error}"
    if pid == 0:
        _child(write_fd, read_fd, lambda: call_here(function, args, max_chars), timeout_s, memory_mb, prctl, parent)
    os.close(write_fd)
    pidfd, how, status = pidfd_of(pid), "timeout", None
    try:
        how, message, status = receive(pid, pidfd, read_fd, time.monotonic() + timeout_s, max_message_bytes(max_chars))
    finally:
        os.close(read_fd)
        status = stop(pid, pidfd, status)
    if how == "message":
        return decode_outcome(message)
    return ("timeout", "") if how == "timeout" else ("died", describe_status(status))


def _child(write_fd: int, read_fd: int, call: Callable[[], Outcome], timeout_s: float, memory_mb: int | None,
           prctl, parent: int) -> None:
    """A forked child's whole life: its limits, the call, the message; it never returns."""
    code = 0
    try:
        os.close(read_fd)
        _limit(timeout_s, memory_mb, prctl, parent)
        write_all(write_fd, encode(list(call())))
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child into the parent's code
        code = NO_MESSAGE_EXIT
    finally:
        os._exit(code)


def _limit(timeout_s: float, memory_mb: int | None, prctl, parent: int) -> None:
    """A forked child's limits: memory, CPU time, no core file, default signals, death with the parent."""
    for signum in (signal.SIGINT, signal.SIGTERM):  # the parent's handlers (a checkpoint on Ctrl-C) are not ours
        signal.signal(signum, signal.SIG_DFL)
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before PR_SET_PDEATHSIG took hold
        os._exit(NO_MESSAGE_EXIT)
    lower_limit(resource.RLIMIT_CORE, 0, 0)
    cpu_s = math.ceil(timeout_s) + 1  # a backstop: the parent's wall-clock timeout normally comes first
    lower_limit(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)
    cap = memory_cap(memory_mb)
    if cap is not None:
        lower_limit(resource.RLIMIT_AS, cap, cap)


_PRCTL: list = []  # [libc's prctl, or None]: looked up once, in the parent


def _prctl():
    """libc's prctl, resolved in the parent: a child must not dlopen (another thread may have held the
    loader's lock at fork)."""
    if not _PRCTL:
        try:
            _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)
        except (OSError, AttributeError):  # not Linux
            _PRCTL.append(None)
    return _PRCTL[0]


def in_thread(function: Callable[..., Any], args: dict[str, Any], timeout_s: float, max_chars: int) -> Outcome:
    """call_here in a daemon thread, waited for `timeout_s` (where there is no fork: a timed-out tool
    then keeps running)."""
    future: Future = Future()

    def work() -> None:
        if future.set_running_or_notify_cancel():
            future.set_result(call_here(function, args, max_chars))

    threading.Thread(target=work, name="tool-call", daemon=True).start()
    try:
        return future.result(timeout=timeout_s)
    except FutureTimeout:
        return "timeout", ""
