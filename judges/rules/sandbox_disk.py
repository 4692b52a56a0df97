"""How much a sandboxed run has written, measured from outside (judges/rules/sandbox.py stops a run past
the budget). This is the parent's watch, not a kernel layer: the kernel bounds each file (RLIMIT_FSIZE)
and the files open at once (RLIMIT_NOFILE), the watch bounds their sum. The audit hook's count of
files opened for writing is a diagnostic that native code or a subinterpreter never meets; this
budget holds for them too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import time

DISK_BUDGET_BYTES = 1 << 30  # bytes a run may hold on disk (its directory, and open files it unlinked)
DISK_ENTRIES = 20_000  # files and folders a run may make (empty files fill a file system's inodes)
DISK_CHECK_S = 0.1  # how often the run's directory is measured while it runs (at most)
DISK_CHECK_SPACING = 10  # and no sooner than this many times the last measure's duration (<= ~10% of a core)
DISK_CHECK_MAX_S = 1.0  # but at least this often, so a fast writer overshoots the budget by one second's writes


def processes_of(uid: int) -> dict[int, int]:
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


class DiskWatch:
    """Measures what the run itself has written: the blocks allocated under its own directory, the
    only place Landlock lets it write, and the files its processes hold open or memory-mapped that no
    directory shows (written then unlinked, O_TMPFILE, sqlite's temp files, a file mapped MAP_SHARED
    then closed and unlinked: `find` cannot see them, their blocks stay taken until closed or
    unmapped). Native code can make files without the audit hook's write budget, so a run past
    DISK_BUDGET_BYTES (or DISK_ENTRIES files and folders) is stopped. The file system's free space is
    not the measure: another process filling the same disk is not the run's doing."""

    def __init__(self, workdir: str, pgid: int | None = None, uid: int | None = None):
        self.workdir, self.pgid, self.uid = workdir, pgid, uid
        self.exceeded, self.next_at, self.cost = False, 0.0, 0.0

    def usage(self) -> tuple[int, int]:
        """(bytes allocated, entries): the run directory's (`find`) and its processes' unlinked open files."""
        size, entries = self._tree_usage()
        held, files = unlinked_open_files(run_pids(self.pgid, self.uid), self.workdir)
        return size + held, entries + files

    def _tree_usage(self) -> tuple[int, int]:
        """(bytes allocated, entries) under the run directory, by `find` (it walks trees thousands
        deep, which Python's walks cannot); a folder the run made unreadable is made readable again
        first (it is the parent's tree), and what still cannot be measured counts as over the budget."""
        for _ in range(2):
            try:
                found = subprocess.run([shutil.which("find") or "find", self.workdir, "-printf", "%b\\n"],
                                       capture_output=True, timeout=30)
            except (OSError, subprocess.SubprocessError) as error:  # run_python makes it a SandboxError
                raise OSError(f"cannot measure the run's disk use: {error}") from error
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


def run_pids(pgid: int | None, uid: int | None) -> set[int]:
    """The run's processes: those of its process group (the session it was started in), the children
    of the group's leader (with a PID namespace the leader is unshare, and the interpreter, not a group
    leader there, may leave the group with setsid), and those of its dedicated uid."""
    pids = set(processes_of(uid)) if uid is not None else set()
    for entry in filter(str.isdigit, os.listdir("/proc")) if pgid else ():
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp
            if int(fields[2]) == pgid or int(fields[1]) == pgid:
                pids.add(int(entry))
    return pids


def unlinked_open_files(pids: set[int], workdir: str | None = None) -> tuple[int, int]:
    """(bytes allocated, count) of the regular files that `pids` hold with no name left (nlink 0),
    open or memory-mapped, each counted once by (device, inode). Files with a name are under the run
    directory, measured there. The parent is root or the run's own user, so /proc/<pid>/fd and
    /proc/<pid>/maps are readable; a process gone meanwhile is skipped. Mapped files are looked for
    only when `workdir` is given (the only place the run can make one)."""
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
        if workdir is not None:
            for key, size in unlinked_mappings(pid, workdir).items():
                seen[key] = max(seen.get(key, 0), size)
    return sum(seen.values()), len(seen)


def unlinked_mappings(pid: int, workdir: str) -> dict[tuple[int, int], int]:
    """(device, inode) -> bytes of the files `pid` has memory-mapped and unlinked: written, mapped
    (MAP_SHARED keeps the file), closed and unlinked, such a file has neither a name nor a descriptor.
    Each "(deleted)" line of /proc/<pid>/maps whose file lay in the run's directory or its file system
    is one (so shared anonymous memory, "/dev/zero (deleted)", which RLIMIT_AS bounds, is not). Its
    size is the file's allocated blocks, stat'ed through /proc/<pid>/map_files (root only: the
    kernel asks for CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE); where that cannot be read, the end of
    its furthest mapping (offset + length), an upper bound of what the mappings reach."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as handle:
            lines = handle.read().decode("utf-8", "surrogateescape").splitlines()
        run_device = os.stat(workdir).st_dev
    except OSError:
        return {}
    inside, found = workdir.rstrip("/") + "/", {}
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].endswith(" (deleted)") or fields[4] == "0":
            continue
        span, offset, (major, minor) = fields[0], int(fields[2], 16), fields[3].split(":")
        key = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
        if not fields[5].startswith(inside) and key[0] != run_device:
            continue
        start, end = (int(part, 16) for part in span.split("-"))
        size = _mapped_file_blocks(pid, span, key)
        if size != 0:
            found[key] = max(found.get(key, 0), offset + end - start if size is None else size)
    return found


def _mapped_file_blocks(pid: int, span: str, key: tuple[int, int]) -> int | None:
    """The bytes allocated to the file mapped at `span`: None where map_files is unreadable (the
    caller falls back on the mapping's extent), 0 where the range is unmapped by now or maps another
    file (the maps line is stale) or a file that still has a name (counted under the run directory)."""
    try:
        info = os.stat(f"/proc/{pid}/map_files/{span}")
    except FileNotFoundError:
        return 0
    except OSError:
        return None
    if (info.st_dev, info.st_ino) != key or not stat.S_ISREG(info.st_mode) or info.st_nlink != 0:
        return 0
    return info.st_blocks * 512
