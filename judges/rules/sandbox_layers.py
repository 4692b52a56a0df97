"""The sandbox's kernel layers, prepared in the parent: the seccomp-bpf program and the Landlock paths.

The child (judges.rules.sandbox_child) installs both before the candidate's first line. This module only
compiles and describes them; it never restricts the calling process. libseccomp (through pyseccomp)
compiles the filter once per process; the child receives the raw BPF program, so it needs neither
libseccomp nor a library search (ctypes.util.find_library would start a subprocess).
"""

from __future__ import annotations

import errno
import functools
import os
import sys
import sysconfig
import tempfile

# System calls that end the process (SIGSYS). A deny list: the interpreter needs hundreds of harmless
# calls; files are Landlock's job, so what is listed here is what Landlock cannot see.
KILLED_SYSCALLS = (
    # processes and programs
    "fork", "vfork", "execve", "execveat",
    # network and local sockets (also through io_uring, which bypasses seccomp)
    "socket", "socketpair", "io_uring_setup", "io_uring_enter", "io_uring_register",
    # signals, tracing and other processes' memory
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    # namespaces, mounts, root changes
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsmount", "fsconfig", "fspick", "mount_setattr",
    # the kernel itself: modules, BPF, perf, keys, time, host, swap, reboot, accounting
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "bpf", "perf_event_open",
    "userfaultfd", "keyctl", "add_key", "request_key", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "sethostname", "setdomainname", "swapon", "swapoff", "reboot", "acct", "quotactl",
    "syslog", "iopl", "ioperm", "vhangup", "personality", "lookup_dcookie",
    # file handles bypass path checks (open_by_handle_at is the classic container escape); devices
    "open_by_handle_at", "name_to_handle_at", "mknod", "mknodat", "memfd_create", "memfd_secret",
    # System V IPC outlives the process (memory beyond RLIMIT_AS, a channel between runs); POSIX
    # message queues; file-system watches (what the trainer reads, and when)
    "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr", "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
    # reserving disk without writing it (instant, unlike write(), which the parent's watch can outpace)
    "fallocate",
    # identities
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups",
    "capset",
)
CLONE_THREAD = 0x00010000
# clone() makes a thread (allowed) only with CLONE_THREAD and without a new namespace.
CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000,
                    0x00000080)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
TIOCSTI, TIOCLINUX = 0x5412, 0x541C  # ioctls that type into a terminal
LAYER_NAMES = ("landlock", "seccomp")  # the layers a run requires (installed by the child itself)
# What a run's `layers` may name, each confirmed by the child from inside: the two above, its network
# and PID namespaces, its resource limits and its own uid. The audit hook is not among them (a diagnostic).
REPORTED_LAYERS = LAYER_NAMES + ("netns", "pidns", "rlimits", "uid")
# The extension modules (lib-dynload files) that Landlock lets the child read once it is locked down.
# Computation, data formats and codecs, none giving a capability that plain Python lacks; and the few
# whose every effect the kernel layers refuse anyway (a socket, a fork, a terminal ioctl: seccomp),
# kept so that `import socket`, `subprocess` or `pty` still loads and the attempt is reported as
# blocked. Everything else there stays unreadable, so it cannot be loaded under any name: the
# subinterpreter modules (a fresh interpreter runs without the audit hook), ctypes, _testcapi and
# _testinternalcapi (raw memory), the other test modules, shared memory, curses, readline, audio.
# What the bootstrap itself imported before the lock-down (ctypes, resource, fcntl, _json) stays
# loaded: this list does not make that unreachable, the kernel layers are what hold against it.
EXTENSION_MODULES = frozenset((
    "math", "cmath", "array", "_bisect", "_heapq", "_random", "_datetime", "_struct", "_pickle", "_csv",
    "_elementtree", "pyexpat", "binascii", "unicodedata", "zlib", "_bz2", "_lzma", "_statistics", "_md5", "_sha1",
    "_sha256", "_sha512", "_sha3", "_blake2", "_hashlib", "_json", "_decimal", "_contextvars", "_asyncio", "_queue",
    "_typing", "_uuid", "_zoneinfo", "_opcode", "_multibytecodec", "_codecs_cn", "_codecs_hk", "_codecs_iso2022",
    "_codecs_jp", "_codecs_kr", "_codecs_tw", "_sqlite3", "mmap", "select", "grp", "pwd",
    # their effects are system calls that seccomp, Landlock or the network namespace refuse
    "_socket", "_posixsubprocess", "termios", "fcntl", "resource",
))


@functools.lru_cache(maxsize=1)
def seccomp_program() -> tuple[bytes | None, str]:
    """(the compiled BPF program, "") or (None, why it is unavailable). Cached per process."""
    try:
        import pyseccomp as seccomp  # lazy: libseccomp may be missing; the reason is returned, not raised
    except (ImportError, OSError, AttributeError, TypeError) as error:  # no libseccomp.so on this machine
        return None, f"pyseccomp/libseccomp cannot be loaded ({type(error).__name__}: {error})"
    try:
        rules = seccomp.SyscallFilter(seccomp.ALLOW)
        for name in KILLED_SYSCALLS:
            _kill_if_known(seccomp, rules, name)
        rules.add_rule(seccomp.KILL_PROCESS, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_THREAD, 0))
        for flag in CLONE_NAMESPACES:
            rules.add_rule(seccomp.KILL_PROCESS, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        # clone3 passes its flags in memory, which a filter cannot read: ENOSYS makes glibc use clone().
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        for request in (TIOCSTI, TIOCLINUX):
            rules.add_rule(seccomp.KILL_PROCESS, "ioctl", seccomp.Arg(1, seccomp.EQ, request))
        with tempfile.TemporaryFile() as handle:
            rules.export_bpf(handle)
            handle.seek(0)
            program = handle.read()
    except (OSError, RuntimeError, ValueError) as error:
        return None, f"libseccomp could not compile the filter ({type(error).__name__}: {error})"
    return (program, "") if program and len(program) % 8 == 0 else (None, "libseccomp exported an empty filter")


def _kill_if_known(seccomp, rules, name: str) -> None:
    try:
        rules.add_rule(seccomp.KILL_PROCESS, name)
    except (OSError, ValueError, RuntimeError):
        if _syscall_number(seccomp, name) is not None:  # known on this arch, yet refused: a real error
            raise


def _syscall_number(seccomp, name: str) -> int | None:
    try:
        number = seccomp.resolve_syscall(seccomp.system_arch(), name)
    except (OSError, ValueError, RuntimeError):
        return None
    return number if isinstance(number, int) and number >= 0 else None


@functools.lru_cache(maxsize=1)
def landlock_support() -> tuple[int, str]:
    """(Landlock ABI version, "") or (0, why it is unavailable)."""
    if not sys.platform.startswith("linux"):
        return 0, "Landlock is a Linux security module"
    try:
        import landlock  # lazy: the package may be missing; the reason is returned, not raised
        return int(landlock.landlock_abi_version()), ""
    except ImportError as error:
        return 0, f"the landlock package is not installed ({error})"
    except OSError as error:
        return 0, f"the kernel refuses Landlock ({error.strerror or error}): Linux 5.13+ with landlock in CONFIG_LSM"


def landlock_masks(abi: int) -> dict[str, int]:
    """The rights the child's ruleset handles and grants, from the `landlock` package's definitions."""
    from landlock import FSAccess as access  # lazy: called only once landlock_support() found the package
    handled = int(access.all())
    file_rights = int(access.all_file())
    forbidden_inside = access.EXECUTE | access.MAKE_CHAR | access.MAKE_BLOCK | access.MAKE_FIFO | access.MAKE_SOCK \
        | access.MAKE_SYM
    return {"abi": abi, "handled": handled, "file_rights": file_rights, "inside": handled & ~int(forbidden_inside),
            "read_tree": int(access.READ_FILE | access.READ_DIR), "read_file": int(access.READ_FILE),
            "write_file": int(access.WRITE_FILE), "list_dir": int(access.READ_DIR)}


@functools.lru_cache(maxsize=1)
def library_paths() -> tuple[str, ...]:
    """Where the shared libraries of native standard modules live (read, never listed), and devices."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    # Only the directories of shared libraries, not all of /usr/lib (whose python3/dist-packages, and
    # files such as os-release, are none of the code's business).
    paths = [f"/usr/lib/{multiarch}", f"/lib/{multiarch}", "/lib64", "/usr/lib64", "/usr/local/lib",
             os.path.join(sys.base_prefix, "lib"), "/etc/ld.so.cache", "/usr/share/zoneinfo", "/dev/urandom",
             "/dev/zero"]
    found = dict.fromkeys(os.path.realpath(p) for p in paths if os.path.exists(p))
    return tuple(dict.fromkeys(entry for path in found for entry in _without_python_trees(path)))


def _without_python_trees(path: str) -> list[str]:
    """`path`, or its entries but the python* ones when it holds an interpreter's tree: the library
    folder of a prefix (pyenv's, /usr/local/lib) also holds python3.X/site-packages and lib-dynload,
    whose every extension module would otherwise be readable, and so loadable, past EXTENSION_MODULES."""
    try:
        names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    except OSError:
        return [path]
    if not any(name.startswith("python") and os.path.isdir(os.path.join(path, name)) for name in names):
        return [path]
    return [os.path.join(path, name) for name in names
            if not (name.startswith("python") and os.path.isdir(os.path.join(path, name)))]


def child_layer_config(require: tuple[str, ...]) -> tuple[dict, dict[str, str]]:
    """The child's kernel-layer settings and {layer: why it is unavailable here}."""
    program, seccomp_why = seccomp_program()
    abi, landlock_why = landlock_support()
    config = {"require": list(require), "seccomp_bpf": program.hex() if program else "",
              "landlock": landlock_masks(abi) if abi else None, "read_files": list(library_paths()),
              "extensions": sorted(EXTENSION_MODULES)}
    unavailable = {name: why for name, why in (("landlock", landlock_why), ("seccomp", seccomp_why)) if why}
    return config, unavailable
