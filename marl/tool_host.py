"""Where a tool call runs: a pool of tool hosts, processes a timeout and a memory limit can stop.

`run_tool` is the one entry (marl/tools.py calls it). A tool with a timeout runs in a tool host: a
Python process started with posix_spawn (cheap even from a parent holding gigabytes of model), which
imports the tool by its reference (`weather_lib:get_weather` in the scenario's folder, or
`statistics:quantiles`) once and then answers calls over two pipes, in length-prefixed JSON. For each
call the host lowers its own soft limits: RLIMIT_AS to what it maps now plus `memory_mb`, RLIMIT_CPU
to what it has used plus the timeout; the parent waits for the answer until the timeout. A call that
times out, goes over its memory or kills its host gets its host killed and reaped (its memory is back
at once) and comes back as an error; the next call starts a fresh host. A round trip costs a fraction
of a millisecond (a fork per call would cost what the parent maps: tens of milliseconds).

Hosts are shared by every registry of the process: one per call running at the same time, kept idle
in between. They ignore Ctrl-C (the parent decides what stops), write no core file, and leave when
the parent does: a watcher thread sees the request pipe close (a parent killed with -9 included).

A tool a host cannot import by reference (a lambda, a closure, a bound method), or arguments that are
not JSON, run in a child forked for the call instead (marl/tool_process.py), under the same limits;
`timeout_s=None` runs the tool in the calling thread (trusted code only), as before.
"""

from __future__ import annotations

import json
import math
import os
import resource
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from common.imports import resolve_callable
from marl.tool_process import (HEADER, Outcome, call_here, cpu_seconds, decode_outcome, describe_status, encode,
                               in_child, in_thread, lower_limit, max_message_bytes, memory_cap, pidfd_of, receive,
                               stop, write_all)

MAX_IDLE = 8  # hosts kept waiting for calls (about 20 MB each); more run while more calls run at once
START_S = 60.0  # a host that is not ready by then (a machine out of processes) is given up for a forked child
LOAD_S = 60.0  # importing a tool's module in a host: the parent has imported it once already
_BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
         "from marl.tool_host import serve; serve(int(sys.argv[2]), int(sys.argv[3]))")
Reference = tuple[str, "str | None"]  # ('module:qualname', the scenario folder it resolves in, or None)


def run_tool(function: Callable[..., Any], args: dict[str, Any], *, timeout_s: float | None,
             memory_mb: int | None, max_chars: int) -> Outcome:
    """The outcome of function(**args), its text clipped to `max_chars`: in a tool host when the tool
    has a timeout and a reference, else in a forked child; in this thread without a timeout."""
    if timeout_s is None:
        return call_here(function, args, max_chars)
    if not hasattr(os, "fork"):
        return in_thread(function, args, timeout_s, max_chars)
    reference = tool_reference(function)
    if reference is not None and hasattr(os, "posix_spawn") and sys.executable:
        outcome = _POOL.call(reference, args, timeout_s, memory_mb, max_chars)
        if outcome is not None:
            return outcome
    return in_child(function, args, timeout_s, memory_mb, max_chars)


def tool_reference(function: Callable[..., Any]) -> Reference | None:
    """How a host imports `function` (the same object is found again by its module and qualified
    name), or None when it cannot."""
    module_name, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", None)
    if not isinstance(module_name, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    module = sys.modules.get(module_name)
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if module is None or found is not function or module_name == "__main__":
        return None
    source = getattr(module, "__marl_source__", None)  # a scenario's file: (its module name, its folder)
    if source is not None:
        return f"{source[0]}:{qualname}", source[1]
    return (f"{module_name}:{qualname}", None) if not module_name.startswith("_marl_tool_") else None


def host_pids() -> list[int]:
    """The process ids of this process's idle tool hosts (for tests and diagnostics)."""
    return _POOL.pids()


class _Host:
    """One tool host, seen from the parent: its process, its two pipes, the tools it has imported."""

    def __init__(self):
        request_read, self.requests = os.pipe()
        self.replies, reply_write = os.pipe()
        try:
            for fd in (request_read, reply_write):
                os.set_inheritable(fd, True)
            argv = [sys.executable, "-c", _BOOT, json.dumps(sys.path), str(request_read), str(reply_write)]
            self.pid = os.posix_spawn(sys.executable, argv, dict(os.environ),
                                      file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)])
        except BaseException:
            os.close(self.requests)
            os.close(self.replies)
            raise
        finally:
            os.close(request_read)
            os.close(reply_write)
        self.pidfd, self.loaded, self.usable = pidfd_of(self.pid), set(), True
        how, payload, _ = receive(self.pid, self.pidfd, self.replies, time.monotonic() + START_S, 1024)
        if how != "message" or _answer_outcome(payload)[0] != "ready":
            self.close()

    def call(self, reference: Reference, args: dict[str, Any], timeout_s: float, memory_mb: int | None,
             max_chars: int) -> Outcome | None:
        """The outcome of one call; None when this host cannot make it (the tool does not import here,
        the arguments are not JSON): the caller forks a child instead."""
        if reference not in self.loaded:
            answer = self._ask({"op": "load", "ref": reference[0], "base": reference[1]}, LOAD_S, 4096)
            if answer is None or answer[0] != "ok":
                return None
            self.loaded.add(reference)
        request = {"op": "call", "ref": reference[0], "base": reference[1], "args": args, "timeout_s": timeout_s,
                   "memory_mb": memory_mb, "max_chars": max_chars}
        try:
            message = encode(request)
        except (TypeError, ValueError):  # a hand-made call with values JSON cannot carry
            return None
        outcome = self._exchange(message, timeout_s, max_message_bytes(max_chars))
        if outcome[0] not in ("ok", "error"):
            self.close()  # out of time or memory, or dead: its memory goes back now
        return outcome

    def _ask(self, request: dict, wait_s: float, max_bytes: int) -> Outcome | None:
        """The host's answer to a request that is not a call; None (and the host closed) if it gives none."""
        outcome = self._exchange(encode(request), wait_s, max_bytes)
        if outcome[0] in ("timeout", "died"):
            self.close()
            return None
        return outcome

    def _exchange(self, message: bytes, wait_s: float, max_bytes: int) -> Outcome:
        """Send one message, wait up to `wait_s` for the answer."""
        try:
            write_all(self.requests, message)
        except OSError:  # the host is gone (SIGPIPE is ignored by Python: EPIPE)
            return "died", describe_status(self._reap())
        how, payload, status = receive(self.pid, self.pidfd, self.replies, time.monotonic() + wait_s, max_bytes)
        if how == "message":
            return _answer_outcome(payload)
        if how == "timeout":
            return "timeout", ""
        return "died", describe_status(self._reap(status))

    def _reap(self, status: int | None = None) -> int | None:
        """Kill and reap the host; its wait status."""
        if not self.usable:
            return status
        self.usable = False
        for fd in (self.requests, self.replies):
            os.close(fd)
        return stop(self.pid, self.pidfd, status)

    def close(self) -> None:
        """Stop the host (killed if it is still at work) and reap it."""
        self._reap()

    def alive(self) -> bool:
        """Whether the host is still there to take calls (an idle host may have been killed from outside)."""
        if not self.usable:
            return False
        try:
            exited = os.waitpid(self.pid, os.WNOHANG)[0]
        except ChildProcessError:
            exited = -1
        if exited == 0:
            return True
        self._reap(-1)  # reaped already: only the descriptors are left to close
        return False


def _answer_outcome(payload: bytes) -> Outcome:
    """A host's answer: a call's outcome, "ready", or the answer to a load ("ok" / "unavailable")."""
    return decode_outcome(payload, ("ok", "error", "memory", "ready", "unavailable"))


class _Pool:
    """The idle hosts of this process: a call takes one (or starts one) and gives it back after."""

    def __init__(self):
        self._idle: list[_Host] = []
        self._lock = threading.Lock()
        self._unavailable: set[Reference] = set()  # tools no host could import: forked children run them
        self._cannot_start = False  # a host that did not start (marl not importable there): fork from now on

    def call(self, reference: Reference, args: dict[str, Any], timeout_s: float, memory_mb: int | None,
             max_chars: int) -> Outcome | None:
        """A call in a host; None when no host can make it."""
        if reference in self._unavailable or self._cannot_start:
            return None
        host = self._take()
        if host is None:
            return None
        try:
            outcome = host.call(reference, args, timeout_s, memory_mb, max_chars)
        except BaseException:  # Ctrl-C while waiting: the host may still be at work
            host.close()
            raise
        if reference not in host.loaded:
            self._unavailable.add(reference)
        with self._lock:
            keep = host.usable and len(self._idle) < MAX_IDLE
            if keep:
                self._idle.append(host)
        if not keep:
            host.close()
        return outcome

    def _take(self) -> _Host | None:
        with self._lock:
            while self._idle:
                host = self._idle.pop()
                if host.alive():
                    return host
        try:
            host = _Host()
        except OSError:  # no more processes or descriptors: a forked child may still work
            return None
        self._cannot_start = not host.usable
        return host if host.usable else None

    def pids(self) -> list[int]:
        with self._lock:
            return [host.pid for host in self._idle if host.usable]


_POOL = _Pool()


# -- the host's side -----------------------------------------------------------------------------------------
def serve(request_fd: int, reply_fd: int) -> None:
    """A tool host's life (in the host process): import and call tools as the parent asks, until the
    parent closes the request pipe or dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it kills us if need be
    lower_limit(resource.RLIMIT_CORE, 0, 0)
    _watch_parent(request_fd)
    functions: dict[Reference, Callable[..., Any]] = {}
    write_all(reply_fd, encode(["ready", ""]))
    while (request := _read_message(request_fd)) is not None:
        write_all(reply_fd, encode(_handle(request, functions)))
    os._exit(0)


def _handle(request: dict, functions: dict) -> list:
    """The answer to one request: a load ("ok" / "unavailable") or a call's outcome."""
    key = (request["ref"], request["base"])
    if request["op"] == "load":
        try:
            functions[key] = resolve_callable(*key)
        except BaseException as exc:  # noqa: BLE001 - the parent then forks a child for this tool
            return ["unavailable", f"{type(exc).__name__}: {exc}"[:500]]
        return ["ok", ""]
    with _limits(request["timeout_s"], request["memory_mb"]):
        return list(call_here(functions[key], request["args"], request["max_chars"]))


@contextmanager
def _limits(timeout_s: float, memory_mb: int | None):
    """This call's soft limits: memory over what is mapped now, CPU time over what is used (a backstop
    for a parent that is gone); the previous ones afterwards."""
    saved = {kind: resource.getrlimit(kind) for kind in (resource.RLIMIT_AS, resource.RLIMIT_CPU)}
    cap = memory_cap(memory_mb)
    if cap is not None:
        lower_limit(resource.RLIMIT_AS, cap)
    lower_limit(resource.RLIMIT_CPU, math.ceil(cpu_seconds() + timeout_s) + 1)
    try:
        yield
    finally:
        for kind, limits in saved.items():
            resource.setrlimit(kind, limits)


def _watch_parent(request_fd: int) -> None:
    """Leave as soon as the parent's end of the request pipe closes, even in the middle of a call."""
    def watch() -> None:
        poller = select.poll()
        poller.register(request_fd, 0)  # no events asked: poll still says when the writer is gone
        poller.poll()
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _read_message(fd: int) -> Any:
    """The next request (blocking), or None when the parent has closed the pipe."""
    header = _read_exactly(fd, HEADER)
    if header is None:
        return None
    payload = _read_exactly(fd, int.from_bytes(header, "big"))
    return None if payload is None else json.loads(payload)


def _read_exactly(fd: int, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)
