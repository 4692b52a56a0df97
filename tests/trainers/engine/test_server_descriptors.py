"""`marl serve` and the file descriptor limit (trainers/engine/limits.py: fd_budget; connections.py: the accept pause):
servers in subprocesses under a lowered RLIMIT_NOFILE. A server whose connections cannot fit refuses to
start in one line; one that runs out of descriptors anyway stops watching its listening socket for a
moment instead of spinning on it. Spinning is measured as the server's CPU time over an interval, never
by a wall clock deciding the test."""

from __future__ import annotations

import os
import resource
import select
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CLIENT_TIMEOUT = 120  # seconds a test waits on a subprocess: generous (it imports torch), never measured
# a server under a file limit: prints its port, then (with "tight") lowers its soft limit to a few descriptors
# more than it holds, as if something else had taken them, and serves
SERVER = textwrap.dedent("""
    import os, resource, sys
    from trainers.engine.limits import ServeLimits
    from trainers.engine.server import make_http_server
    httpd = make_http_server(sys.argv[1], port=0, name="micro", limits=ServeLimits(max_connections=64,
                                                                                   idle_timeout=600))
    if sys.argv[2] == "tight":
        held = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (held + 6, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()
""")

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc (Linux)")


def limited(soft: int, hard: int):
    """A preexec_fn setting the child's RLIMIT_NOFILE."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_server_whose_connections_cannot_fit_the_file_limit_refuses_to_start_in_one_line(micro_dir):
    # red team: past the file limit accept() met EMFILE; now it is said before serving (under ulimit -n 600
    # the default 512 connections fit, with fewer refused ones lingering: the next test)
    result = subprocess.run([sys.executable, "-m", "trainers.cli.main", "serve", str(micro_dir), "--port", "0"],
                            capture_output=True, text=True, timeout=CLIENT_TIMEOUT, cwd=ROOT,
                            preexec_fn=limited(400, 400))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("marl: error: --max-connections 512: ")
    assert "may open 400 (ulimit -n; hard limit 400); lower --max-connections or raise ulimit -n" in lines[0]


def test_the_soft_file_limit_is_raised_to_what_the_connections_need_and_lingering_fits_the_rest():
    script = textwrap.dedent("""
        import resource
        from trainers.engine.limits import LINGER_MAX, ServeLimits, fd_budget
        raised = fd_budget(ServeLimits())
        print(raised == LINGER_MAX, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        resource.setrlimit(resource.RLIMIT_NOFILE, (700, 700))
        print(fd_budget(ServeLimits(max_connections=500)))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=CLIENT_TIMEOUT, cwd=ROOT, preexec_fn=limited(300, 4096))
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.split("\n")[:2]
    linger_ok, soft = first.split()
    assert linger_ok == "True" and 300 + 512 < int(soft) <= 4096  # room for 512 connections and the lingering
    assert 0 < int(second) < 700 - 500  # fewer refused connections linger: what the limit leaves


def cpu_seconds(pid: int) -> float:
    """The user and system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_of(port: int) -> int | None:
    """The status of GET /v1/models, None when the server did not answer (yet)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.0\r\n\r\n")
            reply = sock.recv(64)
    except OSError:
        return None
    return int(reply.split()[1]) if reply.startswith(b"HTTP/") else None


def retried_status(port: int, tries: int = 400) -> int | None:
    """GET /v1/models retried as a client would while the server has no descriptor to accept it with."""
    for _ in range(tries):
        if (status := status_of(port)) == 200:
            return status
        time.sleep(0.05)
    return status


def test_out_of_descriptors_the_accept_loop_pauses_instead_of_spinning_and_recovers(micro_dir):
    # red team: accept() failing with EMFILE was swallowed, the listening socket stayed readable, 100% CPU
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(micro_dir), "tight"], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert select.select([server.stdout], [], [], CLIENT_TIMEOUT)[0], "the server never started"
        port = int(server.stdout.readline())
        clients = [socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT) for _ in range(40)]
        time.sleep(0.5)  # the server accepts what it can, then meets EMFILE
        before = cpu_seconds(server.pid)
        time.sleep(2.0)
        # a paused loop wakes twice a second and uses next to nothing; a spinning one burnt most of a core
        # (0.76 s of these 2 s on a busy 2-core machine, 2 s on an idle one)
        assert cpu_seconds(server.pid) - before < 0.25
        for sock in clients:  # their descriptors come free once the server sees them close
            sock.close()
        assert retried_status(port) == 200
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=CLIENT_TIMEOUT)
    assert "marl serve: cannot accept a connection (Too many open files): trying again every 0.5 s; lower " \
           "--max-connections or raise ulimit -n" in stderr
    assert "Traceback" not in stderr
