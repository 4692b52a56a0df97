"""What an interrupted checkpoint write leaves in `checkpoints/`, and its safe removal.

A checkpoint is written into a temporary sibling folder and renamed into place, and `latest` through a
temporary file (common/files.py). A process killed in the middle (kill -9, a power cut, the OOM killer)
leaves those behind, and nothing removed them: issue 31 counted 67 MB after 10 kills. The names:

    .step-000010.k3j4ab_c    a checkpoint being written (tempfile.mkdtemp's 8 random characters)
    .latest.k3j4ab_c.tmp     the `latest` pointer being replaced
    .step-000010.old         a complete step-000010 swapped out while it was written again

They are never taken for a checkpoint: `checkpoint_dirs` lists `step-N` folders only, and
`resolve_checkpoint` refuses one named on the command line. They are removed at the next start of a
run in the same directory (`open_run_directory`) and before every checkpoint write (`save_checkpoint`):

- only entries directly inside the run's own `checkpoints/` folder, whose names match the patterns
  above, and of the right kind (a folder, a file) by `lstat`: a symlink of that name is left alone,
  as is a `checkpoints/` that is itself a symlink; folders are removed with shutil.rmtree, which does
  not follow the links inside them;
- never a write in progress: every write holds an exclusive `flock` on the `checkpoints/` folder from
  before its temporary folder exists until `latest` names it, and removal takes the same lock, so what
  it finds was left by a process that died (the kernel drops a dead process's lock). marl has no lock
  on a whole run directory: two runs started on one `--out` would still mix their files, but neither
  removes the other's checkpoint mid-write. Where the lock cannot be taken (held by a live write just
  now, a file system without flock), nothing is removed;
- `.step-N.old` with no `step-N` beside it is the complete checkpoint of a write killed between its two
  renames: it is put back as `step-N` (resume then checks it against its manifest), not removed.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TEMPORARY_FOLDER = re.compile(r"\.step-\d+\.[a-z0-9_]{8}")
TEMPORARY_POINTER = re.compile(r"\.latest\.[a-z0-9_]{8}\.tmp")
SWAPPED_OUT = re.compile(r"\.(step-\d+)\.old")


def is_unfinished(path: str | Path) -> bool:
    """Whether `path` is named like what a checkpoint write leaves while it runs (see the module docstring)."""
    name = Path(path).name
    return any(pattern.fullmatch(name) for pattern in (TEMPORARY_FOLDER, TEMPORARY_POINTER, SWAPPED_OUT))


@contextmanager
def checkpoints_lock(root: Path, wait: bool = True) -> Iterator[bool]:
    """Hold the exclusive lock of a `checkpoints/` folder for the block; yields whether it is held (False:
    `root` is a symlink or missing, the file system has no flock, or another process holds it and `wait`
    is False). Closing the descriptor releases it, and so does the death of its process."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except OSError:
            held = False
        yield held
    finally:
        os.close(fd)


def remove_leftovers(run_dir: str | Path) -> list[str]:
    """Remove what interrupted checkpoint writes left in run_dir/checkpoints; one phrase per entry
    removed or put back. Nothing is done while another process writes a checkpoint there."""
    root = Path(run_dir) / "checkpoints"
    with checkpoints_lock(root, wait=False) as held:
        return remove_leftovers_locked(root) if held else []


def remove_leftovers_locked(root: Path) -> list[str]:
    """remove_leftovers for a caller that holds `checkpoints_lock(root)`."""
    done = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return done
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            phrase = _clear(root, entry)
        except OSError:  # a file system that refuses: leave it, the run does not depend on it
            continue
        if phrase:
            done.append(phrase)
    return done


def _clear(root: Path, entry: os.DirEntry) -> str | None:
    """Remove (or put back) one leftover entry; what was done, or None when it is no leftover."""
    name = entry.name
    folder = entry.is_dir(follow_symlinks=False)
    if folder and TEMPORARY_FOLDER.fullmatch(name):
        size = _size(Path(entry.path))
        shutil.rmtree(entry.path)
        return f"{name} ({_megabytes(size)})"
    if TEMPORARY_POINTER.fullmatch(name) and entry.is_file(follow_symlinks=False):
        os.unlink(entry.path)
        return name
    swapped = SWAPPED_OUT.fullmatch(name)
    if folder and swapped:
        target = root / swapped.group(1)
        if not os.path.lexists(target):
            os.rename(entry.path, target)
            return f"{name} (put back as {target.name})"
        size = _size(Path(entry.path))
        shutil.rmtree(entry.path)
        return f"{name} ({_megabytes(size)})"
    return None


def _size(folder: Path) -> int:
    """Bytes of the regular files under `folder`, links not followed."""
    total = 0
    for directory, _, files in os.walk(folder):  # os.walk does not follow links to folders
        for name in files:
            try:
                status = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            total += status.st_size
    return total


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"
