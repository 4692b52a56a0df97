"""A run folder given back to `marl run --resume`, `--init-from` or `marl eval --checkpoint` after someone put
hostile files in it (issue 31, item 4): before.json, run.json, continual.json, scenario.json, metrics.jsonl and
a table that are a FIFO, a link to /dev/zero, not UTF-8, a 5,000-digit integer, JSON nested 100,000 deep or cut
short are one line naming the file and the fix, exit 2, no traceback (before: a hang, memory until killed, a
RecursionError or a raw decoder message); a hostile manifest makes its checkpoint damaged, so the newest
intact one is used, as for any damaged checkpoint. The unit cases are tests/trainers/records/test_runfiles.py.
"""

import os
import shutil
from pathlib import Path

import pytest

from helpers.cli import one_error_line, run_marl
from helpers.inprocess import marl_in_process

SMALL = ["train.prompts_per_step=2", "train.group_size=4", "tasks.count=60", "tasks.eval_count=4",
         "train.warmup.rl_steps=0", "train.checkpoint_every=1", "train.steps=2"]
SETTINGS = [arg for item in SMALL for arg in ("--set", item)]
BIG = "9" * 5000
FIX = "(not as marl writes it); restore it from a copy, or start a new run with --out NEWDIR"

pytestmark = pytest.mark.xdist_group("hostile_run_folders")  # the finished run is built once per worker


@pytest.fixture(scope="module")
def finished(tmp_path_factory, demo_model_dir) -> Path:
    """A finished two-step relay run with a W&B run id (run.json) and a record for --init-from."""
    out = tmp_path_factory.mktemp("hostile_runs") / "run"
    result = marl_in_process("run", "relay", *SETTINGS, "--out", out, "--tracker", "wandb")
    assert result.returncode == 0, result.stderr
    assert {"run.json", "before.json", "metrics.jsonl", "scenario.json"} <= {p.name for p in out.iterdir()}
    return out


def _copy(finished: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished, tmp_path / "run", symlinks=True)
    return tmp_path / "run"


def _spoil(path: Path, kind: str) -> None:
    """Replace the file at `path` with a hostile one of `kind` (a JSON-lines file keeps its first row)."""
    first = path.read_text().splitlines()[0] + "\n" if path.suffix == ".jsonl" else ""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    else:
        path.write_bytes(first.encode() + {"latin1": b'{"a": "caf\xe9"}\n', "big_int": f'{{"a": {BIG}}}\n'.encode(),
                                           "deep": b"[" * 100_000 + b"]" * 100_000 + b"\n",
                                           "truncated": b'{"a": 1, "b'}[kind] + first.encode())


# (file, kind, tracker) -> the line after the file's path
RESUME = {
    ("before.json", "latin1", "none"): f":1: not UTF-8 text (byte 0xe9 at column 11; perhaps latin-1 or cp1252) {FIX}",
    ("before.json", "truncated", "none"): f":1: not valid JSON (Unterminated string starting at at column 10) {FIX}",
    ("metrics.jsonl", "big_int", "none"): f":2: an integer of 5,000 digits (at most 4,300 are read) {FIX}",
    ("metrics.jsonl", "latin1", "none"): f":2: not UTF-8 text (byte 0xe9 at column 11; perhaps latin-1 or cp1252) {FIX}",
    ("tables/samples.jsonl", "deep", "none"): f":2: JSON nested more than 100 levels deep {FIX}",
    ("run.json", "big_int", "wandb"): f":1: an integer of 5,000 digits (at most 4,300 are read) {FIX}",
    ("run.json", "deep", "wandb"): f":1: JSON nested more than 100 levels deep {FIX}",
}


@pytest.mark.parametrize("name, kind, tracker", sorted(RESUME))
def test_a_resume_refuses_a_hostile_file_of_its_run_folder_in_one_line(finished, tmp_path, name, kind, tracker):
    out = _copy(finished, tmp_path)
    _spoil(out / name, kind)
    line = one_error_line(marl_in_process("run", "relay", *SETTINGS, "--out", out, "--resume", "--tracker", tracker))
    assert line == f"marl: error: {out / name}{RESUME[name, kind, tracker]}", line


@pytest.mark.parametrize("name, kind, reason", [
    ("before.json", "fifo", "is a named pipe (FIFO), not a regular file (reading one waits for a writer that may "
                            "never come)"),
    ("metrics.jsonl", "dev_zero", "is a character device, not a regular file (a device such as /dev/zero never ends)"),
])
def test_a_fifo_or_dev_zero_in_a_run_folder_does_not_hang_a_real_resume(finished, tmp_path, name, kind, reason):
    out = _copy(finished, tmp_path)
    _spoil(out / name, kind)
    result = run_marl("run", "relay", *SETTINGS, "--out", str(out), "--resume", "--tracker", "none", timeout=300)
    assert one_error_line(result) == f"marl: error: {out / name}: {reason} {FIX}"


def test_a_continual_record_that_is_a_device_is_one_line(finished, tmp_path):
    out = _copy(finished, tmp_path)
    os.symlink("/dev/zero", out / "continual.json")
    line = one_error_line(marl_in_process("run", "relay", *SETTINGS, "--out", out, "--resume", "--tracker", "none"))
    assert line == f"marl: error: {out / 'continual.json'}: is a character device, not a regular file (a device such " \
                   "as /dev/zero never ends) (not as marl writes it); restore it, or start a new run with --out " \
                   "NEWDIR (pass --init-from RUN again)"


@pytest.mark.parametrize("kind, reason", [
    ("big_int", ":16: an integer of 5,000 digits (at most 4,300 are read)"),
    ("deep", ":1: JSON nested more than 100 levels deep"),
])
def test_init_from_a_run_whose_scenario_record_is_hostile_is_one_line(finished, tmp_path, kind, reason):
    earlier = _copy(finished, tmp_path)
    record = earlier / "scenario.json"
    if kind == "big_int":  # the record as written, its last field a 5,000-digit number
        record.write_text(record.read_text().rstrip().removesuffix("}") + f', "x": {BIG}\n}}\n')
    else:
        _spoil(record, kind)
    line = one_error_line(marl_in_process("run", "relay", *SETTINGS, "--init-from", earlier, "--out",
                                          tmp_path / "new", "--tracker", "none"))
    assert line == f"marl: error: --init-from {earlier}: {record}{reason} (not as marl writes it); restore it, or " \
                   "pass another run", line
    assert not (tmp_path / "new").exists()


def test_a_hostile_manifest_is_a_damaged_checkpoint_and_eval_uses_the_intact_one(finished, tmp_path):
    out = _copy(finished, tmp_path)
    manifest = out / "checkpoints" / "step-000002" / "manifest.json"
    _spoil(manifest, "deep")
    result = marl_in_process("eval", "relay", "--set", "tasks.eval_count=2", "--checkpoint", out, "--out",
                             tmp_path / "eval", "--no-credit")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "step-000001" in result.stdout and "step-000002" not in result.stdout
