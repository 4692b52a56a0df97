"""The sandbox's disk limit counts what the run itself writes, not the file system's free space
(issue 27, item 5): another process filling the same disk does not turn an honest answer into a 0,
and a candidate that writes past its budget still scores 0."""

from __future__ import annotations

import os

import pytest

import judges.rules.sandbox as sandbox
import judges.rules.sandbox_disk as disk
from judges.rules.code import CodeTestsVerifier
from judges.types import Candidate, Item

TESTS = ["assert add(2, 3) == 5", {"call": "add(-1, 1)", "expected": 0}]
CORRECT = "def add(a, b):\n    return a + b\n"


def _score(code: str):
    return CodeTestsVerifier(TESTS, entry="add", timeout_s=20).score(Item("add two numbers"), [Candidate(code)])[0]


@pytest.fixture
def small_budget(monkeypatch):
    monkeypatch.setattr(disk, "DISK_BUDGET_BYTES", 16 * 2**20)
    return disk.DISK_BUDGET_BYTES


def test_an_honest_answer_scores_1_while_another_process_fills_the_same_file_system(small_budget, monkeypatch, tmp_path):
    """300 MB (far past the run's budget) are reserved on the run directory's file system at the
    moment the watch measures, as another process writing there would: the run is not blamed."""
    measure, filled = disk.DiskWatch.usage, []

    def fill_then_measure(watch):
        if not filled:
            neighbour = os.path.join(os.path.dirname(watch.workdir), f"marl_test_fill_{os.getpid()}")
            fd = os.open(neighbour, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.posix_fallocate(fd, 0, 300 * 2**20)  # blocks really taken from the file system's free space
            finally:
                os.close(fd)
            filled.append(neighbour)
        return measure(watch)

    monkeypatch.setattr(disk.DiskWatch, "usage", fill_then_measure)
    try:
        judgment = _score(CORRECT)
        assert filled and os.stat(filled[0]).st_blocks * 512 >= 300 * 2**20 > small_budget
    finally:
        for path in filled:
            os.unlink(path)
    assert (judgment.status, judgment.score, judgment.rationale) == ("ok", 1.0, "2/2 hidden tests passed")


def test_a_candidate_that_writes_past_its_budget_scores_0(small_budget):
    writes = "\n".join(f"with open('f{i}', 'wb') as handle:\n    handle.write(b'x' * {sandbox.FILE_LIMIT_BYTES - 1})"
                       for i in range(3))  # 24 MiB in 3 files, each under the per-file limit
    judgment = _score(writes + "\n" + CORRECT)
    assert judgment.status == "ok" and judgment.score == 0.0
    assert judgment.rationale == f"the code attempted a blocked action ({sandbox.DISK_BLOCK})"


def test_what_the_run_writes_under_its_budget_is_allowed(small_budget):
    judgment = _score(f"with open('f', 'wb') as handle:\n    handle.write(b'x' * {4 * 2**20})\n" + CORRECT)
    assert (judgment.score, judgment.rationale) == (1.0, "2/2 hidden tests passed")


def test_the_watch_counts_the_blocks_under_the_run_directory_only(small_budget, tmp_path):
    run = tmp_path / "run"
    (run / "deep" / "er").mkdir(parents=True)
    (tmp_path / "neighbour").write_bytes(b"x" * (small_budget + 1))  # same file system, not the run's
    watch = disk.DiskWatch(str(run))
    assert not watch.check(final=True) and watch.usage()[1] == 3  # run, deep, er
    (run / "deep" / "er" / "big").write_bytes(b"x" * (small_budget + 1))
    os.chmod(run / "deep", 0)  # hidden from a walk that does not restore it
    assert watch.check(final=True) and watch.exceeded


# Files the run holds open with no name left: `find` under the run directory cannot see them, their
# blocks stay taken. Each case writes 32 MiB (past the 16 MiB budget) in files under the per-file limit
# and holds them; without the watch seeing them, the run would only end at its timeout.
_CHUNK = f"b'x' * {sandbox.FILE_LIMIT_BYTES - 4096}"
HIDDEN_WRITERS = {
    "unlinked": f"import os\nkeep = []\nfor i in range(4):\n    h = open(f'f{{i}}', 'wb')\n    h.write({_CHUNK})\n"
                "    h.flush()\n    os.remove(f'f{i}')\n    keep.append(h)\n",
    "O_TMPFILE": f"import os\nkeep = []\nfor i in range(4):\n    fd = os.open('.', os.O_TMPFILE | os.O_WRONLY, 0o600)\n"
                 f"    os.write(fd, {_CHUNK})\n    keep.append(fd)\n",
    "sqlite temp": "import sqlite3\nkeep = []\nfor i in range(5):\n    c = sqlite3.connect(':memory:')\n"
                   "    c.execute('pragma temp_store=file')\n    c.execute('pragma cache_size=10')\n"
                   "    c.execute('create temp table t(x)')\n    c.execute('insert into temp.t select zeroblob(60000) from "
                   "(with recursive n(i) as (select 1 union all select i+1 from n limit 130) select i from n)')\n"
                   "    keep.append(c)\n",
}


@pytest.mark.parametrize("kind", sorted(HIDDEN_WRITERS))
def test_files_held_open_without_a_name_count_against_the_budget(small_budget, kind):
    hold = "import time\ntime.sleep(1000)\n"  # held until the watch stops the run (else the timeout would)
    judgment = _score(HIDDEN_WRITERS[kind] + hold + CORRECT)
    assert judgment.status == "ok" and judgment.score == 0.0
    assert judgment.rationale == f"the code attempted a blocked action ({sandbox.DISK_BLOCK})"


def test_files_held_open_under_the_budget_are_allowed(small_budget):
    judgment = _score("import os\nh = open('f', 'wb')\nh.write(b'x' * 2**20)\nh.flush()\nos.remove('f')\n" + CORRECT)
    assert (judgment.score, judgment.rationale) == (1.0, "2/2 hidden tests passed")


# Red-team finding: a file written, mapped MAP_SHARED through libc's mmap (ctypes: no descriptor is
# kept, unlike the mmap module's), closed and unlinked has neither a name nor a descriptor, yet keeps
# its blocks. Four such files of just under 8 MiB each are held against the 16 MiB budget.
MAPPED_WRITER = f"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
block, maps = {_CHUNK}, []
for k in range(4):
    fd = os.open(f"h{{k}}", os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, block)
    maps.append(libc.mmap(None, len(block), 3, 1, fd, 0))  # PROT_READ | PROT_WRITE, MAP_SHARED
    assert maps[-1] not in (None, 2**64 - 1)
    os.close(fd)
    os.unlink(f"h{{k}}")
time.sleep(1000)
"""


@pytest.mark.parametrize("map_files", ["readable", "unreadable"])
def test_files_held_only_by_a_memory_map_count_against_the_budget(small_budget, map_files, monkeypatch):
    """With /proc/<pid>/map_files readable (root) the file's blocks are stat'ed; without it, the
    "(deleted)" lines of /proc/<pid>/maps are measured by their mappings' extent."""
    if map_files == "unreadable":
        monkeypatch.setattr(disk, "_mapped_file_blocks", lambda pid, span, key: None)
    result = sandbox.run_python(MAPPED_WRITER, timeout_s=120, cpu_s=60, audit_hook=False,
                                allow_unconfined=True)
    assert (result.status, result.blocked) == ("blocked", sandbox.DISK_BLOCK), result.stderr[-2000:]


def test_the_watch_counts_unlinked_mapped_files_once_and_not_shared_anonymous_memory(tmp_path):
    """Measured on this process: a mapped, unlinked file of the run's directory counts once however
    often it is mapped (and open); shared anonymous memory ("/dev/zero (deleted)", bounded by
    RLIMIT_AS, not the disk) and a mapped file that keeps its name do not."""
    import mmap
    anonymous = mmap.mmap(-1, 8 * 2**20)
    anonymous.write(b"x" * (8 * 2**20))
    (tmp_path / "named").write_bytes(b"n" * 2**20)
    with open(tmp_path / "named", "r+b") as handle:
        named = mmap.mmap(handle.fileno(), 0)
    before = disk.unlinked_open_files({os.getpid()}, str(tmp_path))
    (tmp_path / "gone").write_bytes(b"g" * 2**20)
    with open(tmp_path / "gone", "r+b") as handle:
        maps = [mmap.mmap(handle.fileno(), 0) for _ in range(3)]
        gone = os.fstat(handle.fileno())
        os.unlink(tmp_path / "gone")
    try:
        held, count = disk.unlinked_open_files({os.getpid()}, str(tmp_path))
        assert count - before[1] == 1 and held - before[0] >= 2**20
        assert disk.unlinked_mappings(os.getpid(), str(tmp_path))[gone.st_dev, gone.st_ino] == gone.st_blocks * 512
    finally:
        for each in maps + [named, anonymous]:
            each.close()


def test_a_slow_measure_is_spaced_out_in_proportion(tmp_path, monkeypatch):
    """A walk that took long (a tree of many files) is not repeated sooner than DISK_CHECK_SPACING
    times its duration, so watching a big tree costs a bounded share of the trainer's CPU."""
    class SlowTree(disk.DiskWatch):
        def usage(self):
            import time
            time.sleep(0.05)  # stands for a walk of ~2k files
            return 0, 1

    monkeypatch.setattr(disk, "DISK_CHECK_S", 0.0)
    watch = SlowTree(str(tmp_path))
    import time
    started = time.monotonic()
    assert not watch.check()
    assert watch.cost >= 0.05 and watch.next_at >= started + disk.DISK_CHECK_SPACING * 0.05


def test_a_slow_measure_is_still_repeated_at_least_every_disk_check_max_s(tmp_path, monkeypatch):
    """However long the last walk took, the next comes within DISK_CHECK_MAX_S of it, so a fast writer
    overshoots its budget by at most that long's writes."""
    import time

    class SlowTree(disk.DiskWatch):
        def usage(self):
            time.sleep(0.05)  # spaced out 10x: 0.5 s, past the cap set below
            return 0, 1

    monkeypatch.setattr(disk, "DISK_CHECK_S", 0.0)
    monkeypatch.setattr(disk, "DISK_CHECK_MAX_S", 0.2)
    watch = SlowTree(str(tmp_path))
    started = time.monotonic()
    assert not watch.check()
    assert started <= watch.next_at - 0.2 <= time.monotonic()
