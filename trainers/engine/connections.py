"""The connection side of `marl serve` (trainers/engine/server.py): its limits, and an HTTP server whose
threads a client cannot use up.

`ServeLimits` holds every bound, each with the help text of its `marl serve` flag (trainers/cli/serve.py).
`BoundedHTTPServer` is the standard library's `HTTPServer` with three changes to how connections meet threads:

- **Silent connections cost no thread.** An accepted connection is parked in the accept loop's selector
  until its first byte arrives; one that stays silent for `idle_timeout` seconds gets 408 and is closed.
  (`ThreadingHTTPServer` gave each connection a thread at once: 300 stalled clients left 237 threads.)
- **A fixed pool of `workers` threads** serves connections that have spoken, at most `queue` more wait
  for one, and beyond that a connection gets 503 with Retry-After at once; so do connections beyond
  `max_connections` open at a time (parked, queued and served together; each holds a file descriptor).
  A refused connection lingers in the selector for up to LINGER_S, its client's bytes read and dropped,
  because closing on unread bytes resets the connection and a reset can destroy the answer unread.
- **One deadline for the whole request:** a worker reads the request line, headers and body through a
  `DeadlineReader`, which gives each read only the time left of `read_timeout` seconds, so a client
  trickling a byte at a time (slowloris) or sending less than its Content-Length loses its worker when
  the time is up, not never. The reader also bounds the bytes read before the headers end.

HTTP itself (request lines, headers, error replies) stays `http.server.BaseHTTPRequestHandler`'s; the
few bytes written here are the 503/408 answers to connections no worker ever took.
"""

from __future__ import annotations

import http.client
import io
import itertools
import json
import queue
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field, fields
from http import HTTPStatus
from http.server import HTTPServer

MAX_HEADER_BYTES = 64 * 1024  # request line plus headers, more is 431 (http.server alone allows 100 x 64 KiB);
# http.client's LineTooLong names its own line bound, 65536: the same number
RETRY_AFTER_S = 1  # the Retry-After of a 503: a busy server frees a worker per answer, often within a second
LINGER_S = 2.0  # after refusing a body it did not read, the server drains it this long so the answer arrives
LINGER_MAX = 256  # refused connections lingering at once (the accept loop's own); beyond, closed at once


_RANGES = {"max_body_bytes": (1, 2 ** 40), "max_prompt_tokens": (1, 2 ** 31), "max_new_tokens": (1, 4096),
           "read_timeout": (0, 3600), "idle_timeout": (0, 3600), "workers": (1, 1024), "queue": (0, 2 ** 16),
           "max_connections": (1, 2 ** 16)}  # each limit's range (a timeout: more than its low end)


def _help(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class ServeLimits:
    """Every bound `marl serve` puts on a client (a flag each, named like the field). ValueError, naming
    the flag and its range, for a value out of range."""

    max_body_bytes: int = field(default=2 ** 20, metadata=_help(
        "largest request body in bytes (default 1 MiB); a larger Content-Length is answered 413 and the body "
        "is not read"))
    max_prompt_tokens: int | None = field(default=None, metadata=_help(
        "longest prompt in tokens (default: the model's context length); a longer one is answered 400"))
    max_new_tokens: int = field(default=4096, metadata=_help(
        "largest max_tokens a request may ask for (1-4096, default 4096); a request asking more is answered 400, "
        "never cut silently"))
    read_timeout: float = field(default=30.0, metadata=_help(
        "seconds a client has to send its whole request once it starts (and to take each answer); a slow or "
        "short body gets 408 when they are up (default 30)"))
    idle_timeout: float = field(default=30.0, metadata=_help(
        "seconds a connection may stay silent before its request starts; it is then answered 408 and closed "
        "(default 30; a silent connection holds no thread)"))
    workers: int = field(default=64, metadata=_help(
        "threads serving requests (default 64, what the HTTP rollout engine sends at once; concurrent "
        "requests are batched on the model)"))
    queue: int = field(default=256, metadata=_help(
        "requests that may wait for a worker (default 256); beyond them a request gets 503 with Retry-After"))
    max_connections: int = field(default=512, metadata=_help(
        "open connections at a time, silent ones included (default 512; keep it under the file limit, "
        "ulimit -n); beyond it a connection gets 503 with Retry-After"))

    def __post_init__(self):
        for name, (low, high) in _RANGES.items():
            value = getattr(self, name)
            if value is None and name == "max_prompt_tokens":  # the model's context, once it is loaded
                continue
            if name.endswith("timeout"):  # seconds: more than 0 (NaN and infinity fail the comparison)
                if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
                    raise ValueError(f"--{name.replace('_', '-')} {value}: seconds, more than 0 and at most {high}")
            elif isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"--{name.replace('_', '-')} {value}: an integer in [{low}, {high}]")

    @classmethod
    def flags(cls) -> list[tuple[str, str, type, object, str]]:
        """(field, --flag, type, default, help) per limit, for the `marl serve` parser."""
        kinds = {"float": float, "int": int, "int | None": int}
        return [(f.name, "--" + f.name.replace("_", "-"), kinds[str(f.type)], f.default, f.metadata["help"])
                for f in fields(cls)]


def error_body(status: int, message: str, kind: str) -> bytes:
    """An OpenAI-style error body: {"error": {"message", "type", "code"}}."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def _due(deadlines: dict, now: float) -> list:
    """The keys of `deadlines` whose time is up (it is in insertion order, all with one timeout)."""
    return list(itertools.takewhile(lambda key: deadlines[key] <= now, deadlines))


class DeadlineReader(io.RawIOBase):
    """A socket's bytes for a `BufferedReader`: each read waits only for what is left of `seconds` (then
    TimeoutError, and `expired` is set), and at most `limit` bytes are read in all (then LineTooLong)."""

    def __init__(self, sock: socket.socket, seconds: float, limit: int):
        super().__init__()
        self.sock, self.deadline, self.limit = sock, time.monotonic() + seconds, limit
        self.count, self.expired = 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left, room = self.deadline - time.monotonic(), self.limit - self.count
        if room <= 0:  # http.server answers this 431 while reading headers (a body read never asks past it)
            raise http.client.LineTooLong("the request line and headers")  # "got more than 65536 bytes when reading"
        try:
            if left <= 0:
                raise TimeoutError("the request was not read in time")
            self.sock.settimeout(left)
            count = self.sock.recv_into(memoryview(buffer)[:room])
        except TimeoutError:
            self.expired = True
            raise
        self.count += count
        return count


def linger(sock: socket.socket, seconds: float = LINGER_S) -> None:
    """Half-close `sock` and drop what the client still sends until it closes or `seconds` pass: closing
    with unread bytes resets the connection, and a reset can destroy the answer before the client reads it."""
    deadline = time.monotonic() + seconds
    try:
        sock.shutdown(socket.SHUT_WR)
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                return
    except OSError:
        pass


class BoundedHTTPServer(HTTPServer):
    """`HTTPServer` with silent connections parked (no thread), a pool of `limits.workers` threads, a bounded
    queue and connection count (503 beyond them), and idle connections answered 408 (module docstring)."""

    request_queue_size = 256  # the listen backlog: a rollout engine opens one connection per row at once

    def __init__(self, address, handler, limits: ServeLimits):
        # The state comes before the bind: a failed bind (a busy port) calls server_close() at once.
        self.limits = limits
        self._selector = selectors.DefaultSelector()
        self._parked: dict[socket.socket, float] = {}  # silent connection -> when it expires (in that order)
        self._closing: dict[socket.socket, float] = {}  # refused connection -> when it is closed (in that order)
        self._open, self._open_lock = 0, threading.Lock()
        self._slots = threading.BoundedSemaphore(limits.workers + limits.queue)  # served + waiting
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._stop, self._stopped, self._closed = threading.Event(), threading.Event(), False
        self._workers: list[threading.Thread] = []
        super().__init__(address, handler)
        self._workers = [threading.Thread(target=self._work, name=f"marl-serve-worker-{i}", daemon=True)
                         for i in range(limits.workers)]
        for worker in self._workers:
            worker.start()

    # -- the accept loop (serve_forever's thread) ---------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept, park and dispatch connections until shutdown() (from another thread)."""
        self._stopped.clear()
        self._selector.register(self.socket, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(self._wait(poll_interval)):
                    if key.fileobj is self.socket:
                        self._handle_request_noblock()  # accept; process_request parks it
                    elif key.fileobj in self._closing:
                        self._drain(key.fileobj)
                    else:
                        self._unregister(key.fileobj, self._parked)
                        self._dispatch(key.fileobj, key.data)
                self._expire()
        finally:
            self._selector.unregister(self.socket)
            self._stop.clear()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serve_forever and wait until it has stopped (as socketserver's shutdown)."""
        self._stop.set()
        self._stopped.wait()

    def process_request(self, request, client_address) -> None:
        """Park a new connection until it speaks (503 when `max_connections` are open)."""
        with self._open_lock:
            full = self._open >= self.limits.max_connections
            if not full:
                self._open += 1
        if full:
            return self._refuse(request, 503, f"the server holds {self.limits.max_connections} connections "
                                              "(marl serve --max-connections); retry later", counted=False)
        self._selector.register(request, selectors.EVENT_READ, client_address)
        self._parked[request] = time.monotonic() + self.limits.idle_timeout

    def _wait(self, longest: float) -> float:
        """Seconds until the next parked or closing connection expires, at most `longest`."""
        firsts = [next(iter(deadlines.values())) - time.monotonic() for deadlines in (self._parked, self._closing)
                  if deadlines]  # each dict is in insertion order, all with one timeout: its first is due first
        return max(0.0, min([longest, *firsts]))

    def _unregister(self, sock, deadlines: dict) -> None:
        self._selector.unregister(sock)
        del deadlines[sock]

    def _dispatch(self, sock, client_address) -> None:
        """Hand a connection that spoke to the pool, or answer 503 when the workers and the queue are full."""
        if not self._slots.acquire(blocking=False):
            return self._refuse(sock, 503, f"all {self.limits.workers} workers are busy and {self.limits.queue} "
                                           "requests wait (marl serve --workers, --queue); retry later")
        self._jobs.put((sock, client_address))

    def _expire(self) -> None:
        """408 for every parked connection silent past its idle timeout; close refused ones done lingering."""
        now = time.monotonic()
        for sock in _due(self._parked, now):
            self._unregister(sock, self._parked)
            self._refuse(sock, 408, f"no request within {self.limits.idle_timeout:g} s (marl serve --idle-timeout)")
        for sock in _due(self._closing, now):
            self._unregister(sock, self._closing)
            sock.close()

    def _refuse(self, sock, status: int, message: str, *, counted: bool = True) -> None:
        """Answer a connection no worker took (503, 408) without waiting on it, then let it linger: what the
        client still sends is dropped (`_drain`) until it closes, as a reset could destroy the answer."""
        if counted:
            self._count_closed()
        body = error_body(status, message, "timeout_error" if status == 408 else "server_overloaded")
        head = (f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n"
                + (f"Retry-After: {RETRY_AFTER_S}\r\n" if status == 503 else "") + "\r\n")
        try:
            sock.setblocking(False)  # never wait on this client: the accept loop serves everyone
            sock.send(head.encode() + body)  # a fresh socket's send buffer takes these few bytes at once
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._closing) >= LINGER_MAX:  # a flood of refusals: the newest are closed at once
            sock.close()
            return
        self._closing[sock] = time.monotonic() + LINGER_S
        self._selector.register(sock, selectors.EVENT_READ)

    def _drain(self, sock) -> None:
        """Drop what a refused client sent; close the connection once the client has closed its side."""
        try:
            if sock.recv(65536):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._unregister(sock, self._closing)
        sock.close()

    # -- the workers ------------------------------------------------------------------------------

    def _work(self) -> None:
        """A worker: serve dispatched connections one at a time until server_close() sends None."""
        while (job := self._jobs.get()) is not None:
            sock, client_address = job
            try:
                self.finish_request(sock, client_address)
            except Exception:  # noqa: BLE001 - as ThreadingMixIn: report it, keep the worker
                self.handle_error(sock, client_address)
            finally:
                self.shutdown_request(sock)
                self._slots.release()

    def shutdown_request(self, request) -> None:
        """Close a served connection and count it closed."""
        self._close(request, True)

    def _close(self, sock, counted: bool) -> None:
        super().shutdown_request(sock)  # half-close, then close
        if counted:
            self._count_closed()

    def _count_closed(self) -> None:
        with self._open_lock:
            self._open -= 1

    def server_close(self) -> None:
        """Close the listening socket and every parked connection, and let the workers end (once)."""
        if self._closed:
            return
        self._closed = True
        super().server_close()
        for sock in list(self._parked):
            self._unregister(sock, self._parked)
            self._close(sock, True)
        for sock in list(self._closing):
            self._unregister(sock, self._closing)
            sock.close()
        while True:  # connections still queued are closed unanswered
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self._close(job[0], True)
        for _ in self._workers:
            self._jobs.put(None)
        self._selector.close()
