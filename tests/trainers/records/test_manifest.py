"""A checkpoint's manifest is read as data, never as instructions: an entry naming a path outside the
checkpoint, a device, a pipe or a link is refused in one line, and nothing it names is opened (a read of
/dev/zero or of a pipe would never end, and `../../etc/shadow` is not the checkpoint's to hash)."""

from __future__ import annotations

import json
import os

import pytest

from trainers.records.checkpoint import CheckpointError, verified_checkpoint
from trainers.records.manifest import MANIFEST, manifest_problem, write_manifest


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint directory with two files and its manifest."""
    directory = tmp_path / "step-000001"
    (directory / "model").mkdir(parents=True)
    (directory / "state.pt").write_bytes(b"state")
    (directory / "model" / "weights.bin").write_bytes(b"w" * 100)
    write_manifest(directory)
    return directory


def _add_entry(directory, name: str, size: int = 0) -> None:
    """Add an entry to the manifest as a hostile writer would (the checksum of empty content)."""
    path = directory / MANIFEST
    data = json.loads(path.read_text())
    data["files"][name] = {"bytes": size, "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}
    path.write_text(json.dumps(data))


def test_an_intact_checkpoint_has_no_problem_and_an_edited_file_is_named(checkpoint):
    assert manifest_problem(checkpoint) is None
    (checkpoint / "model" / "weights.bin").write_bytes(b"x" * 100)
    assert manifest_problem(checkpoint) == "model/weights.bin does not match its sha256 in the manifest"


@pytest.mark.parametrize("name", ["/dev/zero", "../outside.bin", "model/../../outside.bin", ""])
def test_an_entry_outside_the_checkpoint_is_refused_unread(checkpoint, name):
    (checkpoint.parent / "outside.bin").write_bytes(b"")  # exists, size 0: the manifest's figures would match
    _add_entry(checkpoint, name)
    assert manifest_problem(checkpoint) == f"the manifest names {name!r}, a path outside the checkpoint"


NOT_REGULAR = "entry is not a regular file (a link, a device or a pipe), so it is not read"
OUTSIDE = "the manifest names 'entry', a path outside the checkpoint"


@pytest.mark.parametrize("kind,expected", [("pipe", NOT_REGULAR), ("link to /dev/zero", OUTSIDE),
                                           ("link inside", NOT_REGULAR), ("linked folder", None)])
def test_a_pipe_a_device_a_link_or_a_linked_folder_is_never_read(checkpoint, tmp_path, kind, expected):
    entry = checkpoint / "entry"
    if kind == "pipe":
        os.mkfifo(entry)  # a read would wait for a writer forever
    elif kind == "link to /dev/zero":
        entry.symlink_to("/dev/zero")  # its size is 0, and a read never ends
    elif kind == "link inside":
        entry.symlink_to(checkpoint / "state.pt")
    else:
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "secret").write_bytes(b"")
        entry.symlink_to(tmp_path / "elsewhere")
    name = "entry/secret" if kind == "linked folder" else "entry"
    _add_entry(checkpoint, name)
    assert manifest_problem(checkpoint) == (expected or f"the manifest names {name!r}, a path outside the checkpoint")


def test_resume_and_eval_refuse_such_a_checkpoint_in_one_line(checkpoint):
    _add_entry(checkpoint, "/dev/zero")
    with pytest.raises(CheckpointError) as caught:
        verified_checkpoint(checkpoint)
    assert "the manifest names '/dev/zero', a path outside the checkpoint" in str(caught.value)
    assert "\n" not in str(caught.value)
