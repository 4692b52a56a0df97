"""Checksums of a checkpoint: `manifest.json` lists the size and sha256 of every file in it.

The manifest is written last, into the temporary directory, before the directory is renamed into
place, so a checkpoint with a manifest that matches its files is complete and untouched since. A
file cut short (a torn copy, a full disk on another machine, bit rot) or edited shows up as a size or
checksum mismatch, found before torch or safetensors ever read the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from common.files import FileProblem, read_json_file, write_text_atomically
from trainers.records.runfiles import what_is_wrong

MANIFEST = "manifest.json"
VERSION = 1
CHUNK = 1 << 20
MAX_MANIFEST_BYTES = 64 << 20  # about 100 bytes an entry: a checkpoint of 600,000 files


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(directory: Path) -> Path:
    """Write `directory/manifest.json` with the size and sha256 of every other file below it."""
    files = {p.relative_to(directory).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
             for p in _files(directory)}
    path = directory / MANIFEST
    write_text_atomically(path, json.dumps({"version": VERSION, "files": files}, indent=1) + "\n")
    return path


def manifest_problem(directory: Path, full: bool = True) -> str | None:
    """What is wrong with a checkpoint directory, or None when every file matches its manifest.

    `full=False` compares sizes only (cheap, for messages); a directory without a manifest (written
    by an older marl) is not checked here. The answer names the first bad file and how it is bad.
    """
    path = Path(directory) / MANIFEST
    if not os.path.lexists(path):  # a dangling link is a manifest that cannot be read, not a missing one
        return None
    try:  # read as every user file is: a FIFO or a link to /dev/zero here must not hang the check
        files = read_json_file(path, max_bytes=MAX_MANIFEST_BYTES, expected="a JSON file")["files"]
        entries = [(name, _size(entry["bytes"]), str(entry["sha256"])) for name, entry in files.items()]
    except FileProblem as problem:
        return f"{MANIFEST}: {what_is_wrong(problem.reason)}"
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{MANIFEST} is unreadable ({error.__class__.__name__})"
    for name, size, sha in entries:
        problem = _file_problem(Path(directory), name, size, sha, full)
        if problem:
            return problem
    return None


def _size(value) -> int:
    """A manifest entry's byte count: an integer (json's own bound on digits applies), never a float or text."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("a size that is not a count of bytes")
    return value


def _file_problem(directory: Path, name: str, size: int, sha: str, full: bool) -> str | None:
    """What is wrong with one manifest entry. Only regular files inside the checkpoint are read: an entry
    naming a path outside it (absolute, `..`, a linked folder) or anything but a regular file (a link, a
    device such as /dev/zero, a pipe, whose reads never end) is a problem, never opened."""
    path = directory / name
    if not name or Path(name).is_absolute() or ".." in Path(name).parts \
            or not path.resolve().is_relative_to(directory.resolve()):
        return f"the manifest names {name!r}, a path outside the checkpoint"
    try:
        info = path.lstat()
    except OSError:
        return f"{name} is missing"
    if not stat.S_ISREG(info.st_mode):
        return f"{name} is not a regular file (a link, a device or a pipe), so it is not read"
    actual = info.st_size
    if actual != size:
        return f"{name} is {actual} bytes, the manifest says {size}"
    if full:
        try:
            if file_sha256(path) != sha:
                return f"{name} does not match its sha256 in the manifest"
        except OSError as error:
            return f"{name} cannot be read ({error.strerror or error})"
    return None
