"""Hostile values of the flags every `marl` command takes (issue 31, item 4): what a hunt over every path and
number flag of demo, validate, rollout, credit, run, eval, export, estimate, judges report/calibrate and rm
train found, each now exit status 2, exactly one stderr line and no traceback.

- an empty or blank path (Path('') is the working directory: `rm train --out ''` was a traceback, `export
  --out ''` said "PosixPath('.') has an empty name", `eval --out ' '` wrote its reports into a folder named
  ' '), a path holding a NUL byte and a name past 255 bytes (`rollout --policy` of 5,000 characters was
  pathlib's 'File name too long' traceback) are the flag's argparse line (trainers/cli/common.py: path_value);
- such a name in a scenario (a policy, tasks.jsonl, a judge's model or calibration, a module) or in --set
  train.model is the key's located line (marl/scenario/problems.py: os_error_problem);
- `rm train --seed` past 32 bits was torch's OverflowError traceback;
- a judge cache (--judge-cache, or a run folder's judge_cache.sqlite) that is a FIFO, /dev/zero or not an
  SQLite database was SQLite's 'disk I/O error' or 'file is not a database' traceback (judges/model/cache.py);
- `marl judges report --reward-model` whose model fails to load wrote --out's folder first.

A NUL byte cannot reach a real process's argv, so those cases run in this process only.
"""

import os
import shutil

import pytest

from helpers.cli import one_error_line, run_marl
from helpers.inprocess import marl_in_process
from helpers.judge_server import JudgeServer, write_judged_relay
from helpers.paths import SCENARIOS

ITEMS = "examples/judge_items.jsonl"
PAIRS = '{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n'

# (command words, the arguments before the flag, the flag): a flag given an empty, blank or NUL path
PATH_FLAGS = [
    (["validate"], [], "FILE"),
    (["rollout"], ["relay"], "--policy"), (["rollout"], ["relay", "--policy", "expert"], "--base"),
    (["rollout"], ["relay"], "--judge-cache"), (["credit"], [], "FILE"), (["credit"], ["relay"], "--judge-cache"),
    (["run"], ["relay"], "--out"), (["run"], ["relay"], "--init-from"), (["run"], ["relay"], "--cache-dir"),
    (["run"], [], "SCENARIO"),
    (["eval"], ["relay"], "--checkpoint"), (["eval"], ["relay"], "--out"), (["eval"], ["relay"], "--judge-cache"),
    (["export"], [], "PATH"), (["export"], ["runs/x"], "--out"), (["export"], ["runs/x", "--out", "o"], "--base"),
    (["estimate"], ["relay"], "--cache-dir"),
    (["demo"], [], "--out"), (["demo"], [], "--model"), (["demo"], [], "--cache-dir"),
    (["judges", "report"], ["--simulated", "--out", "r.json"], "--items"),
    (["judges", "report"], ["--simulated", "--items", ITEMS], "--out"),
    (["judges", "report"], ["--simulated", "--items", ITEMS, "--out", "r.json"], "--cache"),
    (["judges", "report"], ["--simulated", "--items", ITEMS, "--out", "r.json"], "--markdown"),
    (["judges", "report"], ["--items", ITEMS, "--out", "r.json"], "--reward-model"),
    (["judges", "report"], ["--items", ITEMS, "--out", "r.json"], "--local-model"),
    (["judges", "calibrate"], ["--simulated", "--items", ITEMS, "--out", "c.json"], "--gold"),
    (["rm", "train"], ["--base", "b", "--out", "o"], "--pairs"), (["rm", "train"], ["--pairs", "p", "--out", "o"], "--base"),
    (["rm", "train"], ["--pairs", "p", "--base", "b"], "--out"),
]
POSITIONAL = {"FILE", "SCENARIO", "PATH"}
REQUIRED_LAST = {"export": ["--out", "o"]}  # a positional given alone still needs the command's required flags


def _argv(words, before, flag, value) -> list[str]:
    if flag in POSITIONAL:
        return [*words, value, *before, *REQUIRED_LAST.get(words[0], [])]
    return [*words, *before, flag, value]


@pytest.mark.parametrize("value, why", [("", "'' is an empty path"), (" ", "' ' is an empty path"),
                                        ("a\0b", "the path holds a NUL byte, which no file name can"),
                                        ("x" * 300, "a path of 300 bytes: a file name is at most 255 bytes")])
@pytest.mark.parametrize("words, before, flag", PATH_FLAGS, ids=lambda x: x if isinstance(x, str) else None)
def test_an_empty_blank_or_nul_path_is_the_flags_one_line(words, before, flag, value, why, tmp_path):
    line = one_error_line(marl_in_process(*_argv(words, before, flag, value), cwd=tmp_path))
    command = " ".join(words)
    assert line.startswith(f"marl {command}: error: argument {flag}: {why}"), line
    assert line.endswith(f"(see marl {command} --help)")
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a folder


def test_an_empty_path_fails_the_same_in_a_real_process(tmp_path):
    line = one_error_line(run_marl("rm", "train", "--pairs", "p", "--base", "b", "--out", "", cwd=tmp_path))
    assert line == "marl rm train: error: argument --out: '' is an empty path; give a file or folder path (see marl " \
                   "rm train --help)"


@pytest.mark.parametrize("seed", ["4294967296", "1" + "0" * 30, "-1"])
def test_rm_train_seed_past_32_bits_is_one_line(seed, tmp_path):
    (tmp_path / "pairs.jsonl").write_text(PAIRS)
    line = one_error_line(marl_in_process("rm", "train", "--pairs", tmp_path / "pairs.jsonl", "--base", tmp_path,
                                          "--out", tmp_path / "rm", "--seed", seed))
    expected = "expected 0 or more" if seed.startswith("-") else "at most 4,294,967,295 (a seed is a 32-bit number"
    assert line.startswith(f"marl: error: --seed {seed[:40]}") and expected in line, line
    assert not (tmp_path / "rm").exists()


# -- a judge cache that is not one -----------------------------------------------------------------------------
def _cache_file(path, kind: str):
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    else:
        path.write_text("not an SQLite database\n" * 20)
    return path


CACHE_REASONS = {"fifo": "c.sqlite is a named pipe (FIFO), not a regular file",
                 "dev_zero": "c.sqlite is a character device, not a regular file", "text": "file is not a database"}


@pytest.fixture
def judged_relay(tmp_path):
    """relay with an endpoint judge at a live local server (the cache is only opened when a judge has one)."""
    shutil.copy(SCENARIOS / "relay_lib.py", tmp_path / "relay_lib.py")
    with JudgeServer(default=("ok", "Rating: [[8]]")) as server:
        yield write_judged_relay(SCENARIOS, server.url, tmp_path), server


@pytest.mark.parametrize("command", [["rollout", "--episodes", "1", "--quiet"], ["credit", "--episodes", "1"],
                                     ["eval", "--set", "tasks.eval_count=2", "--no-credit"]])
@pytest.mark.parametrize("kind", ["text", "dev_zero"])
def test_a_judge_cache_that_is_not_one_is_one_line_before_any_call(judged_relay, tmp_path, command, kind):
    path, server = judged_relay
    cache = _cache_file(tmp_path / "c.sqlite", kind)
    extra = ["--out", str(tmp_path / "eval")] if command[0] == "eval" else []
    line = one_error_line(marl_in_process(command[0], path, *command[1:], *extra, "--judge-cache", cache))
    assert line == f"marl: error: judge cache {cache}: cannot be used as the response cache ({CACHE_REASONS[kind]}" + \
                   ("" if kind == "text" else " (a device such as /dev/zero never ends)") + \
                   "); give a new file path or delete it", line
    assert server.requests == 0 and not (tmp_path / "eval").exists()


def test_a_judge_cache_fifo_does_not_hang_a_real_process(judged_relay, tmp_path):
    path, server = judged_relay
    cache = _cache_file(tmp_path / "c.sqlite", "fifo")
    line = one_error_line(run_marl("rollout", str(path), "--episodes", "1", "--judge-cache", str(cache)))
    assert line.startswith(f"marl: error: judge cache {cache}: cannot be used as the response cache "
                           f"({CACHE_REASONS['fifo']}"), line
    assert server.requests == 0


def test_a_run_folders_judge_cache_that_is_a_fifo_is_one_line(judged_relay, tmp_path):
    path, server = judged_relay
    (tmp_path / "run").mkdir()
    cache = _cache_file(tmp_path / "run" / "judge_cache.sqlite", "fifo")
    line = one_error_line(marl_in_process("run", path, "--set", "train.steps=1", "--set", "tasks.count=10", "--set",
                                          "tasks.eval_count=2", "--out", tmp_path / "run", "--tracker", "none"))
    assert line.startswith(f"marl: error: judge cache {cache}: cannot be used as the response cache (judge_cache"
                           ".sqlite is a named pipe (FIFO)"), line
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["judge_cache.sqlite"]


@pytest.mark.parametrize("command", [["run", "relay"], ["demo"]])
@pytest.mark.parametrize("kind", ["fifo", "file", "under_a_file"])
def test_a_run_directory_that_is_a_file_is_one_line_before_any_model(command, kind, tmp_path):
    """It was 'not writable (File exists); make it writable (chmod u+w)', after the model was built."""
    blocker = tmp_path / "blocker"
    os.mkfifo(blocker) if kind == "fifo" else blocker.write_text("keep me\n")
    out = blocker / "run" if kind == "under_a_file" else blocker
    result = marl_in_process(*command, "--out", out, "--tracker", "none")
    where = " is" if out == blocker else f": {blocker} is"
    assert one_error_line(result) == f"marl: error: run directory {out}{where} a file, not a folder; pass --out with a " \
                                     "folder path (a new one, or the run directory to continue with --resume)"
    assert result.stdout == ""  # before the model is built (no 'tiny model: cached' line)
    assert kind == "fifo" or blocker.read_text() == "keep me\n"


LONG = "x" * 300
SCENARIO_PATHS = {  # a setting naming a path with a 300-byte name -> its located key
    "policy": ("agents:\n  - name: a\n    policy: {long}\n", "agents.0.policy"),
    "tasks": ("agents:\n  - name: a\ntasks:\n  jsonl: {long}.jsonl\n", "tasks.jsonl"),
    "module": ("agents:\n  - name: a\nexpert: {long}:f\n", "expert"),
    "local_judge": ("agents:\n  - name: a\njudges:\n  - {{name: j, backend: local, model: {long}}}\n", "judges.0.model"),
}


@pytest.mark.parametrize("key", sorted(SCENARIO_PATHS))
def test_a_name_too_long_in_a_scenario_is_its_keys_line(key, tmp_path):
    body, where = SCENARIO_PATHS[key]
    scenario = tmp_path / "s.yaml"
    rewards = "    - kind: j\n" if key == "local_judge" else "    - kind: exact\n"
    text = "name: t\n" + body.format(long=LONG) + "graph: {edges: []}\n"
    if key != "tasks":
        text += "tasks:\n  inline:\n    - {prompt: '1', answer: '2'}\n"
    scenario.write_text(text + "rewards:\n  outcome:\n" + rewards)
    line = one_error_line(marl_in_process("validate", scenario))
    assert line.startswith(f"{scenario}:") and f": {where}: the path 'xxx" in line, line
    assert line.endswith("cannot be checked (File name too long); a file name is at most 255 bytes: give a shorter path")


@pytest.mark.parametrize("command", [["validate", "relay"], ["run", "relay", "--out", "run", "--tracker", "none"]])
def test_a_train_model_name_too_long_is_one_line(command, tmp_path):
    line = one_error_line(marl_in_process(*command, "--set", f"train.model=/tmp/{LONG}", cwd=tmp_path))
    assert "train.model: " in line and "File name too long" in line, line
