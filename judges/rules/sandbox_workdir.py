"""The run folders of sandboxed runs (/tmp/marl_sbx_*), and the sweep of those a dead parent left.

A parent removes its run's folder in a `finally`; one killed mid-run (SIGKILL, the OOM killer) never
gets there, and its folder stays, owned by the run's uid, with its candidate maybe still running
(nothing kills it: the deadline was the dead parent's). So each parent holds a lock for its run's
life: an flock on `<folder>.lock`, beside the folder in the temporary directory (not inside it: the
run's uid owns its folder and could delete a file there; the temporary directory's sticky bit keeps
it from deleting ours). The lock exists and is held before the folder is made, and the folder is
removed before the lock is let go, so a folder whose lock can be taken has no live parent. Each new
run sweeps such folders first: it kills the processes of the folder's sandbox uid, removes the folder,
then its lock file. flock, not fcntl's POSIX locks: those belong to a process, so a sweep in another
thread of a live parent would take (and, closing it, release) that parent's own lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator

from judges.rules.sandbox_disk import processes_of

PREFIX = "marl_sbx_"
LOCK_SUFFIX = ".lock"
SANDBOX_UIDS = range(1_900_000_000, 1_950_000_000)  # the runs' own uids (sandbox._pick_uid), nothing else's
LEGACY_AGE_S = 3600.0  # a folder with no lock file (made before locks, or a clean-up cut short) is stale past this


@contextlib.contextmanager
def run_folder(directory: str | None = None) -> Iterator[str]:
    """A fresh run folder (its real path) in `directory` (the temporary directory by default), locked
    for the life of the `with` and removed afterwards; stale folders are swept first."""
    directory = os.path.realpath(directory or tempfile.gettempdir())
    sweep(directory)
    workdir, lock_fd = make_folder(directory)
    try:
        yield workdir
    finally:
        try:
            remove_tree(workdir)
            _unlink_if_same(workdir + LOCK_SUFFIX, lock_fd)
        finally:
            os.close(lock_fd)  # only now: the folder is gone before a sweep may take the lock


def make_folder(directory: str) -> tuple[str, int]:
    """(folder, the descriptor holding its lock): the lock file is made and locked before the folder,
    so a sweep can never find the folder without its lock held."""
    while True:
        lock_fd, lock_path = tempfile.mkstemp(prefix=PREFIX, suffix=LOCK_SUFFIX, dir=directory)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            workdir = lock_path[: -len(LOCK_SUFFIX)]
            # Still ours: before the flock, a sweep of a lock-less leftover of that very name may have
            # taken the new lock file for that folder's and unlinked it.
            if _same_file(lock_path, lock_fd):
                with contextlib.suppress(FileExistsError):  # a leftover of that very name: take another
                    os.mkdir(workdir, 0o700)
                    return workdir, lock_fd
        except BaseException:
            _unlink_if_same(lock_path, lock_fd)
            os.close(lock_fd)
            raise
        _unlink_if_same(lock_path, lock_fd)
        os.close(lock_fd)


def sweep(directory: str) -> list[str]:
    """Removes the run folders in `directory` that no live parent holds; returns their paths. A folder
    whose lock another process (or another thread here) holds is never touched."""
    removed = []
    try:
        entries = [entry for entry in os.scandir(directory) if entry.name.startswith(PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.name.endswith(LOCK_SUFFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            if _sweep_one(entry.path):
                removed.append(entry.path)
    return removed


def _sweep_one(workdir: str) -> bool:
    """Removes `workdir` when its lock can be taken (its parent is gone), or, having no lock file at
    all, when it is older than LEGACY_AGE_S; True if it was removed."""
    lock_path = workdir + LOCK_SUFFIX
    try:
        lock_fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)  # no fifo waits
    except FileNotFoundError:
        info = os.lstat(workdir)
        if time.time() - max(info.st_mtime, info.st_ctime) < LEGACY_AGE_S:
            return False
        _end_runs_of(info.st_uid)
        remove_tree(workdir)
        return not os.path.lexists(workdir)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live parent's run
        if not _same_file(lock_path, lock_fd) or not os.path.lexists(workdir):
            return False  # another sweep finished it (and a new run may have taken the name since)
        _end_runs_of(os.lstat(workdir).st_uid)
        remove_tree(workdir)
        _unlink_if_same(lock_path, lock_fd)
        return not os.path.lexists(workdir)
    finally:
        os.close(lock_fd)


def _end_runs_of(uid: int) -> None:
    """SIGKILLs every process of a dead parent's sandbox uid (its candidate may still be running: no
    deadline holds it any more). A uid outside SANDBOX_UIDS (a folder made as the current user) is
    nobody's to kill here."""
    if uid not in SANDBOX_UIDS or uid == os.geteuid():
        return
    for pid in processes_of(uid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _same_file(path: str, fd: int) -> bool:
    try:
        named, held = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return stat.S_ISREG(named.st_mode) and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _unlink_if_same(path: str, fd: int) -> None:
    """Unlinks the lock file at `path` only if it is still the one `fd` holds."""
    if _same_file(path, fd):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def remove_tree(workdir: str) -> None:
    """Deletes a run's directory, however deep or locked the code left it: shutil.rmtree recurses
    (a tree thousands deep raises RecursionError), so chmod and rm, which walk it iteratively, finish."""
    with contextlib.suppress(RecursionError):
        shutil.rmtree(workdir, ignore_errors=True)
    if os.path.lexists(workdir):  # too deep, or (not root) permissions removed inside
        for command in (["chmod", "-R", "u+rwx", "--", workdir], ["rm", "-rf", "--", workdir]):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(command, capture_output=True, timeout=120)
