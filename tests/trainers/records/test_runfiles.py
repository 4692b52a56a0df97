"""Files of a run folder read back safely (issue 31, item 4): a FIFO, a link to /dev/zero, a folder, bytes that
are not UTF-8, a 5,000-digit integer, JSON nested 100,000 deep or cut short in run.json, before.json,
continual.json, scenario.json, a manifest, metrics.jsonl or a table are one line naming the file (and line)
and the fix, never a hang or a traceback; a row torn by a crash is still skipped."""

import json

import pytest

from helpers.special_files import SPECIAL_KINDS, make_special
from trainers.config import ContinualError
from trainers.continual import recorded_init_from
from trainers.records.manifest import manifest_problem
from trainers.records.report import read_metrics, truncate_metrics
from trainers.records.rundir import RunDirectoryError, wandb_run_id
from trainers.records.runfiles import RunFileProblem, read_run_figures, read_run_json, read_run_rows

BIG = "9" * 5000
DEEP = "[" * 100_000 + "]" * 100_000
FIX = "(not as marl writes it); restore it from a copy, or start a new run with --out NEWDIR"
PIPE = "is a named pipe (FIFO), not a regular file (reading one waits for a writer that may never come)"
DEVICE = "is a character device, not a regular file (a device such as /dev/zero never ends)"


def _hostile(path, kind: str) -> None:
    """Make `path` a hostile file of `kind` (its good content would be one JSON object)."""
    if kind in SPECIAL_KINDS:
        make_special(path, kind)
    else:
        path.write_bytes({"latin1": b'{"a": "caf\xe9"}', "big_int": f'{{"a": {BIG}}}'.encode(), "deep": DEEP.encode(),
                          "truncated": b'{"a": 1, "b', "array": b"[1, 2]"}[kind])


JSON_CASES = {
    "fifo": f": {PIPE} {FIX}",
    "dev_zero": f": {DEVICE} {FIX}",
    "folder": f": is a folder, not a regular file {FIX}",
    "latin1": f":1: not UTF-8 text (byte 0xe9 at column 11; perhaps latin-1 or cp1252) {FIX}",
    "big_int": f":1: an integer of 5,000 digits (at most 4,300 are read) {FIX}",
    "deep": f":1: JSON nested more than 100 levels deep {FIX}",
    "truncated": f":1: not valid JSON (Unterminated string starting at at column 10) {FIX}",
    "array": f": holds an array, not an object {FIX}",
}


@pytest.mark.parametrize("kind", sorted(JSON_CASES))
def test_a_hostile_json_file_of_a_run_is_one_line(tmp_path, kind):
    path = tmp_path / "before.json"
    _hostile(path, kind)
    with pytest.raises(RunFileProblem) as caught:
        read_run_json(path, missing=None)
    assert str(caught.value) == f"{path}{JSON_CASES[kind]}"


def test_a_missing_file_is_the_default_and_nan_is_a_figure(tmp_path):
    assert read_run_json(tmp_path / "run.json", missing={}) == {}
    with pytest.raises(FileNotFoundError):
        read_run_json(tmp_path / "run.json")
    (tmp_path / "before.json").write_text('{"team_success": NaN, "episodes": 8}')
    figures = read_run_figures(tmp_path / "before.json")
    assert figures["episodes"] == 8 and figures["team_success"] != figures["team_success"]


def test_held_out_figures_that_are_not_numbers_are_refused(tmp_path):
    (tmp_path / "before.json").write_text('{"team_success": "0.5"}')
    with pytest.raises(RunFileProblem, match="figure 'team_success' is a string, not a number"):
        read_run_figures(tmp_path / "before.json")


ROWS = "".join(json.dumps({"train/step": step, "train/reward": 0.5}) + "\n" for step in (1, 2))


@pytest.mark.parametrize("tail", [b'{"train/step": 3, "train/rew', b'{"train/step": 3, "x": "caf\xc3'])
def test_a_torn_last_row_is_skipped_even_mid_character(tmp_path, tail):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(ROWS.encode() + tail)
    assert [row["train/step"] for row in read_metrics(path)] == [1, 2]
    truncate_metrics(path, steps_done=2)
    assert path.read_text() == ROWS


@pytest.mark.parametrize("bad, expected", [
    (b'{"train/step": 3, "x": "caf\xe9"}', ":3: not UTF-8 text (byte 0xe9 at column 28; perhaps latin-1 or cp1252)"),
    (f'{{"train/step": {BIG}}}'.encode(), ":3: an integer of 5,000 digits (at most 4,300 are read)"),
    (DEEP.encode(), ":3: JSON nested more than 100 levels deep"),
    (b'{"train/step": 1e999}', ":3: the number 1e999 is too large for a float"),
    (b'{"train/step": 1' + b"0" * 400 + b"}", ":3: an integer of 401 digits, more than any count or step"),
])
def test_a_hostile_row_before_the_last_is_one_line_and_nothing_is_rewritten(tmp_path, bad, expected):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(ROWS.encode() + bad + b"\n" + ROWS.encode())
    before = path.read_bytes()
    with pytest.raises(RunFileProblem) as caught:
        truncate_metrics(path, steps_done=1)
    assert str(caught.value) == f"{path}{expected} {FIX}"
    assert path.read_bytes() == before


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "folder"])
def test_a_record_that_is_no_regular_file_is_one_line(tmp_path, kind):
    path = tmp_path / "samples.jsonl"
    _hostile(path, kind)
    with pytest.raises(RunFileProblem, match="not a regular file"):
        read_run_rows(path)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "latin1", "big_int", "deep", "truncated"])
def test_run_json_of_a_resume_is_one_run_directory_line(tmp_path, kind):
    _hostile(tmp_path / "run.json", kind)
    with pytest.raises(RunDirectoryError, match=f"^{tmp_path / 'run.json'}.*; restore it from a copy"):
        wandb_run_id(tmp_path, 3)


@pytest.mark.parametrize("state", [{"wandb_run_id": "../../etc"}, {"wandb_run_id": 7}, {"starts": "x"}])
def test_a_run_id_that_is_no_wandb_id_is_refused(tmp_path, state):
    """The id names W&B's offline folders, which a resume globs and removes."""
    (tmp_path / "run.json").write_text(json.dumps(state))
    with pytest.raises(RunDirectoryError, match="is not a marl run state file"):
        wandb_run_id(tmp_path, 3)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "big_int", "deep"])
def test_continual_json_of_a_resume_is_one_line(tmp_path, kind):
    _hostile(tmp_path / "continual.json", kind)
    with pytest.raises(RunFileProblem, match="pass --init-from RUN again"):
        recorded_init_from(tmp_path)


def test_continual_json_without_a_run_is_refused(tmp_path):
    (tmp_path / "continual.json").write_text('{"init_from": 5}')
    with pytest.raises(ContinualError, match="its init_from is not the directory of a run"):
        recorded_init_from(tmp_path)


@pytest.mark.parametrize("kind, expected", [
    ("fifo", f"manifest.json: {PIPE}"), ("dev_zero", f"manifest.json: {DEVICE}"),
    ("deep", "manifest.json: JSON nested more than 100 levels deep"),
    ("big_int", "manifest.json: an integer of 5,000 digits (at most 4,300 are read)"),
    ("latin1", "manifest.json: not UTF-8 text (byte 0xe9 at column 11; perhaps latin-1 or cp1252)"),
])
def test_a_hostile_manifest_makes_its_checkpoint_damaged_without_hanging(tmp_path, kind, expected):
    _hostile(tmp_path / "manifest.json", kind)
    assert manifest_problem(tmp_path) == expected


def test_a_manifest_size_that_is_not_a_count_is_unreadable(tmp_path):
    (tmp_path / "manifest.json").write_text('{"files": {"state.pt": {"bytes": 1.5, "sha256": "x"}}}')
    assert manifest_problem(tmp_path) == "manifest.json is unreadable (ValueError)"


def test_held_out_figures_a_float_cannot_hold_are_refused(tmp_path):
    """A 400-digit integer passes the digit bound, and formatting it as a figure raised OverflowError."""
    (tmp_path / "before.json").write_text('{"team_success": 1' + "0" * 400 + "}")
    with pytest.raises(RunFileProblem, match=":1: an integer of 401 digits, more than any count or step"):
        read_run_figures(tmp_path / "before.json")
