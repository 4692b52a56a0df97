"""Run untrusted Python in a contained subprocess (the code-tests verifier's engine).

`run_python(code)` runs `code` with `python -I -S -B` (no site-packages, no PYTHON* variables, no
bytecode) in a fresh temporary directory, deleted afterwards (locked while the run lasts: a folder a
killed parent left is swept by the next run, judges/rules/sandbox_workdir.py). The barriers, outermost
first (the child's bootstrap, judges/rules/sandbox_child.py, installs the in-process ones before the
code's first line):

- Launch: a fresh environment (PATH, LANG, LC_ALL, HOME, TMPDIR); an empty network namespace where
  `unshare --net` works; a PID namespace of its own where `unshare --pid --fork` works (the child is
  its pid 1 and sees no other process: no pids, sessions or groups to probe); as root, a random
  uid/gid of its own through `setpriv` (no groups, no-new-privs; keeping only CAP_DAC_READ_SEARCH if
  the interpreter is unreadable to other users).
  The child names the Python that runs (judges/rules/sandbox_interpreter.py, `result.interpreter`);
  a major.minor other than ours raises SandboxError before any code is read.
- Resource limits (kernel): RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE per file, RLIMIT_NOFILE, RLIMIT_NPROC,
  no core dumps; and from the parent a wall-clock deadline (SIGKILL to the process group but unshare,
  which reaps the child and exits, to its children, and to every process of the run's uid), a disk
  budget (DISK_BUDGET_BYTES, DISK_ENTRIES) and `output_limit` bytes each of stdout and stderr
  (`truncated`).
- Landlock (kernel): files can be read only in the standard library (of its extension modules only
  sandbox_layers.EXTENSION_MODULES: no subinterpreter, ctypes or test module can be loaded under any
  name), the shared libraries it loads and a few devices, and read or written only inside the run's
  directory; no execution, devices, fifos, unix sockets or symlinks; where the kernel has them, no
  TCP bind/connect and no signals or abstract unix sockets across the sandbox boundary.
- seccomp-bpf (kernel; judges/rules/sandbox_layers.py lists the calls): process creation (fork, vfork,
  clone without CLONE_THREAD, execve), sockets, signals, ptrace, namespaces, mounts, io_uring, BPF,
  kernel keys and file handles end the process with SIGSYS (status "blocked", KERNEL_BLOCK).
- The audit hook: a diagnostic, not a layer (CPython's audit hooks are no security boundary; native
  code and a subinterpreter run without them). It refuses the same actions at the Python API with a
  precise reason, and hides frames (sys._getframe, traceback/generator frames, gc.get_objects/...,
  settrace, Python signal handlers).
The kernel layers are required: where Landlock or seccomp is unavailable, run_python raises
SandboxError before any code runs, unless the caller opts out (allow_unconfined=True or
MARL_SANDBOX_ALLOW_UNCONFINED=1). `SandboxResult.layers` names the kernel-enforced layers that the
child confirmed in each run (of REPORTED_LAYERS); `diagnostics` names the audit hook when it was on.
A refused action ends the child at once (status "blocked"; `blocked` is a phrase from a fixed
vocabulary, never text of the candidate's choosing). A failure of the sandbox itself raises SandboxError.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from judges.rules import sandbox_child as child
from judges.rules import sandbox_interpreter as interpreters
from judges.rules.sandbox_interpreter import Interpreter
from judges.rules.sandbox_layers import LAYER_NAMES, REPORTED_LAYERS, child_layer_config
from judges.rules.sandbox_disk import DISK_BUDGET_BYTES, DISK_ENTRIES  # noqa: F401 (re-exported: the budget)
from judges.rules.sandbox_disk import DiskWatch as _DiskWatch
from judges.rules.sandbox_disk import processes_of as _processes_of
from judges.rules.sandbox_disk import run_pids as _run_pids
from judges.rules.sandbox_pipes import Capture as _Capture, ControlReport, Pipes as _Pipes, read_control
from judges.rules.sandbox_workdir import SANDBOX_UIDS, remove_tree as _remove_tree, run_folder as _run_folder
from judges.types import ScorerError

SANDBOX_STATUSES = ("ok", "error", "timeout", "memory", "killed", "blocked")
BLOCKED_EXIT = child.BLOCKED_EXIT
CHANNEL_FD = child.CHANNEL_FD
KERNEL_BLOCK = "a system call refused by the kernel (seccomp)"
UNCONFINED_ENV = "MARL_SANDBOX_ALLOW_UNCONFINED"
DISK_BLOCK = "filling the disk"
FILE_LIMIT_BYTES = 8 * 2**20  # RLIMIT_FSIZE: per file, kernel-enforced
WRITE_OPENS = 32  # the audit hook's budget of files opened for writing (a diagnostic: DISK_BUDGET_BYTES holds)
MAX_OPEN_FILES = 64  # RLIMIT_NOFILE: open at once, kernel-enforced
MAX_TASKS = 8  # processes + threads of the sandbox uid (threads count against RLIMIT_NPROC)

_UNSHARE_SIGKILL = "unshare: sigprocmask unblock failed: Invalid argument\n"  # see _child_status
_BOOTSTRAP = (Path(__file__).with_name("sandbox_child.py")).read_text(encoding="utf-8")


class SandboxError(ScorerError):
    """The sandbox itself failed (the interpreter could not be started): not the candidate's fault."""


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did. status: ok (exit 0), error (non-zero exit), timeout (wall or CPU
    limit), memory (MemoryError), killed (another signal), blocked (a refused action, named by
    `blocked`). stdout/stderr: decoded, capped (`truncated`: output was discarded). seconds: wall time.
    layers: the kernel-enforced barriers the child confirmed (of REPORTED_LAYERS: "landlock",
    "seccomp", "netns", "pidns", "rlimits", "uid"). diagnostics: the Python-level checks that were on
    ("audit"), never counted as isolation. interpreter: the Python that ran (its path and full
    version). channel: the bytes the run wrote to file descriptor CHANNEL_FD (only with
    `channel=True`; capped like stdout)."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    truncated: bool
    seconds: float
    blocked: str = ""
    layers: tuple[str, ...] = ()
    channel: bytes = b""
    diagnostics: tuple[str, ...] = ()
    interpreter: Interpreter | None = None


@dataclass(frozen=True)
class Isolation:
    """How children are launched on this machine (found once by `isolation()`)."""

    network_namespace: bool
    drop_privileges: str  # "uid", "uid+read" (keeps CAP_DAC_READ_SEARCH), or "" (runs as the current user)
    kernel_layers: tuple[str, ...] = ()  # of LAYER_NAMES, those this kernel and this install support
    unavailable: dict[str, str] = field(default_factory=dict)  # layer -> why it cannot be used here
    interpreter: Interpreter | None = None  # what the launch runs (None: it could not be started)
    pid_namespace: bool = False  # the child is pid 1 of a PID namespace of its own (`unshare --pid --fork`)

    @property
    def layers(self) -> tuple[str, ...]:
        """The layers a run is expected to report here (in REPORTED_LAYERS' order)."""
        found = set(self.kernel_layers) | {"rlimits"} | ({"netns"} if self.network_namespace else set())
        found |= ({"pidns"} if self.pid_namespace else set()) | ({"uid"} if self.drop_privileges else set())
        return tuple(name for name in REPORTED_LAYERS if name in found)

    def prefix(self, uid: int) -> list[str]:
        """The launcher commands that go before the interpreter. With a PID namespace, unshare forks:
        the interpreter is its child (pid 1 inside) in the process group of unshare (the launched
        process), where the deadline finds it (or, gone with setsid, as unshare's child) and kills it,
        leaving unshare to reap it and exit; as the namespace's init, its death takes any other
        process of the namespace with it."""
        argv = []
        if self.pid_namespace:  # unshare re-raises its child's fatal signal on itself: no core file of it
            argv += [shutil.which("prlimit") or "prlimit", "--core=0", "--"]
        if self.network_namespace or self.pid_namespace:
            argv += [shutil.which("unshare") or "unshare"] + (["--net"] if self.network_namespace else [])
            argv += ["--pid", "--fork", "--kill-child"] if self.pid_namespace else []
            argv += ([] if os.geteuid() == 0 else ["-r"]) + ["--"]
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


def _probe(prefix: list[str], uid: int) -> Interpreter | None:
    """The interpreter that a launch with `prefix` runs, or None when it does not start."""
    try:
        with _run_folder() as workdir:
            if uid >= 0:
                os.chown(workdir, uid, uid)
            argv = prefix + [sys.executable, "-I", "-S", "-B", "-c", interpreters.PROBE_CODE]
            done = subprocess.run(argv, cwd=workdir, env=_child_env(workdir), capture_output=True, timeout=20)
            return interpreters.parse(done.stdout.decode("utf-8", "replace")) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _works(prefix: list[str], uid: int) -> bool:
    """A launch with `prefix` starts an interpreter of our major.minor (some systems run another one
    when ours is unreadable to the run's uid: such a level is passed over for the next)."""
    found = _probe(prefix, uid)
    return found is not None and not interpreters.mismatch(found)


def isolation() -> Isolation:
    """Which kernel-level barriers work here, and which interpreter runs (probed once per process with
    real launches)."""
    global _ISOLATION
    with _ISOLATION_LOCK:
        if _ISOLATION is None:
            root, uid, unshare = os.geteuid() == 0, _pick_uid(), bool(shutil.which("unshare"))
            netns = unshare and _works(Isolation(True, "").prefix(uid), -1)
            pidns = unshare and bool(shutil.which("prlimit")) and _works(
                Isolation(netns, "", pid_namespace=True).prefix(uid), -1)
            levels = ("uid", "uid+read") if root and shutil.which("setpriv") else ()
            drop = next((level for level in levels
                         if _works(Isolation(netns, level, pid_namespace=pidns).prefix(uid), uid)), "")
            unavailable = child_layer_config(())[1]
            kernel = tuple(name for name in LAYER_NAMES if name not in unavailable)
            found = _probe(Isolation(netns, drop, pid_namespace=pidns).prefix(uid), uid if drop else -1)
            _ISOLATION = Isolation(netns, drop, kernel, unavailable, found, pidns)
        return _ISOLATION


def describe() -> str:
    """One line naming the kernel layers this machine gives sandboxed code, the diagnostics and the
    interpreter (for run logs and reports)."""
    setup = isolation()
    words = {"netns": "network namespace", "pidns": "pid namespace", "uid": f"own uid ({setup.drop_privileges})"}
    parts = [words.get(name, name) for name in setup.layers]
    missing = "; ".join(f"{name} unavailable: {why}" for name, why in setup.unavailable.items())
    ran = f"; interpreter: {setup.interpreter}" if setup.interpreter else "; interpreter: does not start"
    return ("sandbox layers: " + ", ".join(parts) + (f" ({missing})" if missing else "")
            + "; diagnostics (not a boundary): audit hook" + ran)


def _pick_uid() -> int:
    return SANDBOX_UIDS.start + secrets.randbelow(len(SANDBOX_UIDS))


def _child_env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}


def _kill(pgid: int | None, uid: int | None = None, spare_leader: bool = False) -> None:
    """SIGKILL the process group (of an unreaped child, so the id is not reused) and every process of
    the run's dedicated uid (nothing else has it). spare_leader: all of the group but its leader, the
    launcher (unshare, with a PID namespace): it reaps the interpreter, its child, then exits itself;
    killed too, it would leave the interpreter's zombie to whatever process adopts it."""
    pids = list(_processes_of(uid)) if uid is not None else []
    if pgid and pgid > 0:  # the group, and the leader's children (one may have left it with setsid)
        pids += [pid for pid in _run_pids(pgid, None) if pid != pgid] + ([] if spare_leader else [-pgid])
    for pid in pids:
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


def _exited(pid: int) -> bool:
    """True when the child has exited (it is not reaped yet, so its pid and group stay reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _supervise(proc: subprocess.Popen, capture: _Capture, timeout_s: float, uid: int | None, disk: _DiskWatch,
               spare_leader: bool = False):
    """Drain output until the child exits or the deadline passes; returns (timed_out, rusage).
    spare_leader: stop the run without killing the launcher (see _kill), which then exits."""
    deadline = time.monotonic() + timeout_s
    timed_out, exited_at, give_up = False, None, None
    while True:
        now = time.monotonic()
        if not timed_out and now >= deadline:
            timed_out, give_up = True, now + 5.0
            _kill(proc.pid, uid, spare_leader)
        if exited_at is None and disk.check():
            give_up = now + 5.0
            _kill(proc.pid, uid, spare_leader)
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


def _child_status(returncode: int | None, pid_namespace: bool, stopped: bool, cpu_spent: bool) -> int | None:
    """The interpreter's exit status. With a PID namespace the launched process is unshare, which
    exits with its child's status and re-raises its child's fatal signal on itself, except SIGKILL,
    which cannot be raised that way: util-linux then exits 1 ("sigprocmask unblock failed"). A SIGKILL
    is told apart when the parent sent it (`stopped`: the deadline, the disk budget) or the kernel did
    at the CPU limit (`cpu_spent`); another one (the OOM killer's) reads as exit status 1, an "error"."""
    if pid_namespace and returncode == 1 and (stopped or cpu_spent):
        return -signal.SIGKILL
    return returncode


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
    before any code runs. audit_hook=False leaves the Python-level diagnostic out, to test what the
    kernel layers stop on their own. Never raises for anything the code does; raises ValueError for bad
    arguments and SandboxError when the interpreter cannot be started, is another major.minor than
    ours, or cannot be confined.
    """
    _check_arguments(code, timeout_s, cpu_s, memory_mb, output_limit)
    setup = isolation()
    require = () if _unconfined_allowed(allow_unconfined) else LAYER_NAMES
    _refuse_unconfined({name: why for name, why in setup.unavailable.items() if name in require})
    uid = _pick_uid() if setup.drop_privileges else None
    with _run_folder() as workdir:  # locked while it runs; a dead parent's folder is swept by the next run
        return _run_in(workdir, setup, code, stdin, timeout_s, cpu_s, memory_mb, output_limit, files, channel,
                       require, uid, audit_hook)


def _run_in(workdir: str, setup: Isolation, code: str, stdin: str, timeout_s: float, cpu_s: float,
            memory_mb: int, output_limit: int, files: dict[str, str] | None, channel: bool,
            require: tuple[str, ...], uid: int | None, audit_hook: bool) -> SandboxResult:
    """run_python's run, in its locked folder `workdir`."""
    started, proc, capture, pipes = time.monotonic(), None, None, _Pipes(channel)
    try:
        _write_files(workdir, code, files, -1 if uid is None else uid)
        config = _child_config(require, workdir, uid, cpu_s, memory_mb, pipes, audit_hook)
        argv = setup.prefix(uid if uid is not None else 0) + [sys.executable, "-I", "-S", "-B", "-c", _BOOTSTRAP,
                                                              json.dumps(config)]
        proc = _launch(argv, workdir, stdin, pipes.child_ends())
        pipes.close_child_ends()
        capture = _Capture(proc, output_limit, pipes.control_r, pipes.channel_r)
        disk = _DiskWatch(workdir, proc.pid, uid)  # start_new_session: its process group is its pid
        timed_out, usage = _supervise(proc, capture, timeout_s, uid, disk, setup.pid_namespace)
        disk.check(final=True)  # what it wrote between the last measure and its exit counts too
        return _result(proc, capture, setup.pid_namespace, timed_out, disk.exceeded, usage, cpu_s, started)
    except OSError as error:  # the sandbox's own failure (writing the run's files, measuring its disk use)
        raise SandboxError(f"the sandbox failed: {error}") from error
    finally:
        _cleanup(proc, capture, uid, workdir)
        pipes.close()


def _result(proc: subprocess.Popen, capture: _Capture, pid_namespace: bool, timed_out: bool, exceeded: bool,
            usage, cpu_s: float, started: float) -> SandboxResult:
    """What the run did: its exit status (the interpreter's, see _child_status), the CPU it used, its
    output and the bootstrap's reports; SandboxError when it failed for the sandbox's own reasons."""
    cpu_used = (usage.ru_utime + usage.ru_stime) if usage is not None else 0.0
    launcher_status, stderr = proc.returncode, capture.text("stderr")
    proc.returncode = _child_status(launcher_status, pid_namespace, timed_out or exceeded, cpu_used >= cpu_s - 0.05)
    if launcher_status != proc.returncode:  # unshare's own line about it is not the candidate's output
        stderr = stderr.removesuffix(_UNSHARE_SIGKILL)
    report = read_control(capture.text("control"))
    _refuse_bootstrap_failure(report, proc.returncode, timed_out or exceeded, stderr)
    status, blocked = _classify(proc.returncode, timed_out, cpu_used, cpu_s, stderr, report.blocked)
    if exceeded:
        status, blocked = "blocked", DISK_BLOCK
    return SandboxResult(status, proc.returncode, capture.text("stdout"), stderr, capture.truncated,
                         time.monotonic() - started, blocked, report.layers,
                         bytes(capture.data.get("channel", b"")), report.diagnostics, report.interpreter)


def _child_config(require: tuple[str, ...], workdir: str, uid: int | None, cpu_s: float, memory_mb: int,
                  pipes: _Pipes, audit_hook: bool) -> dict:
    """The bootstrap's settings: the kernel layers, the limits, the pipes, and what it checks itself
    against (our major.minor; our network namespace and uid, which its own must differ from to count)."""
    root = os.geteuid() == 0
    nproc = MAX_TASKS if uid is not None else (-1 if root else sum(_processes_of(os.getuid()).values()) + MAX_TASKS)
    limits = {"cpu": int(-(-cpu_s // 1)), "memory": memory_mb * 2**20, "fsize": FILE_LIMIT_BYTES,
              "nofile": MAX_OPEN_FILES, "nproc": nproc, "write_opens": WRITE_OPENS}
    host = {}
    for kind in ("net", "pid"):
        try:
            host[f"host_{kind}ns"] = os.stat(f"/proc/self/ns/{kind}").st_ino
        except OSError:  # no /proc: the child cannot tell either, and claims no namespace
            host[f"host_{kind}ns"] = -1
    return dict(child_layer_config(require)[0], root=workdir, limits=limits, control_fd=pipes.control_w,
                channel_fd=pipes.channel_w, audit_hook=bool(audit_hook), python=list(sys.version_info[:2]),
                host_uid=os.geteuid(), **host)


def _refuse_bootstrap_failure(report: ControlReport, returncode: int | None, stopped: bool, stderr: str) -> None:
    """SandboxError when the run failed for the sandbox's own reasons, before any code of the candidate:
    another major.minor ran, a required kernel layer failed, or the bootstrap never reported (unless
    the run was stopped first: a deadline or the disk budget)."""
    if report.interpreter is not None and interpreters.mismatch(report.interpreter):
        raise SandboxError(interpreters.mismatch(report.interpreter))
    if report.unconfined and returncode == child.UNCONFINED_EXIT:
        _refuse_unconfined({"kernel": report.unconfined})
    if report.interpreter is None and not stopped:
        last = stderr.strip().rsplit("\n", 1)[-1][:300] or "no output"
        raise SandboxError(f"the sandboxed interpreter {sys.executable} failed before running any code "
                           f"(exit status {returncode}: {last}); check that it starts with `-I -S -B`")


def _unconfined_allowed(allow_unconfined: bool | None) -> bool:
    if allow_unconfined is not None:
        return bool(allow_unconfined)
    return os.environ.get(UNCONFINED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _refuse_unconfined(unavailable: dict[str, str]) -> None:
    if unavailable:
        reasons = "; ".join(f"{name}: {why}" for name, why in unavailable.items())
        raise SandboxError(f"refusing to run untrusted code without the sandbox's kernel layers ({reasons}); "
                           f"set {UNCONFINED_ENV}=1 to run it behind the audit hook only (not a security boundary)")


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
