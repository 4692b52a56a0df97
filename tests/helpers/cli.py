"""Running the real `marl` command in a subprocess, and the one-line error contract every command keeps."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.paths import ROOT


def run_marl(*args, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m trainers.cli.main ARGS` from `cwd` (default: the repository), W&B off, one thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "trainers.cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=cwd or ROOT, timeout=timeout)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The command's only stderr line, after checking exit status 2 and that no traceback was printed."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]
