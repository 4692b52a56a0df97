"""Run untrusted Python in a contained subprocess (the code-tests verifier's engine).

`run_python(code)` runs `code` with `python -I -S -B` (no site-packages, no PYTHON* variables, no
bytecode) in a fresh temporary directory, deleted afterwards. The barriers, outermost first (the
child's bootstrap, judges/rules/sandbox_child.py, installs the in-process ones before the code's first line):

- Launch: a fresh environment (PATH, LANG, LC_ALL, HOME, TMPDIR); an empty network namespace where
  `unshare --net` works; as root, a random uid/gid of its own through `setpriv` (no groups,
  no-new-privs; keeping only CAP_DAC_READ_SEARCH if the interpreter is unreadable to other users).
- Resource limits: a wall-clock deadline (SIGKILL to the process group and every process of the
  run's uid), RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE per file, RLIMIT_NOFILE, RLIMIT_NPROC, no core
  dumps; `output_limit` bytes each of stdout and stderr are kept (`truncated`).
- Landlock (kernel): files can be read only in the standard library, the shared libraries it loads
  and a few devices, and read or written only inside the run's directory; no execution, devices,
  fifos, unix sockets or symlinks; where the kernel has them, no TCP bind/connect and no signals
  or abstract unix sockets across the sandbox boundary.
- seccomp-bpf (kernel; judges/rules/sandbox_layers.py lists the calls): process creation (fork, vfork,
  clone without CLONE_THREAD, execve), sockets, signals, ptrace, namespaces, mounts, io_uring, BPF,
  kernel keys and file handles end the process with SIGSYS (status "blocked", KERNEL_BLOCK).
- The audit hook (Python-level, a second layer with precise reasons): refuses the same actions at
  the Python API and hides frames (sys._getframe, traceback/generator frames, gc.get_objects/...,
  settrace, Python signal handlers), so a harness's locals are hard to reach even from Python.
The kernel layers are required: where Landlock or seccomp is unavailable, run_python raises
SandboxError before any code runs, unless the caller opts out (allow_unconfined=True or
MARL_SANDBOX_ALLOW_UNCONFINED=1). `SandboxResult.layers` names the layers active in each run.
A refused action ends the child at once (status "blocked"; `blocked` is a phrase from a fixed
vocabulary, never text of the candidate's choosing). A failure of the sandbox itself raises SandboxError.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from judges.rules import sandbox_child as child
from judges.rules.sandbox_layers import LAYER_NAMES, child_layer_config
from judges.types import ScorerError

SANDBOX_STATUSES = ("ok", "error", "timeout", "memory", "killed", "blocked")
BLOCKED_EXIT = child.BLOCKED_EXIT
CHANNEL_FD = child.CHANNEL_FD
KERNEL_BLOCK = "a system call refused by the kernel (seccomp)"
UNCONFINED_ENV = "MARL_SANDBOX_ALLOW_UNCONFINED"
DISK_BLOCK = "filling the disk"
DISK_BUDGET_BYTES = 1 << 30  # the audit hook's budget is WRITE_OPENS x FILE_LIMIT_BYTES = 256 MiB
DISK_ENTRIES = 20_000  # files and folders a run may make (empty files fill a file system's inodes)
DISK_CHECK_S = 0.1  # how often the run's directory is measured while it runs (at most)
DISK_CHECK_SPACING = 10  # and no sooner than this many times the last measure's duration (<= ~10% of a core)
DISK_CHECK_MAX_S = 1.0  # but at least this often, so a fast writer overshoots the budget by one second's writes
_CONTROL_LIMIT = 4096
FILE_LIMIT_BYTES = 8 * 2**20
WRITE_OPENS = 32  # with FILE_LIMIT_BYTES, bounds the disk a run can fill
MAX_OPEN_FILES = 64
MAX_TASKS = 8  # processes + threads of the sandbox uid (threads count against RLIMIT_NPROC)
_WORKDIR_PREFIX = "marl_sbx_"

_BOOTSTRAP = (Path(__file__).with_name("sandbox_child.py")).read_text(encoding="utf-8")


class SandboxError(ScorerError):
    """The sandbox itself failed (the interpreter could not be started): not the candidate's fault."""


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did. status: ok (exit 0), error (non-zero exit), timeout (wall or CPU
    limit), memory (MemoryError), killed (another signal), blocked (a refused action, named by
    `blocked`). stdout/stderr: decoded, capped (`truncated`: output was discarded). seconds: wall time.
    layers: the barriers that were active ("landlock", "seccomp", "audit"). channel: the bytes the run
    wrote to file descriptor CHANNEL_FD (only with `channel=True`; capped like stdout)."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    truncated: bool
    seconds: float
    blocked: str = ""
    layers: tuple[str, ...] = ()
    channel: bytes = b""


@dataclass(frozen=True)
class Isolation:
    """How children are launched on this machine (found once by `isolation()`)."""

    network_namespace: bool
    drop_privileges: str  # "uid", "uid+read" (keeps CAP_DAC_READ_SEARCH), or "" (runs as the current user)
    kernel_layers: tuple[str, ...] = ()  # of LAYER_NAMES, those this kernel and this install support
    unavailable: dict[str, str] = field(default_factory=dict)  # layer -> why it cannot be used here

    def prefix(self, uid: int) -> list[str]:
        """The launcher commands that go before the interpreter."""
        argv = []
        if self.network_namespace:
            argv += [shutil.which("unshare") or "unshare", "--net"] + ([] if os.geteuid() == 0 else ["-r"]) + ["--"]
        if self.drop_privileges:
            argv += [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                     "--no-new-privs"]
            if self.drop_privileges == "uid+read":
                caps = "-all,+dac_read_search"
                argv += [f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set={caps}"]
            argv += ["--"]
        return argv


_ISOLATION: Isolation | None = None
_ISOLATION_LOCK = threading.Lock()


def _probe(prefix: list[str], uid: int) -> bool:
    workdir = tempfile.mkdtemp(prefix=_WORKDIR_PREFIX)
    try:
        if uid >= 0:
            os.chown(workdir, uid, uid)
        # The same major.minor as ours: some systems run another interpreter when ours is unreadable.
        argv = prefix + [sys.executable, "-I", "-S", "-B", "-c", "import json, sys; print(sys.version_info[:2])"]
        done = subprocess.run(argv, cwd=workdir, env=_child_env(workdir), capture_output=True, timeout=20)
        return done.returncode == 0 and done.stdout.decode().strip() == str(sys.version_info[:2])
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def isolation() -> Isolation:
    """Which kernel-level barriers work here (probed once per process with real launches)."""
    global _ISOLATION
    with _ISOLATION_LOCK:
        if _ISOLATION is None:
            root, uid = os.geteuid() == 0, _pick_uid()
            netns = bool(shutil.which("unshare")) and _probe(Isolation(True, "").prefix(uid), -1)
            levels = ("uid", "uid+read") if root and shutil.which("setpriv") else ()
            drop = next((level for level in levels if _probe(Isolation(netns, level).prefix(uid), uid)), "")
            unavailable = child_layer_config(())[1]
            kernel = tuple(name for name in LAYER_NAMES if name not in unavailable)
            _ISOLATION = Isolation(netns, drop, kernel, unavailable)
        return _ISOLATION


def describe() -> str:
    """One line naming the barriers that this machine gives sandboxed code (for run logs and reports)."""
    setup = isolation()
    parts = list(setup.kernel_layers) + ["audit hook", "rlimits"]
    parts += ["network namespace"] if setup.network_namespace else []
    parts += [f"own uid ({setup.drop_privileges})"] if setup.drop_privileges else []
    missing = "; ".join(f"{name} unavailable: {why}" for name, why in setup.unavailable.items())
    return "sandbox layers: " + ", ".join(parts) + (f" ({missing})" if missing else "")


def _pick_uid() -> int:
    return 1_900_000_000 + secrets.randbelow(50_000_000)


def _child_env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}


def _processes_of(uid: int) -> dict[int, int]:
    """pid -> thread count of the processes whose real uid is `uid` (what RLIMIT_NPROC counts)."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                found[int(entry)] = int(fields.get("Threads", "1"))
        except (OSError, ValueError, KeyError):
            continue
    return found


def _kill(pgid: int | None, uid: int | None = None) -> None:
    """SIGKILL the process group (of an unreaped child, so the id is not reused) and every process of
    the run's dedicated uid (nothing else has it)."""
    for pid in ([-pgid] if pgid and pgid > 0 else []) + list(_processes_of(uid) if uid is not None else ()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _write_files(workdir: str, code: str, files: dict[str, str] | None, uid: int) -> None:
    with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as handle:
        handle.write(code)
    for name, content in (files or {}).items():
        parts = name.replace("\\", "/").split("/")
        if name.startswith("/") or any(part in ("", ".", "..") for part in parts) or name == "main.py":
            raise ValueError(f"sandbox file name {name!r} must be a relative path without '..' (and not main.py)")
        target = os.path.join(workdir, *parts)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(content)
    for folder, _, names in os.walk(workdir) if uid >= 0 else ():
        for path in [folder] + [os.path.join(folder, name) for name in names]:
            os.chown(path, uid, uid)


class _Capture:
    """Reads the child's pipes without blocking: stdout and stderr (at most `limit` bytes each, else
    `truncated`), the control pipe (at most _CONTROL_LIMIT) and the optional result channel (`limit`)."""

    def __init__(self, proc: subprocess.Popen, limit: int, control: int, channel: int | None):
        self.truncated = False
        streams = {"stdout": proc.stdout.fileno(), "stderr": proc.stderr.fileno(), "control": control}
        if channel is not None:
            streams["channel"] = channel
        self.names = {fd: name for name, fd in streams.items()}
        self.limits = {name: (_CONTROL_LIMIT if name == "control" else limit) for name in streams}
        self.data = {name: bytearray() for name in streams}
        self.selector = selectors.DefaultSelector()
        for fd in self.names:
            self.selector.register(fd, selectors.EVENT_READ)

    @property
    def open(self) -> bool:
        return bool(self.selector.get_map())

    def pump(self, wait: float) -> None:
        """Read what is available within `wait` seconds."""
        for key, _ in self.selector.select(timeout=max(wait, 0.0)):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                self.selector.unregister(key.fileobj)
                continue
            name = self.names[key.fd]
            buffer = self.data[name]
            room = self.limits[name] - len(buffer)
            if name in ("stdout", "stderr"):
                self.truncated |= len(chunk) > room
            buffer += chunk[:max(room, 0)]

    def text(self, name: str) -> str:
        return bytes(self.data[name]).decode("utf-8", "replace")


def _exited(pid: int) -> bool:
    """True when the child has exited (it is not reaped yet, so its pid and group stay reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class _DiskWatch:
    """Measures what the run itself has written: the blocks allocated under its own directory, the
    only place Landlock lets it write, and the files its processes hold open that no directory shows
    (written then unlinked, O_TMPFILE, sqlite's temp files: `find` cannot see them, their blocks stay
    taken until closed). Native code can make files without the audit hook's write budget, so a run
    past DISK_BUDGET_BYTES (or DISK_ENTRIES files and folders) is stopped. The file system's free
    space is not the measure: another process filling the same disk is not the run's doing."""

    def __init__(self, workdir: str, pgid: int | None = None, uid: int | None = None):
        self.workdir, self.pgid, self.uid = workdir, pgid, uid
        self.exceeded, self.next_at, self.cost = False, 0.0, 0.0

    def usage(self) -> tuple[int, int]:
        """(bytes allocated, entries): the run directory's (`find`) and its processes' unlinked open files."""
        size, entries = self._tree_usage()
        held, files = _unlinked_open_files(_run_pids(self.pgid, self.uid))
        return size + held, entries + files

    def _tree_usage(self) -> tuple[int, int]:
        """(bytes allocated, entries) under the run directory, by `find` (it walks trees thousands
        deep, which Python's walks cannot); a folder the run made unreadable is made readable again
        first (it is the parent's tree), and what still cannot be measured counts as over the budget."""
        for _ in range(2):
            try:
                found = subprocess.run([shutil.which("find") or "find", self.workdir, "-printf", "%b\\n"],
                                       capture_output=True, timeout=30)
            except (OSError, subprocess.SubprocessError) as error:
                raise SandboxError(f"cannot measure the run's disk use: {error}") from error
            if found.returncode == 0 or b"Permission denied" not in found.stderr:  # a file the run deleted meanwhile
                blocks = found.stdout.split()
                return sum(map(int, blocks)) * 512, len(blocks)  # %b: 512-byte blocks allocated
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["chmod", "-R", "u+rwx", "--", self.workdir], capture_output=True, timeout=30)
        return DISK_BUDGET_BYTES + 1, 0

    def check(self, final: bool = False) -> bool:
        """True (once) when the run has written more than its budget; measured while it runs at most
        every DISK_CHECK_S, or DISK_CHECK_SPACING times as long as the last measure took (a tree of
        19k files takes ~0.6 s to walk: walking it back to back would cost the trainer a core), but at
        least every DISK_CHECK_MAX_S, and once more when it has ended."""
        now = time.monotonic()
        if self.exceeded or (now < self.next_at and not final):
            return False
        size, entries = self.usage()
        self.cost = time.monotonic() - now
        self.next_at = now + min(DISK_CHECK_MAX_S, max(DISK_CHECK_S, DISK_CHECK_SPACING * self.cost))
        self.exceeded = size > DISK_BUDGET_BYTES or entries > DISK_ENTRIES
        return self.exceeded


def _run_pids(pgid: int | None, uid: int | None) -> set[int]:
    """The run's processes: those of its process group (the session it was started in) and of its
    dedicated uid."""
    pids = set(_processes_of(uid)) if uid is not None else set()
    for entry in filter(str.isdigit, os.listdir("/proc")) if pgid else ():
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp
            if int(fields[2]) == pgid:
                pids.add(int(entry))
    return pids


def _unlinked_open_files(pids: set[int]) -> tuple[int, int]:
    """(bytes allocated, count) of the regular files that `pids` hold open with no name left (nlink
    0), each counted once. Files with a name are under the run directory, measured there. The parent
    is root or the run's own user, so /proc/<pid>/fd is readable; a process gone meanwhile is skipped."""
    seen: dict[tuple[int, int], int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                info = os.stat(f"/proc/{pid}/fd/{fd}")  # the open file itself, named or not
                if stat.S_ISREG(info.st_mode) and info.st_nlink == 0:
                    seen[info.st_dev, info.st_ino] = info.st_blocks * 512
    return sum(seen.values()), len(seen)


def _supervise(proc: subprocess.Popen, capture: _Capture, timeout_s: float, uid: int | None, disk: _DiskWatch):
    """Drain output until the child exits or the deadline passes; returns (timed_out, rusage)."""
    deadline = time.monotonic() + timeout_s
    timed_out, exited_at, give_up = False, None, None
    while True:
        now = time.monotonic()
        if not timed_out and now >= deadline:
            timed_out, give_up = True, now + 5.0
            _kill(proc.pid, uid)
        if exited_at is None and disk.check():
            give_up = now + 5.0
            _kill(proc.pid, uid)
        if capture.open:
            capture.pump(min(0.05, max(deadline - now, 0.0)) if not timed_out else 0.05)
        else:
            time.sleep(0.002)
        if exited_at is None and _exited(proc.pid):
            exited_at = time.monotonic()
            _kill(proc.pid)  # stragglers that kept the pipes open
        if exited_at is not None and (not capture.open or time.monotonic() - exited_at > 0.5):
            break
        if give_up is not None and time.monotonic() > give_up:
            break
    try:
        pid, status, usage = os.wait4(proc.pid, 0 if exited_at is not None else os.WNOHANG)
        proc.returncode = os.waitstatus_to_exitcode(status) if pid else None
    except ChildProcessError:
        usage = None
    return timed_out, usage


def _control_report(control: str) -> tuple[tuple[str, ...], str, str]:
    """(layers, blocked reason, unconfined reason) from the child's control pipe. Only the first
    `layers` line counts (the bootstrap writes it before the candidate runs), and only a reason from
    the fixed vocabulary: a candidate writing to the pipe cannot put its own words in a report."""
    lines = control.splitlines()
    layers = tuple(lines[0][len("layers "):].split(",")) if lines and lines[0].startswith("layers ") else ()
    blocked = next((line[len("blocked "):] for line in lines[1:] if line.startswith("blocked ")), "")
    unconfined = lines[0][len("unconfined "):] if lines and lines[0].startswith("unconfined ") else ""
    return layers, (blocked if blocked in child.BLOCK_REASONS else ""), unconfined


def _classify(returncode: int | None, timed_out: bool, cpu_used: float, cpu_s: float, stderr: str,
              blocked: str) -> tuple[str, str]:
    if returncode == BLOCKED_EXIT and blocked:
        return "blocked", blocked
    if returncode == -signal.SIGSYS:
        return "blocked", KERNEL_BLOCK
    if timed_out or returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and cpu_used >= cpu_s - 0.05):
        return "timeout", ""
    last = stderr.strip().rsplit("\n", 1)[-1]
    if last.startswith("MemoryError") or "Cannot allocate memory" in last or "out of memory" in last.lower():
        return "memory", ""
    if returncode is None or returncode < 0:
        return "killed", ""
    return ("ok" if returncode == 0 else "error"), ""


def run_python(code: str, *, stdin: str = "", timeout_s: float = 5.0, cpu_s: float = 5.0, memory_mb: int = 512,
               output_limit: int = 64_000, files: dict[str, str] | None = None, channel: bool = False,
               allow_unconfined: bool | None = None, audit_hook: bool = True) -> SandboxResult:
    """Run `code` in a contained interpreter (see the module docstring for the barriers).

    stdin: text fed to the program. timeout_s: wall-clock limit. cpu_s: CPU-time limit (whole seconds,
    rounded up). memory_mb: address-space limit. output_limit: bytes kept of stdout and of stderr each.
    files: extra text files (relative name -> content) placed in the working directory. channel: give
    the code a pipe at file descriptor CHANNEL_FD whose bytes come back as `result.channel`.
    allow_unconfined: run even where a kernel layer (Landlock, seccomp) is unavailable (default: the
    MARL_SANDBOX_ALLOW_UNCONFINED environment variable, off); otherwise such a run raises SandboxError
    before any code runs. audit_hook=False leaves the Python-level layer out, to test what the kernel
    layers stop on their own (never do this to score code). Never raises for anything the code does; raises ValueError for bad arguments
    and SandboxError when the interpreter cannot be started or cannot be confined.
    """
    _check_arguments(code, timeout_s, cpu_s, memory_mb, output_limit)
    setup, root = isolation(), os.geteuid() == 0
    require = () if _unconfined_allowed(allow_unconfined) else LAYER_NAMES
    _refuse_unconfined({name: why for name, why in setup.unavailable.items() if name in require})
    uid = _pick_uid() if setup.drop_privileges else None
    nproc = MAX_TASKS if uid is not None else (-1 if root else sum(_processes_of(os.getuid()).values()) + MAX_TASKS)
    workdir = os.path.realpath(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
    started, proc, capture, pipes = time.monotonic(), None, None, _Pipes(channel)
    try:
        _write_files(workdir, code, files, -1 if uid is None else uid)
        limits = {"cpu": int(-(-cpu_s // 1)), "memory": memory_mb * 2**20, "fsize": FILE_LIMIT_BYTES,
                  "nofile": MAX_OPEN_FILES, "nproc": nproc, "write_opens": WRITE_OPENS}
        config = dict(child_layer_config(require)[0], root=workdir, limits=limits, control_fd=pipes.control_w,
                      channel_fd=pipes.channel_w, audit_hook=bool(audit_hook))
        argv = setup.prefix(uid if uid is not None else 0) + [sys.executable, "-I", "-S", "-B", "-c", _BOOTSTRAP,
                                                              json.dumps(config)]
        proc = _launch(argv, workdir, stdin, pipes.child_ends())
        pipes.close_child_ends()
        capture = _Capture(proc, output_limit, pipes.control_r, pipes.channel_r)
        disk = _DiskWatch(workdir, proc.pid, uid)  # start_new_session: its process group is its pid
        timed_out, usage = _supervise(proc, capture, timeout_s, uid, disk)
        disk.check(final=True)  # what it wrote between the last measure and its exit counts too
        cpu_used = (usage.ru_utime + usage.ru_stime) if usage is not None else 0.0
        layers, blocked, unconfined = _control_report(capture.text("control"))
        if unconfined and proc.returncode == child.UNCONFINED_EXIT:
            _refuse_unconfined({"kernel": unconfined})
        stderr = capture.text("stderr")
        status, blocked = _classify(proc.returncode, timed_out, cpu_used, cpu_s, stderr, blocked)
        if disk.exceeded:
            status, blocked = "blocked", DISK_BLOCK
        return SandboxResult(status, proc.returncode, capture.text("stdout"), stderr, capture.truncated,
                             time.monotonic() - started, blocked, layers, bytes(capture.data.get("channel", b"")))
    finally:
        _cleanup(proc, capture, uid, workdir)
        pipes.close()


def _unconfined_allowed(allow_unconfined: bool | None) -> bool:
    if allow_unconfined is not None:
        return bool(allow_unconfined)
    return os.environ.get(UNCONFINED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _refuse_unconfined(unavailable: dict[str, str]) -> None:
    if unavailable:
        reasons = "; ".join(f"{name}: {why}" for name, why in unavailable.items())
        raise SandboxError(f"refusing to run untrusted code without the sandbox's kernel layers ({reasons}); "
                           f"set {UNCONFINED_ENV}=1 to run it behind the audit hook only (not a security boundary)")


class _Pipes:
    """The control pipe (the bootstrap's reports) and the optional result channel; the parent keeps
    the read ends, the child inherits the write ends."""

    def __init__(self, channel: bool):
        self.control_r, self.control_w = os.pipe()
        self.channel_r, self.channel_w = os.pipe() if channel else (None, None)

    def child_ends(self) -> tuple[int, ...]:
        return tuple(fd for fd in (self.control_w, self.channel_w) if fd is not None)

    def close_child_ends(self) -> None:
        for name in ("control_w", "channel_w"):
            self._close(name)

    def close(self) -> None:
        for name in ("control_r", "control_w", "channel_r", "channel_w"):
            self._close(name)

    def _close(self, name: str) -> None:
        fd = getattr(self, name)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
            setattr(self, name, None)


def _check_arguments(code: str, timeout_s: float, cpu_s: float, memory_mb: int, output_limit: int) -> None:
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    for label, value, least in (("timeout_s", timeout_s, 0), ("cpu_s", cpu_s, 0), ("memory_mb", memory_mb, 64),
                                ("output_limit", output_limit, 1)):
        if not isinstance(value, (int, float)) or value < least or value <= 0:
            raise ValueError(f"{label} must be a number >= {least} (and > 0), got {value!r}")


def _launch(argv: list[str], workdir: str, stdin: str, pass_fds: tuple[int, ...]) -> subprocess.Popen:
    with tempfile.TemporaryFile() as stdin_file:  # a file, not a pipe: any size without a writer thread
        stdin_file.write(stdin.encode("utf-8"))
        stdin_file.seek(0)
        try:
            return subprocess.Popen(argv, cwd=workdir, env=_child_env(workdir), stdin=stdin_file,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    pass_fds=pass_fds)
        except OSError as error:
            raise SandboxError(f"cannot start the sandboxed interpreter: {error}") from error


def _cleanup(proc: subprocess.Popen | None, capture: _Capture | None, uid: int | None, workdir: str) -> None:
    if proc is not None:
        if proc.returncode is None:
            _kill(proc.pid)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    if capture is not None:
        capture.selector.close()
    if uid is not None:
        _kill(None, uid)
    _remove_tree(workdir)


def _remove_tree(workdir: str) -> None:
    """Deletes the run's directory, however deep or locked the code left it: shutil.rmtree recurses
    (a tree thousands deep raises RecursionError), so chmod and rm, which walk it iteratively, finish."""
    with contextlib.suppress(RecursionError):
        shutil.rmtree(workdir, ignore_errors=True)
    if os.path.lexists(workdir):  # too deep, or (not root) permissions removed inside
        for command in (["chmod", "-R", "u+rwx", "--", workdir], ["rm", "-rf", "--", workdir]):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(command, capture_output=True, timeout=120)

