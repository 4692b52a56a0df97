"""The connection side of `marl serve` (trainers/engine/server.py): its limits, and an HTTP server whose
threads and file descriptors a client cannot use up.

`ServeLimits` (trainers/engine/limits.py) holds every bound, a `marl serve` flag each.
`BoundedHTTPServer` is the standard library's `HTTPServer` with these changes:

- **A request head costs no thread.** The accept loop reads each connection's request line and headers
  itself, without blocking (at most MAX_HEADER_BYTES). Silent for `idle_timeout` seconds, or its head
  unfinished `read_timeout` seconds after its first byte, a connection gets 408 and is closed. (Heads were
  read by workers, each deadline starting when a worker took the connection: 320 clients sending a byte
  each and then nothing held every worker and queue slot for 150 s.)
- **A fixed pool of `workers` threads** serves connections whose head is in, `queue` more may wait, and
  beyond that a connection gets 503 with Retry-After. At most `max_connections` are open (a descriptor
  each); at that bound a new one takes the place of the oldest still in the accept loop (silent ones
  first), which gets 408, so silent connections cannot lock everyone out; it gets 503 when there is none,
  or when its client address holds `max_connections_per_client`. A refused connection lingers for up to
  LINGER_S, its client's bytes dropped: closing on unread bytes resets it, and a reset can lose the answer.
- **One deadline per request**, `read_timeout` from its first byte: a worker reads the body through a
  `DeadlineReader`, which gives each read only the time left, so a trickled or short body loses its worker
  in time. A request picked up with less than QUEUED_GRACE_S left gets that long (its client may only have
  been held back by flow control while it waited): a queue of stalled bodies holds the pool for at most
  `read_timeout` plus `queue / workers` graces.
- **File descriptors are budgeted before the server opens one** (`fd_budget`): the connections, refused
  ones lingering and the server's own files must fit the soft RLIMIT_NOFILE, raised towards the hard one
  if need be, else the server refuses to start in one line naming --max-connections and `ulimit -n`. If
  accept() still meets EMFILE, the listening socket, which stays readable, is unwatched for ACCEPT_PAUSE_S
  (the loop spun on it).

HTTP itself (request lines, headers, error replies) stays `http.server.BaseHTTPRequestHandler`'s, reading
the head the accept loop buffered; the few bytes written here answer connections no worker took.
"""

from __future__ import annotations

import errno
import http.client
import io
import itertools
import json
import queue
import selectors
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import HTTPServer

from trainers.engine.limits import ServeLimits, fd_budget

MAX_HEADER_BYTES = 64 * 1024  # request line plus headers, more is 431 (http.server alone allows 100 x 64 KiB);
# http.client's LineTooLong names its own line bound, 65536: the same number
RETRY_AFTER_S = 1  # the Retry-After of a 503: a busy server frees a worker per answer, often within a second
LINGER_S = 2.0  # after refusing a body it did not read, the server drains it this long so the answer arrives
QUEUED_GRACE_S = 1.0  # a request picked up with less time left gets this long (at most read_timeout) for the rest
ACCEPT_PAUSE_S = 0.5  # out of descriptors (EMFILE): the listening socket is not watched for this long


def error_body(status: int, message: str, kind: str) -> bytes:
    """An OpenAI-style error body: {"error": {"message", "type", "code"}}."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def _due(deadlines: dict, now: float) -> list:
    """The keys of `deadlines` whose time is up (it is in insertion order, all with one timeout)."""
    return list(itertools.takewhile(lambda key: deadlines[key] <= now, deadlines))


@dataclass(eq=False)
class Arrival:
    """A connection in the accept loop: its client, the head it has sent so far, and (from its first byte)
    when the whole request is due."""

    address: tuple
    head: bytearray = field(default_factory=bytearray)
    due: float = 0.0
    has_line: bool = False  # the request line is in `head`

    def complete(self, start: int) -> bool:
        """Whether the bytes from `start` on complete the head as http.server reads one: an empty line ends
        the headers, and a request line of other than three words (HTTP/0.9, garbage) has none."""
        head = self.head
        if not self.has_line:
            end = head.find(b"\n", start)
            if end < 0:
                return False
            self.has_line = True
            if len(head[:end].decode("iso-8859-1").split()) != 3:  # http.server's split: \xa0 is a space
                return True
        return head.find(b"\n\n", max(0, start - 1)) >= 0 or head.find(b"\n\r\n", max(0, start - 2)) >= 0


class DeadlineReader(io.RawIOBase):
    """A socket's bytes for a `BufferedReader`, after `prefix` (what the accept loop read already): each read
    waits only until the monotonic `deadline` (then TimeoutError, and `expired` is set), and at most `limit`
    bytes are read in all (then LineTooLong)."""

    def __init__(self, sock: socket.socket, deadline: float, limit: int, prefix: bytes = b""):
        super().__init__()
        self.sock, self.deadline, self.limit = sock, deadline, limit
        self.prefix = memoryview(bytes(prefix))
        self.count, self.expired = 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        room = self.limit - self.count
        if room <= 0:  # http.server answers this 431 while reading headers (a body read never asks past it)
            raise http.client.LineTooLong("the request line and headers")  # "got more than 65536 bytes when reading"
        if self.prefix:
            count = min(len(buffer), room, len(self.prefix))
            memoryview(buffer)[:count] = self.prefix[:count]
            self.prefix = self.prefix[count:]
        else:
            count = self._receive(memoryview(buffer)[:room])
        self.count += count
        return count

    def _receive(self, buffer) -> int:
        try:
            if (left := self.deadline - time.monotonic()) <= 0:
                raise TimeoutError("the request was not read in time")
            self.sock.settimeout(left)
            return self.sock.recv_into(buffer)
        except TimeoutError:
            self.expired = True
            raise


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


def refusal(status: int, message: str) -> bytes:
    """The whole HTTP/1.0 answer (408 or 503, with Retry-After) to a connection no worker took."""
    body = error_body(status, message, "timeout_error" if status == 408 else "server_overloaded")
    head = (f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n"
            + (f"Retry-After: {RETRY_AFTER_S}\r\n" if status == 503 else "") + "\r\n")
    return head.encode() + body


class BoundedHTTPServer(HTTPServer):
    """`HTTPServer` whose accept loop reads request heads (no thread), with a pool of `limits.workers`
    threads, a bounded queue and connection count, and 408 for the silent and the slow (module docstring)."""

    request_queue_size = 256  # the listen backlog: a rollout engine opens one connection per row at once

    def __init__(self, address, handler, limits: ServeLimits):
        self.limits = limits
        self.linger_max = fd_budget(limits)  # before any descriptor is opened: a refusal leaves none to close
        # The state comes before the bind: a failed bind (a busy port) calls server_close() at once.
        self._selector = selectors.DefaultSelector()
        self._parked: dict[socket.socket, float] = {}  # silent connection -> its idle deadline (in that order)
        self._reading: dict[socket.socket, float] = {}  # connection sending its head -> its read deadline (same)
        self._closing: dict[socket.socket, float] = {}  # refused connection -> when it is closed (same)
        self._clients: dict[socket.socket, str] = {}  # every open connection -> its client's host
        self._per_client: Counter = Counter()  # client host -> its open connections
        self._open_lock = threading.Lock()  # over both: the workers close connections too
        self._slots = threading.BoundedSemaphore(limits.workers + limits.queue)  # served + waiting
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._current = threading.local()  # a worker's DeadlineReader for the connection it serves
        self._stop, self._stopped, self._closed = threading.Event(), threading.Event(), False
        self._listening, self._paused_until, self._warned = False, None, False
        self._workers: list[threading.Thread] = []
        super().__init__(address, handler)
        self.socket.setblocking(False)  # accept() in the loop: never wait for a client that went away
        self._workers = [threading.Thread(target=self._work, name=f"marl-serve-worker-{i}", daemon=True)
                         for i in range(limits.workers)]
        for worker in self._workers:
            worker.start()

    # -- the accept loop (serve_forever's thread) ---------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept connections, read their heads and dispatch them until shutdown() (from another thread)."""
        self._stopped.clear()
        self._listen(True)
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(self._wait(poll_interval)):
                    sock = key.fileobj
                    if sock is self.socket:
                        self._accept()
                    elif sock in self._closing:
                        self._drain(sock)
                    elif sock in self._parked or sock in self._reading:  # not closed earlier in this round
                        self._receive(sock, key.data)
                self._expire()
        finally:
            self._listen(False)
            self._stop.clear()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serve_forever and wait until it has stopped (as socketserver's shutdown)."""
        self._stop.set()
        self._stopped.wait()

    def _listen(self, on: bool) -> None:
        """Watch the listening socket for connections, or stop watching it."""
        if on and not self._listening:
            self._selector.register(self.socket, selectors.EVENT_READ)
        elif self._listening and not on:
            self._selector.unregister(self.socket)
        self._listening = on

    def _accept(self) -> None:
        """Accept one connection. Out of descriptors, the connection stays in the kernel's backlog and the
        listening socket readable: it is left unwatched for ACCEPT_PAUSE_S, or the loop would spin on it."""
        try:
            sock, address = self.socket.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # nothing to accept after all, or a client gone before it was accepted
        except OSError as error:  # EMFILE, ENFILE, ENOBUFS: what fails now fails again at once
            self._listen(False)
            self._paused_until = time.monotonic() + ACCEPT_PAUSE_S
            return self._warn(error)
        self.process_request(sock, address)

    def _warn(self, error: OSError) -> None:
        """Say once that accept() fails (new connections wait in the kernel's backlog meanwhile)."""
        if not self._warned:
            self._warned = True
            hint = "; lower --max-connections or raise ulimit -n" if error.errno in (errno.EMFILE, errno.ENFILE) else ""
            print(f"marl serve: cannot accept a connection ({error.strerror}): trying again every "
                  f"{ACCEPT_PAUSE_S:g} s{hint}", file=sys.stderr, flush=True)

    def process_request(self, request, client_address) -> None:
        """Park a new connection until it speaks (503 when it cannot be admitted, `_admit`)."""
        refused = self._admit(request, client_address[0])
        if refused is not None:
            return self._refuse(request, 503, refused, counted=False)
        request.setblocking(False)  # its head is read here, as it comes
        self._selector.register(request, selectors.EVENT_READ, Arrival(client_address))
        self._parked[request] = time.monotonic() + self.limits.idle_timeout

    def _admit(self, sock, host: str) -> str | None:
        """Count a new connection in, or say why not: its client holds max_connections_per_client, or
        max_connections are open and none of them can make room (`_evict`)."""
        cap, most = self.limits.max_connections_per_client, self.limits.max_connections
        with self._open_lock:
            if cap is not None and self._per_client[host] >= cap:  # checked first: no eviction on its behalf
                return f"{host} holds {cap} connections (marl serve --max-connections-per-client); retry later"
            full = len(self._clients) >= most
        if full and not self._evict():
            return f"the server holds {most} connections (marl serve --max-connections); retry later"
        with self._open_lock:
            self._clients[sock] = host
            self._per_client[host] += 1
        return None

    def _evict(self) -> bool:
        """Answer 408 to the oldest connection still in the accept loop (a silent one first, then one whose
        head is unfinished) and close it, to make room for a new one; False when every connection is at a
        worker or queued. A client that means to ask sends its head at once, so the oldest is the idlest."""
        most = self.limits.max_connections
        for waiting, what in ((self._parked, "sent nothing"), (self._reading, "had not sent its whole request")):
            if waiting:
                sock = next(iter(waiting))
                self._unregister(sock, waiting)
                self._refuse(sock, 408, f"closed to admit a new connection: this one {what} and the server holds "
                                        f"{most} connections (marl serve --max-connections)")
                return True
        return False

    def _receive(self, sock, arrival: Arrival) -> None:
        """Read what a connection in the accept loop sent; hand it to a worker once its head is in (or the
        header bound is reached, or the client stopped sending: http.server then answers what it got)."""
        try:
            chunk = sock.recv(MAX_HEADER_BYTES - len(arrival.head))
        except BlockingIOError:
            return
        except OSError:  # reset: nobody to answer
            chunk = None
        if sock in self._parked:  # its first byte: the whole request is due read_timeout from now
            del self._parked[sock]
            arrival.due = self._reading[sock] = time.monotonic() + self.limits.read_timeout
        if chunk is None or not (chunk or arrival.head):  # gone, or closed without a word (a port probe)
            self._unregister(sock, self._reading)
            return self._close(sock, True)
        start = len(arrival.head)
        arrival.head += chunk
        if not chunk or len(arrival.head) >= MAX_HEADER_BYTES or arrival.complete(start):
            self._unregister(sock, self._reading)
            self._dispatch(sock, arrival)

    def _wait(self, longest: float) -> float:
        """Seconds until the next deadline in the accept loop, at most `longest`."""
        firsts = [next(iter(deadlines.values())) for deadlines in (self._parked, self._reading, self._closing)
                  if deadlines]  # each dict is in insertion order, all with one timeout: its first is due first
        if self._paused_until is not None:
            firsts.append(self._paused_until)
        return max(0.0, min([longest, *(first - time.monotonic() for first in firsts)]))

    def _unregister(self, sock, deadlines: dict) -> None:
        self._selector.unregister(sock)
        del deadlines[sock]

    def _dispatch(self, sock, arrival: Arrival) -> None:
        """Hand a connection whose head is in to the pool, or answer 503 when the workers and queue are full."""
        if not self._slots.acquire(blocking=False):
            return self._refuse(sock, 503, f"all {self.limits.workers} workers are busy and {self.limits.queue} "
                                           "requests wait (marl serve --workers, --queue); retry later")
        self._jobs.put((sock, arrival))

    def _expire(self) -> None:
        """408 for every connection silent past its idle timeout or with its head unfinished past its read
        timeout; close refused ones done lingering; watch the listening socket again after a pause."""
        now = time.monotonic()
        for sock in _due(self._parked, now):
            self._unregister(sock, self._parked)
            self._refuse(sock, 408, f"no request within {self.limits.idle_timeout:g} s (marl serve --idle-timeout)")
        for sock in _due(self._reading, now):
            self._unregister(sock, self._reading)
            self._refuse(sock, 408, f"the request was not received within {self.limits.read_timeout:g} s "
                                    "(marl serve --read-timeout)")
        for sock in _due(self._closing, now):
            self._unregister(sock, self._closing)
            sock.close()
        if self._paused_until is not None and self._paused_until <= now:
            self._paused_until = None
            self._listen(True)

    def _refuse(self, sock, status: int, message: str, *, counted: bool = True) -> None:
        """Answer a connection no worker took (503, 408) without waiting on it, then let it linger: what the
        client still sends is dropped (`_drain`) until it closes, as a reset could destroy the answer."""
        if counted:
            self._count_closed(sock)
        try:
            sock.setblocking(False)  # never wait on this client: the accept loop serves everyone
            sock.send(refusal(status, message))  # a fresh socket's send buffer takes these few bytes at once
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._closing) >= self.linger_max:  # a flood of refusals (or few descriptors): closed at once
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
        grace = min(QUEUED_GRACE_S, self.limits.read_timeout)
        while (job := self._jobs.get()) is not None:
            sock, arrival = job
            # the deadline set at the first byte, not now: time spent queued counts (a grace for the body)
            self._current.reader = DeadlineReader(sock, max(arrival.due, time.monotonic() + grace),
                                                  MAX_HEADER_BYTES, arrival.head)
            try:
                self.finish_request(sock, arrival.address)
            except Exception:  # noqa: BLE001 - as ThreadingMixIn: report it, keep the worker
                self.handle_error(sock, arrival.address)
            finally:
                self._current.reader = None
                self.shutdown_request(sock)
                self._slots.release()

    def reader(self) -> DeadlineReader:
        """The reader of the request this worker thread serves: its head as the accept loop read it, then
        the rest from the socket, within the request's deadline (the handler's rfile reads through it)."""
        return self._current.reader

    def shutdown_request(self, request) -> None:
        """Close a served connection and count it closed."""
        self._close(request, True)

    def _close(self, sock, counted: bool) -> None:
        super().shutdown_request(sock)  # half-close, then close
        if counted:
            self._count_closed(sock)

    def _count_closed(self, sock) -> None:
        with self._open_lock:
            host = self._clients.pop(sock, None)
            if host is not None:
                self._per_client[host] -= 1
                if not self._per_client[host]:
                    del self._per_client[host]

    def server_close(self) -> None:
        """Close the listening socket and every connection in the accept loop, and let the workers end (once)."""
        if self._closed:
            return
        self._closed = True
        super().server_close()
        for waiting in (self._parked, self._reading):
            for sock in list(waiting):
                self._unregister(sock, waiting)
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
                self._slots.release()
        for _ in self._workers:
            self._jobs.put(None)
        self._selector.close()
