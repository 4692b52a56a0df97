"""Fixtures shared by the sandbox tests: every test checks that the test process carries on, that
no child process is left behind and that every temporary directory the sandbox made is gone."""

from __future__ import annotations

import os

import pytest

import judges.rules.sandbox as sandbox
import judges.rules.sandbox_workdir as workdirs


@pytest.fixture(autouse=True)
def contained(monkeypatch):
    """Records the sandbox's temporary directories and uids; afterwards no directory (nor its lock file)
    may remain, nor any process of ours: no descendant the test started, and no process running under a
    uid one of this test's runs used (an escaped, re-parented child). Other programs' sandboxes on the
    machine are not ours to count, nor the helpers an earlier test of this process left running on
    purpose (a pytest-xdist worker runs many test files: wandb's service process, a Ray driver's)."""
    made, uids, original_make, original_pick = [], [], workdirs.make_folder, sandbox._pick_uid
    already = set(descendants(os.getpid(), process_table()))

    def recording_make(*args, **kwargs):
        path, lock = original_make(*args, **kwargs)
        made.append(path)
        return path, lock

    def recording_pick():
        uids.append(original_pick())
        return uids[-1]

    monkeypatch.setattr(workdirs, "make_folder", recording_make)
    monkeypatch.setattr(sandbox, "_pick_uid", recording_pick)
    yield made
    assert [path for path in made if os.path.lexists(path) or os.path.lexists(path + workdirs.LOCK_SUFFIX)] == []
    table = process_table()
    assert [pid for pid in descendants(os.getpid(), table) if pid not in already] == []
    assert [pid for pid, (_, uid) in table.items() if uid in uids] == []


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, real uid) of every process, read from /proc."""
    table = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
            table[int(entry)] = (int(fields["PPid"]), int(fields["Uid"].split()[0]))
        except (OSError, KeyError, ValueError):
            continue
    return table


def descendants(pid: int, table: dict[int, tuple[int, int]]) -> list[int]:
    children = [child for child, (parent, _) in table.items() if parent == pid]
    return children + [grandchild for child in children for grandchild in descendants(child, table)]
