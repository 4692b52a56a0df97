"""Red-team pass 3 on the sandbox's processes and run folders.

- A parent killed mid-run (SIGKILL: its `finally` never runs) left its /tmp/marl_sbx_* folder, owned
  by the run's uid, and its candidate running. Each parent now holds a lock beside its folder for the
  run's life; the next run sweeps the folders whose lock is free, killing what still runs under their
  sandbox uid, and never touches a folder a live parent (another process, or another thread) holds.
- The child saw every process of the machine (os.getsid over pids found 137). Where
  `unshare --pid --fork` works it is pid 1 of a PID namespace of its own, confirmed from inside
  (`pidns` in `layers`), and the deadline and the CPU limit still end everything.

Real parents (separate Python processes running run_python) and real candidates; waits are for
events (a file the candidate makes, a process's pidfd), each with a hang guard only.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

import judges.rules.sandbox as sandbox
import judges.rules.sandbox_workdir as workdirs
from judges.rules.sandbox import run_python
from judges.rules.sandbox_disk import processes_of
from helpers.sandbox_checks import contained  # noqa: F401 (an autouse fixture)

SETUP = sandbox.isolation()
REPO = Path(__file__).resolve().parents[3]
HANG_GUARD_S = 300  # never reached unless something is broken: every wait below is for an event
needs_pidns = pytest.mark.skipif(not SETUP.pid_namespace, reason="`unshare --pid --fork` does not work here")
PARENT = """
import json, sys
from judges.rules.sandbox import run_python
result = run_python(sys.argv[1], timeout_s=600, cpu_s=600)
print(json.dumps([result.status, result.stdout]), flush=True)
"""


def _start_parent(candidate: str) -> subprocess.Popen:
    """Another process that runs `candidate` in the sandbox, as a trainer would."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen([sys.executable, "-c", PARENT, candidate], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _folder_of(parent: subprocess.Popen, marker: str) -> str:
    """The run folder in which the candidate made the file `marker` (so it runs now)."""
    pattern = os.path.join(os.path.realpath(tempfile.gettempdir()), workdirs.PREFIX + "*", marker)
    for _ in range(int(HANG_GUARD_S / 0.05)):
        found = glob.glob(pattern)
        if found:
            return os.path.dirname(found[0])
        if parent.poll() is not None:
            pytest.fail(f"the parent ended before its candidate started: {parent.communicate()}")
        time.sleep(0.05)
    pytest.fail("the candidate never started")


def _wait_exited(pids: dict[int, int]) -> list[int]:
    """Waits on each process's pidfd (taken beforehand, so the pid cannot be another's); returns
    those still running after the hang guard."""
    running = []
    for pid, pidfd in pids.items():
        try:
            if not select.select([pidfd], [], [], HANG_GUARD_S)[0]:
                running.append(pid)
        finally:
            os.close(pidfd)
    return running


def _marker_candidate(marker: str, until: str) -> str:
    return f"import os, time\nopen({marker!r}, 'w').close()\nwhile {until}:\n    time.sleep(0.05)\nprint('stopped')\n"


def test_a_folder_left_by_a_parent_killed_mid_run_is_removed_by_the_next_run():
    """The parent is SIGKILLed while its candidate sleeps: its folder and lock file stay, the lock
    free. The next run (here, another process's) removes both, and, where the run had a uid of its
    own, kills the candidate, which nothing else would end (no deadline holds it any more)."""
    marker = f"started-{uuid.uuid4().hex}"
    # With a uid of its own the candidate never ends by itself: only the sweep's kill can end it.
    # Without one (not root), it ends once its folder is gone, so that nothing is left running.
    until = "True" if SETUP.drop_privileges else f"os.path.exists({marker!r})"
    parent = _start_parent(_marker_candidate(marker, until))
    try:
        folder = _folder_of(parent, marker)
    finally:
        parent.kill()  # SIGKILL
        parent.communicate()
    uid = os.stat(folder).st_uid
    left = {pid: os.pidfd_open(pid) for pid in processes_of(uid)} if uid in workdirs.SANDBOX_UIDS else {}
    assert os.path.isdir(folder) and os.path.isfile(folder + workdirs.LOCK_SUFFIX)
    assert bool(left) == bool(SETUP.drop_privileges)  # the orphaned candidate, still running
    result = run_python("print('next')")
    assert (result.status, result.stdout) == ("ok", "next\n")
    assert not os.path.lexists(folder) and not os.path.lexists(folder + workdirs.LOCK_SUFFIX)
    assert _wait_exited(left) == []


def test_a_live_runs_folder_is_never_swept_by_another_process():
    """While another process's candidate runs, this process sweeps (directly, and through a run of
    its own): the live folder stays, and its run ends normally once told to stop."""
    marker = f"started-{uuid.uuid4().hex}"
    parent = _start_parent(_marker_candidate(marker, "not os.path.exists('stop')"))
    try:
        folder = _folder_of(parent, marker)
        assert folder not in workdirs.sweep(os.path.dirname(folder))
        assert run_python("print('beside')").stdout == "beside\n"
        assert os.path.isfile(os.path.join(folder, marker))
        Path(folder, "stop").touch()
        out, err = parent.communicate(timeout=HANG_GUARD_S)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.communicate()
    assert parent.returncode == 0 and json.loads(out.splitlines()[-1]) == ["ok", "stopped\n"], err
    assert not os.path.lexists(folder) and not os.path.lexists(folder + workdirs.LOCK_SUFFIX)


def test_a_folder_held_by_another_thread_of_this_process_is_not_swept(tmp_path):
    """flock, not POSIX locks: those belong to the process, so a sweep in another thread of the live
    parent would take the lock and remove the folder under its run."""
    with workdirs.run_folder(str(tmp_path)) as held:
        swept = []
        sweeper = threading.Thread(target=lambda: swept.extend(workdirs.sweep(str(tmp_path))))
        sweeper.start()
        sweeper.join()
        assert swept == [] and os.path.isdir(held)
    assert os.listdir(tmp_path) == []


def test_the_sweep_takes_only_unlocked_folders_and_old_ones_without_a_lock(tmp_path, monkeypatch):
    """A folder whose lock file is free is a dead parent's; one with no lock file at all (made before
    locks existed) is taken only once older than LEGACY_AGE_S; a link of that name, or a folder of
    another name, never."""
    (tmp_path / "marl_sbx_dead" / "deep").mkdir(parents=True)
    (tmp_path / "marl_sbx_dead.lock").touch()
    (tmp_path / "marl_sbx_legacy").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "marl_sbx_link").symlink_to(tmp_path / "other")
    assert workdirs.sweep(str(tmp_path)) == [str(tmp_path / "marl_sbx_dead")]
    assert sorted(os.listdir(tmp_path)) == ["marl_sbx_legacy", "marl_sbx_link", "other"]
    monkeypatch.setattr(workdirs, "LEGACY_AGE_S", -1.0)  # as if an hour had passed
    assert workdirs.sweep(str(tmp_path)) == [str(tmp_path / "marl_sbx_legacy")]
    assert sorted(os.listdir(tmp_path)) == ["marl_sbx_link", "other"]


# ---- the PID namespace ---------------------------------------------------------------------------

SEE_PROCESSES = """
import os
print(os.getpid(), os.getppid())
seen = []
for pid in list(range(1, 1 << 15)) + [{outside}]:
    try:
        os.getsid(pid)
        seen.append(pid)
    except ProcessLookupError:
        pass
print(seen)
"""


@needs_pidns
@pytest.mark.parametrize("audit_hook", [True, False])
def test_the_child_sees_no_process_but_itself(audit_hook):
    """The red team's probe: os.getsid over the pids, and the parent's. Inside its namespace the child
    is pid 1, its parent is outside (0) and no other pid exists, this test's own included."""
    result = run_python(SEE_PROCESSES.format(outside=os.getpid()), audit_hook=audit_hook)
    assert result.status == "ok", result.stderr
    assert result.stdout.splitlines() == ["1 0", "[1]"]
    assert "pidns" in result.layers and result.layers == SETUP.layers


@needs_pidns
def test_pidns_is_reported_only_when_the_child_confirms_it(monkeypatch):
    """Launched without the namespace, the child finds itself in the parent's: no `pidns`."""
    monkeypatch.setattr(sandbox, "_ISOLATION", dataclasses.replace(SETUP, pid_namespace=False))
    result = run_python(SEE_PROCESSES.format(outside=os.getpid()), audit_hook=False)
    assert result.status == "ok" and "pidns" not in result.layers
    assert result.stdout.splitlines()[0] != "1 0" and str(os.getpid()) in result.stdout.splitlines()[1]


@needs_pidns
@pytest.mark.parametrize("limit", ["deadline", "cpu"])
def test_the_deadline_and_the_cpu_limit_end_the_namespace_and_leave_nothing(limit):
    """The interpreter is the namespace's init (which ignores SIGXCPU: the kernel's SIGKILL at the hard
    CPU limit ends it) under unshare, which cannot pass a SIGKILL on: the run still ends as a timeout
    killed by SIGKILL, with none of unshare's words in its stderr, and the `contained` fixture finds no
    process left (threads included)."""
    code = ("import threading, time\n"
            "for _ in range(3):\n    threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()\n"
            + ("time.sleep(1000)\n" if limit == "deadline" else "while True:\n    pass\n"))
    options = {"timeout_s": 1.0, "cpu_s": 600} if limit == "deadline" else {"timeout_s": 120, "cpu_s": 1}
    result = run_python(code, audit_hook=False, **options)
    assert (result.status, result.returncode) == ("timeout", -9), result
    assert limit == "deadline" or result.seconds < 120  # the CPU limit ended it, not the wall clock
    assert "unshare" not in result.stderr and "pidns" in result.layers


def _processes_in(folder: str) -> list[int]:
    """The processes whose working directory is `folder` (or was: deleted since)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            where = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if where in (folder, folder + " (deleted)"):
            found.append(int(entry))
    return found


@needs_pidns
@pytest.mark.parametrize("uid", ["own uid", "no uid of its own"])
def test_a_child_that_leaves_the_process_group_is_still_ended(uid, monkeypatch, contained):
    """Not a group leader inside its namespace, the interpreter may call setsid and leave unshare's
    process group, which the deadline kills: it is found as the launcher's child (and by its uid, where
    it has one of its own), so nothing of it outlives the run."""
    if uid != "own uid":
        monkeypatch.setattr(sandbox, "_ISOLATION", dataclasses.replace(SETUP, drop_privileges=""))
    elif not SETUP.drop_privileges:
        pytest.skip("no uid of its own here (not root)")
    code = "import os, time\nos.setsid()\nprint(os.getsid(0), os.getpgid(0), flush=True)\ntime.sleep(1000)\n"
    result = run_python(code, timeout_s=2.0, audit_hook=False)
    assert (result.status, result.returncode, result.stdout) == ("timeout", -9, "1 1\n"), result
    assert [pid for folder in contained for pid in _processes_in(folder)] == []
