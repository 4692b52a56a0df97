"""Every benchmark in bench/ runs on main: each `bench/*.py` (found by glob, so a new one is covered
without editing this file) is run with `--quick` in a process of its own, must exit 0 and must end its
report with a ratio against an anchor it measured in the same run. Times are never asserted: they
depend on the machine; that the measurement runs and yields a ratio does not.

Each bench's process is forked from one that has already imported what every bench imports first (torch,
transformers, the trainers), so a bench pays for its own work, not for those seconds of imports again; it
then runs as `python bench/NAME.py --quick` would (its own __main__, argv, sys.path[0], working directory,
stdout and stderr, and the interpreter's own exit: status, traceback, atexit handlers)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import BENCH

BENCHES = sorted(BENCH.glob("*.py"))
# "ratio: 2.31 (what over what; anchor: ...)", or, when an optional extra is missing,
# "ratio: skipped (<module> is not installed: ...)".
RATIO = re.compile(r"^ratio: (?P<value>\S+) \((?P<why>.*\banchor\b.*)\)$", re.MULTILINE)
SKIPPED = re.compile(r"^(?P<module>[A-Za-z_][\w.]*) is not installed\b")

def test_the_benchmarks_are_found():
    names = {path.name for path in BENCHES}
    assert {"grpo_vs_trl.py", "self_bleu.py", "credit.py", "credit_vs_equal.py", "judge_throughput.py"} <= names


# The forking process: imports, then per request line [script, stdout file, stderr file] forks a child that
# runs the script as __main__ and exits the way the interpreter exits after it; answers "<pid>" then "<status>".
FORKER = r"""
import json, os, runpy, sys
import torch, transformers  # noqa: F401  what every bench imports first
import transformers.models.llama.modeling_llama, transformers.models.qwen2.modeling_qwen2  # noqa: F401
import trainers.run  # noqa: F401
for line in sys.stdin:
    script, out, err = json.loads(line)
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            os.dup2(os.open(name, flags, 0o644), fd)
        sys.argv, sys.path[0] = [script, "--quick"], os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")
        raise SystemExit(0)  # the script ended without sys.exit; its exception or SystemExit ends this one too
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class Forker:
    """One forking process per test process (started on first use): `run(path)` is `python PATH --quick`."""

    def __init__(self, logs: Path):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "WANDB_MODE": "disabled"}
        self.logs, self.pending = logs, b""
        with open(logs / "forker.err", "wb") as errors:
            self.process = subprocess.Popen([sys.executable, "-c", FORKER], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=errors, cwd=BENCH.parent, env=env)

    def _line(self, timeout: float) -> str:
        while b"\n" not in self.pending:
            if not select.select([self.process.stdout], [], [], timeout)[0]:
                raise TimeoutError
            chunk = os.read(self.process.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError("the forking process died:\n" + (self.logs / "forker.err").read_text()[-3000:])
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def run(self, path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
        out, err = self.logs / f"{path.stem}.out", self.logs / f"{path.stem}.err"
        self.process.stdin.write((json.dumps([str(path), str(out), str(err)]) + "\n").encode())
        self.process.stdin.flush()
        pid = int(self._line(120))
        try:
            status = int(self._line(timeout))
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._line(60)  # its status: the next bench's answers come after it
            raise
        return subprocess.CompletedProcess([str(path), "--quick"], status, out.read_text(), err.read_text())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture(scope="session")
def forker(tmp_path_factory):
    forker = Forker(tmp_path_factory.mktemp("bench"))
    yield forker
    forker.close()


def run_quick(path: Path, forker: Forker) -> subprocess.CompletedProcess:
    """`python bench/NAME.py --quick` from the repository root, one torch thread, offline (forked: see above)."""
    return forker.run(path)


def check_ratio(output: str) -> None:
    """The last 'ratio:' line is a finite positive number, or names an extra that is really missing."""
    lines = RATIO.findall(output)
    assert lines, "no 'ratio: VALUE (...; anchor: ...)' line in:\n" + output[-3000:]
    value, why = lines[-1]
    if value == "skipped":
        missing = SKIPPED.match(why)
        assert missing, f"a skipped ratio must name the missing module: {why!r}"
        module = missing["module"]
        assert importlib.util.find_spec(module) is None, f"{module} is installed, yet the comparison was skipped"
        return
    assert math.isfinite(float(value)) and float(value) > 0, value


@pytest.mark.slow  # each takes a few seconds to ~20 s (its work, and imports beyond torch's: TRL, shap, peft)
# ray_scaling starts a local Ray cluster: it joins the Ray tests' worker (tests/conftest.py), one cluster at a time
@pytest.mark.parametrize("path", [pytest.param(path, marks=[pytest.mark.ray] if path.stem == "ray_scaling" else [])
                                  for path in BENCHES], ids=[path.stem for path in BENCHES])
def test_quick_mode_runs_and_prints_its_ratio(path, demo_model_dir, forker):
    # demo_model_dir: the tiny model the training benches load is built (once per machine) and cached
    # by the test session, so no bench spends its seconds building it
    result = run_quick(path, forker)
    assert result.returncode == 0, f"{path.name} --quick exited {result.returncode}:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr
    check_ratio(result.stdout)


def test_a_ratio_line_is_required_and_a_skip_must_be_real():
    with pytest.raises(AssertionError, match="no 'ratio"):
        check_ratio("speed-up 3.1x\n")
    with pytest.raises(AssertionError):
        check_ratio("ratio: nan (a / b; anchor: b)\n")
    with pytest.raises(AssertionError, match="is installed"):
        check_ratio("ratio: skipped (pytest is not installed: pip install it; the anchor is pytest)\n")
    check_ratio("ratio: 2.5 (b s / a s; anchor: b, timed in this run)\n")
    check_ratio("ratio: skipped (no_such_module_xyz is not installed: pip install it; the anchor is it)\n")
