"""Every benchmark in bench/ runs on main: each `bench/*.py` (found by glob, so a new one is covered
without editing this file) is run with `--quick` in a real subprocess, must exit 0 and must end its
report with a ratio against an anchor it measured in the same run. Times are never asserted: they
depend on the machine; that the measurement runs and yields a ratio does not."""

from __future__ import annotations

import importlib.util
import math
import os
import re
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


def run_quick(path: Path) -> subprocess.CompletedProcess:
    """`python bench/NAME.py --quick` from the repository root, one torch thread, offline."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, str(path), "--quick"], cwd=BENCH.parent, env=env, capture_output=True,
                          text=True, timeout=600)


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


# not `slow`: every bench's --quick runs in `make test` (each takes a few seconds to ~20 s: a fresh interpreter
# importing torch, TRL or shap)
# ray_scaling starts a local Ray cluster: it joins the Ray tests' worker (tests/conftest.py), one cluster at a time
@pytest.mark.parametrize("path", [pytest.param(path, marks=[pytest.mark.ray] if path.stem == "ray_scaling" else [])
                                  for path in BENCHES], ids=[path.stem for path in BENCHES])
def test_quick_mode_runs_and_prints_its_ratio(path, demo_model_dir):
    # demo_model_dir: the tiny model the training benches load is built (once per machine) and cached
    # by the test session, so no bench spends its seconds building it
    result = run_quick(path)
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
