"""Run untrusted Python in a contained subprocess (the code-tests verifier's engine).

`run_python(code)` runs `code` with `python -I -S -B` (no site-packages, no PYTHON* variables, no
bytecode) in a fresh temporary directory, deleted afterwards. What protects against what:

- Time: a wall-clock deadline (SIGKILL to the process group and, as root, to every process of the
  run's own uid) and RLIMIT_CPU. Memory: RLIMIT_AS. Disk: RLIMIT_FSIZE per file and at most
  WRITE_OPENS opens for writing or mkdirs; RLIMIT_NOFILE; RLIMIT_CORE = 0. Output: `output_limit`
  bytes each of stdout and stderr are kept (`truncated`).
- Environment secrets: the child gets a fresh environment (PATH, LANG, LC_ALL, HOME, TMPDIR).
- Network: an audit hook (installed before the code's first line; it cannot be removed) ends the
  process on any `socket.*` event, before a socket exists; where `unshare --net` works (root or
  unprivileged user namespaces) the child also runs in an empty network namespace.
- Processes: the hook ends the process on fork/exec/spawn/system/Popen/kill/fork_exec events, ctypes
  cannot be imported, and RLIMIT_NPROC backs this up. Root ignores RLIMIT_NPROC, so as root the
  child runs through `setpriv` under a random uid/gid of its own (no groups, no-new-privs; keeping
  only CAP_DAC_READ_SEARCH if the interpreter is unreadable to other users, e.g. under /root).
- Files: writing (open for writing, os.remove/rename/mkdir/chmod/..., shutil.rmtree) only inside the
  temporary directory, judged on lexically normalised paths (sound because chdir, symlink and link
  are refused and no outside directory can be opened, so any dir_fd points inside); reading only
  there and in the standard library (not /proc, the project, the parent's files); native modules
  only from the standard library; no mkfifo/mknod. A dropped uid also meets the kernel's checks.
- Introspection that could reach a harness's secrets (sys._getframe, frames of tracebacks and
  generators, gc.get_objects/referrers/referents, settrace/setprofile) raises AttributeError, and
  Python signal handlers (they receive frames) cannot be installed: `traceback.format_exc()`,
  `inspect.stack()`, `signal.signal` and asyncio's loop (a socketpair) do not work in the sandbox.
  An audit hook is not a security boundary on its own; the kernel-level barriers contain native code.
A blocked action ends the child at once (exit 86, status "blocked", `blocked` says what). A failure
of the sandbox itself (the interpreter cannot start) raises `SandboxError`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

SANDBOX_STATUSES = ("ok", "error", "timeout", "memory", "killed", "blocked")
BLOCKED_EXIT = 86
FILE_LIMIT_BYTES = 8 * 2**20
WRITE_OPENS = 32  # with FILE_LIMIT_BYTES, bounds the disk a run can fill
MAX_OPEN_FILES = 64
MAX_TASKS = 8  # processes + threads of the sandbox uid (threads count against RLIMIT_NPROC)
_WORKDIR_PREFIX = "marl_sbx_"

_BOOTSTRAP = r'''
def _sandbox(argv):
    import _signal, os, posix, resource, sys
    import types  # its import reads a traceback's frame, which the hook refuses afterwards
    root, tag = argv[1], argv[2].encode()
    cpu, memory, fsize, nofile, nproc, write_opens = (int(value) for value in argv[3:9])
    for limit, soft, hard in ((resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_CPU, cpu, cpu + 1),
                              (resource.RLIMIT_AS, memory, memory), (resource.RLIMIT_FSIZE, fsize, fsize),
                              (resource.RLIMIT_NOFILE, nofile, nofile), (resource.RLIMIT_NPROC, nproc, nproc)):
        if soft >= 0:
            old = resource.getrlimit(limit)[1]
            cap = hard if old == resource.RLIM_INFINITY else min(hard, old)
            resource.setrlimit(limit, (min(soft, cap), cap))
    with open("main.py", "rb") as handle:
        source = handle.read()
    os.remove("main.py")
    code = compile(source, "main.py", "exec")
    readable = tuple(p.rstrip("/") + "/" for p in sys.path if p.startswith("/")) + ("/usr/share/zoneinfo/",)
    files = ("/dev/null", "/dev/urandom", "/dev/zero")
    kill_exact = ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
                  "os.startfile", "os.kill", "os.killpg", "subprocess.Popen", "pty.spawn", "os.link",
                  "os.symlink", "os.chdir", "signal.pthread_kill", "_posixsubprocess.fork_exec",
                  "os.add_dll_directory", "webbrowser.open")
    kill_prefix = ("socket.", "ctypes.", "syslog.", "winreg.", "_winapi.")
    soft = ("sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
            "gc.get_objects", "gc.get_referrers", "gc.get_referents")
    frame_attrs = ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back")
    no_import = ("ctypes", "_ctypes", "_posixsubprocess", "posix", "_xxsubinterpreters", "_testcapi",
                 "_testinternalcapi", "_tracemalloc")
    no_import_packages = tuple(name + "." for name in no_import)
    # event -> indices of its path arguments. A dir_fd can only name a directory inside the sandbox
    # (opening any other directory is refused), so checking the path lexically from the root is sound.
    path_events = {"os.mkdir": (0,), "os.rmdir": (0,), "os.remove": (0,), "os.rename": (0, 1), "os.chmod": (0,),
                   "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,), "os.setxattr": (0,),
                   "os.removexattr": (0,), "os.chflags": (0,), "os.lchflags": (0,), "shutil.rmtree": (0,)}
    list_events = {"os.listdir": 0, "os.scandir": 0, "os.walk": 0, "os.fwalk": 0}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    _type, _issub, _int, _str, _bytes, _list, _none = type, issubclass, int, str, bytes, list, None
    _decode, _concat, _base = bytes.decode, str.__add__, BaseException
    _write, _exit, _stat, _audit, real_signal = os.write, os._exit, os.stat, sys.audit, _signal.signal
    inside, budget = (root + "/",), [write_opens]

    def text(path):
        kind = _type(path)
        if _issub(kind, _int):
            return _none
        if _issub(kind, _bytes):
            return _decode(path, "utf-8", "surrogateescape")
        if _issub(kind, _str):
            return _concat("", path)
        raise TypeError("unsupported path type")

    def norm(path):
        if not path.startswith("/"):
            path = root + "/" + path
        parts = []
        for segment in path.split("/"):
            if segment == "..":
                if parts:
                    parts.pop()
            elif segment and segment != ".":
                parts.append(segment)
        return "/" + "/".join(parts) + "/"

    def spend():
        budget[0] -= 1
        return budget[0] >= 0

    def isdir(path):
        try:
            return (_stat(path).st_mode & 0o170000) == 0o040000
        except _base:
            return False

    def check_open(args):
        path = text(args[0])
        if path is _none:
            return _none
        path = norm(path)
        mode, flags = args[1], args[2]
        writing = (_type(flags) is _int and flags & write_flags) or (
            _type(mode) is _str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
        if writing and path == "/dev/null/" or writing and path.startswith(inside) and spend():
            return _none
        if writing:
            return ("kill", ("write to " + path[:-1]) if budget[0] >= 0 else "too many files opened for writing")
        if path.startswith(inside) or path[:-1] in files or path.startswith(readable) and not isdir(path[:-1]):
            return _none
        return ("kill", "read of " + path[:-1])

    def check(event, args):
        if event in kill_exact or event.startswith(kill_prefix):
            return ("kill", event)
        if event == "open":
            return check_open(args)
        if event == "sandbox.signal":
            return set_signal(args)
        if event in path_events:
            for index in path_events[event]:
                path = text(args[index])
                if path is not _none and not norm(path).startswith(inside):
                    return ("kill", event + " on " + norm(path)[:-1])
            return _none if event != "os.mkdir" or spend() else ("kill", "too many directories")
        if event in list_events:
            path = text(args[0] if args[0] is not _none else ".")
            ok = path is _none or norm(path).startswith(inside + readable)
            return _none if ok else ("kill", event + " of " + norm(path)[:-1])
        if event in soft or (event == "object.__getattr__" and args[1] in frame_attrs):
            return ("soft", event)
        if event == "import":
            name = text(args[0])
            if name in no_import or name.startswith(no_import_packages):
                return ("import", name)
            if args[1] is not _none and not norm(text(args[1])).startswith(readable):
                return ("kill", "loading native module " + text(args[1]))
        return _none

    def set_signal(args):
        signalnum, handler, box = args
        if _type(handler) is not _int or _type(box) is not _list:
            return ("kill", "installing a Python signal handler")
        box.append(real_signal(signalnum, handler))
        return _none

    def hook(event, args):
        try:
            verdict = check(event, args)
        except _base:
            verdict = ("kill", "unsupported arguments to " + event)
        if verdict is _none:
            return
        kind, what = verdict
        if kind == "soft":
            raise AttributeError("sandbox: " + what + " is not available")
        if kind == "import":
            raise ImportError("sandbox: module " + what + " is not available")
        try:
            _write(2, b"\n[sandbox " + tag + b"] blocked: " + what.encode("utf-8", "replace") + b"\n")
        finally:
            _exit(86)

    import _posixsubprocess  # keep `import subprocess` working; its fork_exec now only reports a block

    def fork_exec(*args, **kwargs):
        _audit("_posixsubprocess.fork_exec")

    _posixsubprocess.fork_exec = fork_exec
    for module, name in ((os, "mkfifo"), (posix, "mkfifo"), (os, "mknod"), (posix, "mknod")):
        if hasattr(module, name):
            delattr(module, name)

    def signal(signalnum, handler):  # Python handlers receive frames: only SIG_DFL/SIG_IGN (ints) pass
        box = []
        _audit("sandbox.signal", signalnum, handler, box)
        return box[0] if box else _none

    _signal.signal = signal
    sys.addaudithook(hook)
    main = type(sys)("__main__")
    main.__file__ = root + "/main.py"
    sys.modules["__main__"] = main
    sys.argv[:] = ["main.py"]
    del source, argv
    exec(code, main.__dict__)  # from inside this frame, so that no module global holds the code object

_sandbox(__import__("sys").argv)
'''


class SandboxError(RuntimeError):
    """The sandbox itself failed (the interpreter could not be started): not the candidate's fault."""


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did. status: ok (exit 0), error (non-zero exit), timeout (wall or CPU
    limit), memory (MemoryError), killed (another signal), blocked (a refused action, named by
    `blocked`). stdout/stderr: decoded, capped (`truncated`: output was discarded). seconds: wall time."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    truncated: bool
    seconds: float
    blocked: str = ""


@dataclass(frozen=True)
class Isolation:
    """How children are launched on this machine (found once by `isolation()`)."""

    network_namespace: bool
    drop_privileges: str  # "uid", "uid+read" (keeps CAP_DAC_READ_SEARCH), or "" (runs as the current user)

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
            _ISOLATION = Isolation(netns, drop)
        return _ISOLATION


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
    """Reads both pipes without blocking, keeping at most `limit` bytes of each."""

    def __init__(self, proc: subprocess.Popen, limit: int):
        self.limit, self.truncated = limit, False
        self.data = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        self.selector = selectors.DefaultSelector()
        for stream in (proc.stdout, proc.stderr):
            self.selector.register(stream, selectors.EVENT_READ)

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
            buffer = self.data[key.fd]
            room = self.limit - len(buffer)
            self.truncated |= len(chunk) > room
            buffer += chunk[:max(room, 0)]


def _exited(pid: int) -> bool:
    """True when the child has exited (it is not reaped yet, so its pid and group stay reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _supervise(proc: subprocess.Popen, capture: _Capture, timeout_s: float, uid: int | None):
    """Drain output until the child exits or the deadline passes; returns (timed_out, rusage)."""
    deadline = time.monotonic() + timeout_s
    timed_out, exited_at, give_up = False, None, None
    while True:
        now = time.monotonic()
        if not timed_out and now >= deadline:
            timed_out, give_up = True, now + 5.0
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


def _classify(returncode: int | None, timed_out: bool, cpu_used: float, cpu_s: float, stderr: str,
              tag: str) -> tuple[str, str]:
    marker = f"[sandbox {tag}] blocked: "
    if marker in stderr:
        return "blocked", stderr.rsplit(marker, 1)[1].split("\n", 1)[0]
    if timed_out or returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and cpu_used >= cpu_s - 0.05):
        return "timeout", ""
    last = stderr.strip().rsplit("\n", 1)[-1]
    if last.startswith("MemoryError") or "Cannot allocate memory" in last or "out of memory" in last.lower():
        return "memory", ""
    if returncode is None or returncode < 0:
        return "killed", ""
    return ("ok" if returncode == 0 else "error"), ""


def run_python(code: str, *, stdin: str = "", timeout_s: float = 5.0, cpu_s: float = 5.0, memory_mb: int = 512,
               output_limit: int = 64_000, files: dict[str, str] | None = None) -> SandboxResult:
    """Run `code` in a contained interpreter (see the module docstring for the barriers).

    stdin: text fed to the program. timeout_s: wall-clock limit. cpu_s: CPU-time limit (whole seconds,
    rounded up). memory_mb: address-space limit. output_limit: bytes kept of stdout and of stderr each.
    files: extra text files (relative name -> content) placed in the working directory.
    Never raises for anything the code does; raises ValueError for bad arguments and SandboxError
    when the interpreter cannot be started.
    """
    _check_arguments(code, timeout_s, cpu_s, memory_mb, output_limit)
    setup, root = isolation(), os.geteuid() == 0
    uid = _pick_uid() if setup.drop_privileges else None
    nproc = MAX_TASKS if uid is not None else (-1 if root else sum(_processes_of(os.getuid()).values()) + MAX_TASKS)
    tag = secrets.token_hex(8)
    workdir = os.path.realpath(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
    started, proc, capture = time.monotonic(), None, None
    try:
        _write_files(workdir, code, files, -1 if uid is None else uid)
        limits = [int(-(-cpu_s // 1)), memory_mb * 2**20, FILE_LIMIT_BYTES, MAX_OPEN_FILES, nproc, WRITE_OPENS]
        argv = setup.prefix(uid if uid is not None else 0) + [sys.executable, "-I", "-S", "-B", "-c", _BOOTSTRAP,
                                                              workdir, tag] + [str(v) for v in limits]
        proc = _launch(argv, workdir, stdin)
        capture = _Capture(proc, output_limit)
        timed_out, usage = _supervise(proc, capture, timeout_s, uid)
        cpu_used = (usage.ru_utime + usage.ru_stime) if usage is not None else 0.0
        stdout, stderr = (bytes(capture.data[stream.fileno()]).decode("utf-8", "replace")
                          for stream in (proc.stdout, proc.stderr))
        status, blocked = _classify(proc.returncode, timed_out, cpu_used, cpu_s, stderr, tag)
        return SandboxResult(status, proc.returncode, stdout, stderr, capture.truncated,
                             time.monotonic() - started, blocked)
    finally:
        _cleanup(proc, capture, uid, workdir)


def _check_arguments(code: str, timeout_s: float, cpu_s: float, memory_mb: int, output_limit: int) -> None:
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    for label, value, least in (("timeout_s", timeout_s, 0), ("cpu_s", cpu_s, 0), ("memory_mb", memory_mb, 64),
                                ("output_limit", output_limit, 1)):
        if not isinstance(value, (int, float)) or value < least or value <= 0:
            raise ValueError(f"{label} must be a number >= {least} (and > 0), got {value!r}")


def _launch(argv: list[str], workdir: str, stdin: str) -> subprocess.Popen:
    with tempfile.TemporaryFile() as stdin_file:  # a file, not a pipe: any size without a writer thread
        stdin_file.write(stdin.encode("utf-8"))
        stdin_file.seek(0)
        try:
            return subprocess.Popen(argv, cwd=workdir, env=_child_env(workdir), stdin=stdin_file,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
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
    shutil.rmtree(workdir, ignore_errors=True)
    if os.path.exists(workdir):  # not root: the code may have removed permissions inside its directory
        for folder, dirs, _ in os.walk(workdir):
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(folder, name), 0o700)
        shutil.rmtree(workdir, ignore_errors=True)
