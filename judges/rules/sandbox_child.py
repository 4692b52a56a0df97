"""The first code of a sandboxed interpreter: `python -I -S -B -c <this file's text> CONFIG`.

judges.rules.sandbox launches it; nothing here runs in the trainer's process (importing this module only
defines the constants below, which the parent shares to read the child's reports). In order:

1. Reports which interpreter this is (path, full version, prefix), and stops when its major.minor
   is not the parent's (MISMATCH_EXIT), before any candidate code is read.
2. Resource limits (CPU, address space, file size, open files, processes; no core dumps).
3. Reads and deletes main.py (so the candidate never sees its own source file).
4. Kernel layers, which no code in the process can lift afterwards, native code included:
   - Landlock (file system): reading only the standard library (of its extension modules only
     sandbox_layers.EXTENSION_MODULES), the shared libraries it loads and a few devices; reading and
     writing only inside the run's temporary directory; no executing, no devices, fifos, sockets or
     symlinks made. Where the kernel supports it (ABI 4, 6), the same ruleset refuses every TCP
     bind/connect and signals or abstract unix sockets outside the sandbox.
   - seccomp-bpf (system calls): a filter the parent compiled with libseccomp; process creation
     (fork, vfork, clone without CLONE_THREAD, execve), sockets, signals, tracing, namespaces,
     mounts, io_uring, BPF, kernel keys and file handles end the process (SIGSYS).
   A layer the parent requires and the kernel refuses ends the run before the candidate's first line.
5. Compiles the source (the parser meets the candidate's bytes under the kernel layers).
6. The audit hook (a diagnostic, not a layer: CPython's hooks are no security boundary, and a
   subinterpreter or native code runs without them) with precise messages, and the frame lock-down.
7. Runs the candidate's code as __main__.

Reports go to the control pipe (fd CONTROL_FD), one line each, the first three before the code runs:
`interpreter <json>`, then `layers <names>` (the kernel-enforced ones, each confirmed from inside:
landlock, seccomp, netns, pidns, rlimits, uid) or `unconfined <layer>: <why>` when a required layer failed,
then `diagnostics <names>` ("audit" when the hook is on); later `blocked <reason>` when the hook
refuses an action. The parent accepts only reasons from BLOCK_REASONS, so a candidate that writes to
the pipe can make its own run fail, never put words of its choosing in a report.
"""

CHANNEL_FD = 3  # result channel for harnesses (a pipe; whatever is written there is the run's `channel`)
CONTROL_FD = 4  # the bootstrap's reports to the parent
BLOCKED_EXIT = 86
UNCONFINED_EXIT = 87
MISMATCH_EXIT = 88  # this interpreter's major.minor is not the parent's: nothing of the candidate's ran
KILL_EXACT = ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "os.startfile",
              "os.kill", "os.killpg", "subprocess.Popen", "pty.spawn", "os.link", "os.symlink", "os.chdir",
              "signal.pthread_kill", "_posixsubprocess.fork_exec", "os.add_dll_directory", "webbrowser.open",
              # a loaded extension is native code of the candidate's own: no Python-level check past it
              "sqlite3.enable_load_extension", "sqlite3.load_extension")
KILL_PREFIX = ("socket.", "ctypes.", "syslog.", "winreg.", "_winapi.")
# event -> indices of its path arguments (checked to lie inside the run's directory).
PATH_EVENTS = {"os.mkdir": (0,), "os.rmdir": (0,), "os.remove": (0,), "os.rename": (0, 1), "os.chmod": (0,),
               "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,), "os.setxattr": (0,),
               "os.removexattr": (0,), "os.chflags": (0,), "os.lchflags": (0,), "shutil.rmtree": (0,)}
LIST_EVENTS = ("os.listdir", "os.scandir", "os.walk", "os.fwalk")
OUTSIDE = " outside the working directory"
BLOCK_REASONS = frozenset(
    KILL_EXACT + tuple(prefix.rstrip(".") for prefix in KILL_PREFIX)
    + tuple(event + OUTSIDE for event in tuple(PATH_EVENTS) + LIST_EVENTS)
    + ("write" + OUTSIDE, "read outside the working directory and the standard library",
       "too many files opened for writing", "too many directories", "installing a Python signal handler",
       "loading a native module from outside the standard library", "unsupported arguments to an audited call"))


def _sandbox(argv):
    # lazy: this text is the child's first code; no module global may hold a module the candidate could reach
    import _signal, json, os, posix, resource, sys
    import types  # its import reads a traceback's frame, which the hook refuses afterwards
    config = json.loads(argv[1])
    root, limits = config["root"], config["limits"]
    _bind_pipes(os, config)
    control = CONTROL_FD

    def report(line):
        try:
            os.write(control, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    report("interpreter " + json.dumps(_interpreter(sys, os)))
    if list(sys.version_info[:2]) != config["python"]:  # the parent refuses the run with one line
        os._exit(MISMATCH_EXIT)
    _set_limits(resource, limits)
    launched = _launch_layers(config, limits, resource, os)  # confirmed before Landlock hides /proc
    with open("main.py", "rb") as handle:
        source = handle.read()
    os.remove("main.py")
    _lock_down(config, root, launched, report, sys, os)
    # The parser is the first code to handle the candidate's bytes: it runs under the kernel layers,
    # and a program that does not compile still reports them.
    code = compile(source, "main.py", "exec")
    if config["audit_hook"]:
        _install_audit_hook(root, limits["write_opens"], report, _signal, os, posix, sys)
    main = type(sys)("__main__")
    main.__file__ = root + "/main.py"
    sys.modules["__main__"] = main
    sys.argv[:] = ["main.py"]
    del source, argv, config
    exec(code, main.__dict__)  # from inside this frame, so that no module global holds the code object


def _lock_down(config, root, launched, report, sys, os):
    """Installs the kernel layers and reports them with those the launch gave (`launched`), then the
    diagnostics; or ends the run (UNCONFINED_EXIT) when a layer the parent requires failed."""
    before = set(sys.modules)
    layers, failures = _kernel_layers(config, root, sys, os)
    for name in set(sys.modules) - before:  # ctypes and landlock: the candidate may not reuse them
        del sys.modules[name]
    missing = [layer for layer in config["require"] if layer not in layers]
    if missing:
        report("unconfined " + "; ".join(f"{layer}: {failures.get(layer, 'not available')}" for layer in missing))
        os._exit(UNCONFINED_EXIT)
    report("layers " + ",".join(layers + launched))
    report("diagnostics " + ("audit" if config["audit_hook"] else ""))


def _bind_pipes(os, config):
    """Moves the parent's pipes to their fixed numbers (via copies above 10, so none overwrites another)."""
    import fcntl  # lazy: child only (see _sandbox)
    high = {name: fcntl.fcntl(config[name], fcntl.F_DUPFD_CLOEXEC, 10)
            for name in ("control_fd", "channel_fd") if config.get(name) is not None}
    for name in high:
        os.close(config[name])
    for name, number in (("channel_fd", CHANNEL_FD), ("control_fd", CONTROL_FD)):
        if name in high:
            os.dup2(high[name], number, inheritable=False)
            os.close(high[name])


def _interpreter(sys, os):
    """Which interpreter runs this: the file the kernel executed (the venv's link may lead elsewhere, and
    a binary whose own library path is unreadable loads the system's libpython), its full version and
    the prefix whose standard library it imports."""
    try:
        executable = os.readlink("/proc/self/exe")
    except OSError:
        executable = sys.executable
    return {"executable": executable, "version": sys.version.split()[0], "prefix": sys.prefix}


def _launch_layers(config, limits, resource, os):
    """The layers the launch gave this process, each checked from inside: a network and a PID
    namespace other than the parent's (in the latter, this process is pid 1 and its parent is
    outside, pid 0), every resource limit in place, a uid that is neither root nor the parent's."""
    found = []
    for kind, extra in (("net", True), ("pid", os.getpid() == 1 and os.getppid() == 0)):
        try:  # the parent sends -1 when it could not read its own (then no namespace is claimed)
            host = config["host_" + kind + "ns"]
            if host >= 0 and extra and os.stat("/proc/self/ns/" + kind).st_ino != host:
                found.append(kind + "ns")
        except OSError:
            pass
    checks = [(resource.RLIMIT_CPU, limits["cpu"] + 1), (resource.RLIMIT_AS, limits["memory"]),
              (resource.RLIMIT_FSIZE, limits["fsize"]), (resource.RLIMIT_NOFILE, limits["nofile"])]
    checks += [(resource.RLIMIT_NPROC, limits["nproc"])] if limits["nproc"] >= 0 else []
    if all(0 <= resource.getrlimit(limit)[1] <= cap for limit, cap in checks):  # RLIM_INFINITY is -1
        found.append("rlimits")
    ids = os.getresuid() + os.getresgid()
    if 0 not in ids and config["host_uid"] not in ids[:3]:
        found.append("uid")
    return found


def _set_limits(resource, limits):
    # CPU: SIGXCPU at the soft limit; the kernel's SIGKILL a second later, at the hard one, is what
    # ends a PID namespace's init (this process, with one), which ignores default-action signals. The
    # parent tells that SIGKILL apart by the CPU time spent, which the second's margin keeps clear of
    # the tick sampling the kernel's limit uses.
    for limit, soft, hard in ((resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_CPU, limits["cpu"], limits["cpu"] + 1),
                              (resource.RLIMIT_AS, limits["memory"], limits["memory"]),
                              (resource.RLIMIT_FSIZE, limits["fsize"], limits["fsize"]),
                              (resource.RLIMIT_NOFILE, limits["nofile"], limits["nofile"]),
                              (resource.RLIMIT_NPROC, limits["nproc"], limits["nproc"])):
        if soft >= 0:
            old = resource.getrlimit(limit)[1]
            cap = hard if old == resource.RLIM_INFINITY else min(hard, old)
            resource.setrlimit(limit, (min(soft, cap), cap))


def _kernel_layers(config, root, sys, os):
    """Applies Landlock, then seccomp; returns (names applied, {name: why it failed})."""
    layers, failures = [], {}
    try:
        import ctypes  # lazy: child only (see _sandbox), inside the try that reports its absence
        libc = ctypes.CDLL(None, use_errno=True)
    except Exception as error:  # no ctypes: neither layer can be installed
        return layers, {"landlock": repr(error), "seccomp": repr(error)}
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required by both, and harmless
        failures["no_new_privs"] = os.strerror(ctypes.get_errno())
    if config.get("landlock"):
        try:
            _landlock(config, root, sys, os, ctypes, libc)
            layers.append("landlock")
        except Exception as error:
            failures["landlock"] = f"{type(error).__name__}: {error}"
    if config.get("seccomp_bpf"):
        try:
            _seccomp(bytes.fromhex(config["seccomp_bpf"]), ctypes, libc, os)
            layers.append("seccomp")
        except Exception as error:
            failures["seccomp"] = f"{type(error).__name__}: {error}"
    return layers, failures


def _landlock(config, root, sys, os, ctypes, libc):
    """A ruleset handling every file-system right (masks computed by the parent with the `landlock`
    package): all refused except the rules below. Paths this uid cannot open are skipped: the kernel's
    own permission checks already keep it out of them."""
    masks = config["landlock"]

    class Attr(ctypes.Structure):  # ABI 4 adds TCP bind/connect, ABI 6 signal and abstract-socket scopes
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class Beneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    libc.syscall.restype = ctypes.c_long
    abi = masks["abi"]
    # One ruleset for all three: a second one handling no file rights would still refuse every rename
    # across directories (REFER is always handled), even inside the run's own directory.
    attr = Attr(masks["handled"], 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(ctypes.c_long(444), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset: " + os.strerror(ctypes.get_errno()))
    try:
        for path, mask in _landlock_rules(config, root, sys, os, masks):
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rule = Beneath(mask if os.path.isdir(path) else mask & masks["file_rights"], fd)
                if libc.syscall(ctypes.c_long(445), ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule),
                                ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}): " + os.strerror(ctypes.get_errno()))
            finally:
                os.close(fd)
        if libc.syscall(ctypes.c_long(446), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self: " + os.strerror(ctypes.get_errno()))
    finally:
        os.close(ruleset)


def _landlock_rules(config, root, sys, os, masks):
    """(path, rights): the run's directory; this interpreter's standard library (entry by entry, so that
    its site-packages stays out, and of lib-dynload only the extension modules in config["extensions"]:
    a file Landlock refuses to read cannot be loaded under any name); the shared libraries native
    modules load; /dev/null."""
    yield root, masks["inside"]
    entries = [entry for entry in sys.path if entry.startswith("/")]
    extensions = frozenset(config["extensions"])
    for entry in entries:
        if os.path.isdir(entry):
            try:
                names = os.listdir(entry)
            except OSError:
                continue
            yield entry, masks["list_dir"]  # the import system lists it; names only, no file in it
            for name in names:
                path = os.path.join(entry, name)
                if name in ("site-packages", "dist-packages", "lib-dynload") or path in entries:
                    continue  # lib-dynload is an entry of its own, filtered file by file
                if name.endswith(".so") and name.split(".")[0] not in extensions:
                    continue
                yield path, masks["read_tree"]
        elif os.path.exists(entry):
            yield entry, masks["read_file"]
    for path in config["read_files"]:
        yield path, masks["read_file"]
    yield "/dev/null", masks["read_file"] | masks["write_file"]


def _seccomp(program, ctypes, libc, os):
    """Installs the parent's compiled BPF program (struct sock_fprog) with prctl(PR_SET_SECCOMP)."""

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = Fprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP): " + os.strerror(ctypes.get_errno()))


def _install_audit_hook(root, write_opens, report, _signal, os, posix, sys):
    """The Python-level diagnostic (not a security boundary: native code and subinterpreters never meet
    it): refuses audited actions with a precise reason, and hides frames.

    One function of closures on purpose: the hook may use only names bound here before the candidate
    runs, never module globals or builtins that the candidate could replace."""
    readable = tuple(p.rstrip("/") + "/" for p in sys.path if p.startswith("/")) + ("/usr/share/zoneinfo/",)
    files = ("/dev/null", "/dev/urandom", "/dev/zero")
    soft = ("sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
            "gc.get_objects", "gc.get_referrers", "gc.get_referents")
    frame_attrs = ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back")
    no_import = ("ctypes", "_ctypes", "_ctypes_test", "_posixsubprocess", "posix", "_xxsubinterpreters",
                 "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues", "_testcapi",
                 "_testinternalcapi", "_tracemalloc", "landlock")
    no_import_packages = tuple(name + "." for name in no_import)
    kill_exact, kill_prefix, path_events, list_events = KILL_EXACT, KILL_PREFIX, PATH_EVENTS, LIST_EVENTS
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    _type, _issub, _int, _str, _bytes, _list, _none = type, issubclass, int, str, bytes, list, None
    _decode, _concat, _base, _outside = bytes.decode, str.__add__, BaseException, OUTSIDE
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
            return ("kill", ("write" + _outside) if budget[0] >= 0 else "too many files opened for writing")
        if path.startswith(inside) or path[:-1] in files or path.startswith(readable) and not isdir(path[:-1]):
            return _none
        return ("kill", "read outside the working directory and the standard library")

    def check(event, args):
        if event in kill_exact:
            return ("kill", event)
        for prefix in kill_prefix:
            if event.startswith(prefix):
                return ("kill", prefix[:-1])
        if event == "open":
            return check_open(args)
        if event == "sandbox.signal":
            return set_signal(args)
        if event in path_events:
            for index in path_events[event]:
                path = text(args[index])
                if path is not _none and not norm(path).startswith(inside):
                    return ("kill", event + _outside)
            return _none if event != "os.mkdir" or spend() else ("kill", "too many directories")
        if event in list_events:
            path = text(args[0] if args[0] is not _none else ".")
            ok = path is _none or norm(path).startswith(inside + readable)
            return _none if ok else ("kill", event + _outside)
        if event in soft or (event == "object.__getattr__" and args[1] in frame_attrs):
            return ("soft", event)
        if event == "import":
            return check_import(text(args[0]), args[1])
        return _none

    def check_import(name, path):
        # an extension runs PyInit_<last part of its name> from whatever file: "x._ctypes" is _ctypes
        if name in no_import or name.startswith(no_import_packages) or name.rpartition(".")[2] in no_import:
            return ("import", name)
        if path is _none:
            return _none
        path = norm(text(path))
        if not path.startswith(readable):
            return ("kill", "loading a native module from outside the standard library")
        stem = path[:-1].rpartition("/")[2].partition(".")[0]
        return ("import", stem) if stem in no_import else _none

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
            verdict = ("kill", "unsupported arguments to an audited call")
        if verdict is _none:
            return
        kind, what = verdict
        if kind == "soft":
            raise AttributeError("sandbox: " + what + " is not available")
        if kind == "import":
            raise ImportError("sandbox: module " + what + " is not available")
        try:
            report("blocked " + what)
            _write(2, b"\n[sandbox] blocked: " + what.encode("utf-8", "replace") + b"\n")
        finally:
            _exit(BLOCKED_EXIT)

    # lazy: child only (see _sandbox). Keeps `import subprocess` working; its fork_exec now only reports a block
    import _posixsubprocess

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


if __name__ == "__main__":
    _sandbox(__import__("sys").argv)
