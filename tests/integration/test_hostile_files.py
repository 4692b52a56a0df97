"""Hostile data files and numbers through the real `marl` command: one line naming the file, exit 2, no traceback.

Issue 31, item 4: `marl judges report --items`, `marl judges calibrate --gold`, `marl rm train --pairs` and a
scenario's tasks file, each given a real FIFO, /dev/zero, a folder, latin-1 text, a 5,000-digit integer and
JSON nested 100,000 deep; a scenario YAML and `--set` given a 5,000-digit integer; counts past their bounds.
A FIFO or a device runs the command in a fresh interpreter (helpers.cli.run_marl, whose timeout only stops a
hang: the assertion is on what the command says); every other case runs in this process.
"""

import json
import os

import pytest

from helpers.cli import one_error_line, run_marl
from helpers.inprocess import marl_in_process
from helpers.paths import ROOT
from helpers.scenario_files import GOOD

BIG = "9" * 5000
DEEP = "[" * 100_000 + "]" * 100_000
ITEM = {"prompt": "p", "candidates": ["a", "b"], "gold": 0}
PAIR = {"prompt": "p", "chosen": "a", "rejected": "b"}
DEVICE = "is a character device, not a regular file (a device such as /dev/zero never ends)"
PIPE = "is a named pipe (FIFO), not a regular file (reading one waits for a writer that may never come)"


def _hostile(tmp_path, kind: str, good: dict) -> str:
    """The path of a hostile data file of `kind` whose first line is `good` (its second line is the bad one)."""
    path = tmp_path / "data.jsonl"
    first = json.dumps(good) + "\n"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "dev_zero":
        return "/dev/zero"
    elif kind == "latin1":
        path.write_bytes(first.encode() + b'{"prompt": "caf\xe9"}\n')
    elif kind == "big_int":
        path.write_text(first + '{"prompt": "p", "gold": ' + BIG + "}\n")
    elif kind == "deep":
        path.write_text(first + DEEP + "\n")
    return str(path)


# kind -> (the expected line after FILE, whether the command must run in a fresh interpreter)
CASES = {
    "fifo": (f": {PIPE}; give a JSON-lines file", True),
    "dev_zero": (f": {DEVICE}; give a JSON-lines file", True),
    "folder": (": is a folder, not a regular file; give a JSON-lines file", False),
    "latin1": (":2: not UTF-8 text (byte 0xe9 at column 16; perhaps latin-1 or cp1252): save the file as UTF-8", False),
    "big_int": (":2: an integer of 5,000 digits (at most 4,300 are read); no value needs that many: write it as a "
                "string if it is text (column 25)", False),
    "deep": (":2: JSON nested more than 100 levels deep; flatten it (data needs a few levels)", False),
}


def _marl(fresh: bool, *args):
    return run_marl(*args) if fresh else marl_in_process(*args)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_judges_report_items(kind, tmp_path):
    items, (expected, fresh) = _hostile(tmp_path, kind, ITEM), CASES[kind]
    line = one_error_line(_marl(fresh, "judges", "report", "--simulated", "--items", items, "--out",
                                str(tmp_path / "r.json"), "--cache", str(tmp_path / "c.sqlite")))
    assert line.startswith(f"marl: error: {items}{expected}"), line
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("kind", ["fifo", "big_int", "deep"])
def test_judges_calibrate_gold(kind, tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({**ITEM, "id": f"q{i}"}) + "\n" for i in range(12)))
    (tmp_path / "gold").mkdir()
    gold, (expected, fresh) = _hostile(tmp_path / "gold", kind, {"id": "q0", "gold": 0}), CASES[kind]
    line = one_error_line(_marl(fresh, "judges", "calibrate", "--simulated", "--items", str(items), "--gold", gold,
                                "--out", str(tmp_path / "cal.json"), "--cache", str(tmp_path / "c.sqlite")))
    assert line.startswith(f"marl: error: {gold}{expected}"), line


@pytest.mark.parametrize("kind", sorted(CASES))
def test_rm_train_pairs(kind, tmp_path):
    pairs, (expected, fresh) = _hostile(tmp_path, kind, PAIR), CASES[kind]
    # the pairs are read before --base is looked at: a base that does not exist is never reached
    line = one_error_line(_marl(fresh, "rm", "train", "--pairs", pairs, "--base", str(tmp_path / "no-model"),
                                "--out", str(tmp_path / "rm")))
    assert line.startswith(f"marl: error: {pairs}{expected}"), line
    assert not (tmp_path / "rm").exists()


TASKS = GOOD.replace('  inline:\n    - prompt: "1+1="\n      answer: "2"\n', "  jsonl: {path}\n")


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_scenario_tasks_file(kind, tmp_path):
    tasks, (expected, fresh) = _hostile(tmp_path, kind, {"prompt": "1+1=", "answer": "2"}), CASES[kind]
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(TASKS.format(path=tasks))
    line = one_error_line(_marl(fresh, "validate", str(scenario)))
    if kind in ("fifo", "dev_zero", "folder"):  # refused as the scenario is checked, at its tasks.jsonl key
        what = expected[2:].removesuffix("; give a JSON-lines file")
        assert line == f"{scenario}:9:3: tasks.jsonl: file {tasks!r} {what}"
    else:  # the tasks file's own line (and column)
        number, reason = expected[1:].split(": ", 1)
        assert line.startswith(f"{tasks}:{number}:") and line.endswith(f": tasks.jsonl: {reason}"), line


def test_a_scenario_that_is_a_fifo_or_a_device(tmp_path):
    fifo = tmp_path / "scenario.yaml"
    os.mkfifo(fifo)
    assert one_error_line(run_marl("validate", str(fifo))) == f"{fifo}:1:1: (file): {PIPE}; give a scenario YAML file"
    assert one_error_line(run_marl("rollout", "/dev/zero")) == f"/dev/zero:1:1: (file): {DEVICE}; give a scenario " \
                                                               "YAML file"


def test_a_sql_database_that_is_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "data.sqlite")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(GOOD.replace("    - kind: exact", "    - kind: sql\n      database: data.sqlite"))
    assert one_error_line(run_marl("validate", str(scenario))) == \
        f"{scenario}:15:7: rewards.outcome.0.database: database 'data.sqlite' {PIPE}; give an SQLite file"


def test_a_judge_calibration_that_is_a_device(tmp_path):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(GOOD.replace("kind: exact", "kind: j") + "judges:\n  - name: j\n    model: m\n    base_url: "
                                                                 "http://127.0.0.1:1/v1\n    calibration: /dev/zero\n")
    line = one_error_line(marl_in_process("validate", str(scenario)))
    assert line == f"{scenario}:19:5: judges.0.calibration: file '/dev/zero' {DEVICE} (fit one with `marl judges " \
                   "calibrate`)", line


# -- numbers in a scenario and in --set ---------------------------------------------------------------------------
@pytest.mark.parametrize("yaml, where", [
    (GOOD + f"train:\n  steps: {BIG}\n", ":16:10: train.steps"),
    (GOOD + f"train:\n  seed: -{BIG}\n", ":16:9: train.seed"),
    (GOOD + "train:\n  steps: 0x" + "f" * 5000 + "\n", ":16:10: train.steps"),
    (GOOD.replace('answer: "2"', f'answer: "2"\n      metadata: {{n: {BIG}}}'), ":12:21: tasks.inline.0.metadata.n"),
])
def test_a_5000_digit_integer_in_a_scenario_file(yaml, where, tmp_path):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml)
    line = one_error_line(marl_in_process("validate", str(scenario)))
    assert line.startswith(f"{scenario}{where}: an integer of 5,00") and line.endswith(
        " digits (at most 4,300 are read; no setting needs that many): write a smaller number, or quote it if it is "
        "text"), line


@pytest.mark.parametrize("command", ["validate", "rollout", "run"])
def test_a_5000_digit_integer_in_set(command, tmp_path):
    extra = ["--out", str(tmp_path / "run")] if command == "run" else []
    line = one_error_line(marl_in_process(command, "relay", "--set", f"train.steps={BIG}", *extra))
    relay = os.path.join(str(ROOT), "scenarios", "relay.yaml")
    assert line == f"{relay} (--set train.steps):0:0: train.steps: --set 'train.steps={'9' * 48}'... (5,012 " \
                   "characters): an integer of 5,000 digits (at most 4,300 are read; no setting needs that many): " \
                   "write a smaller number, or quote it if it is text"
    assert not (tmp_path / "run").exists()


STEPS_WHY = ("at most 1,000,000 (a step plays episodes and updates the model: a million steps already take months, "
             "and an interval past the run's length is never reached)")


@pytest.mark.parametrize("setting, expected", [
    ("train.steps=1e30", "train.steps: Input should be a valid integer"),  # YAML 1.1 reads 1e30 as text
    ("train.steps=1.0e+30", f"train.steps: {STEPS_WHY} (got 1e+30)"),
    ("train.steps=1000000000000", f"train.steps: {STEPS_WHY} (got 1000000000000)"),
    ("train.warmup.sft_max_steps=10000000", "train.warmup.sft_max_steps: at most 1,000,000"),
    ("train.group_size=100000", "train.group_size: at most 1,024 (a step plays and holds prompts_per_step x "
                                "group_size completions at once) (got 100000)"),
    ("train.prompts_per_step=1000000", "train.prompts_per_step: at most 100,000 (what one step plays or trains on "
                                       "is held in memory at once)"),
    ("agents.0.max_tokens=1000000", "agents.0.max_tokens: at most 32,768 (each token of a turn is one forward pass"),
    ("train.seed=-1", "train.seed: Input should be greater than or equal to 0"),
    ("train.seed=99999999999", "train.seed: at most 4,294,967,295 (a seed is a 32-bit number"),
    ("train.steps=.inf", f"train.steps: {STEPS_WHY} (got inf)"),
])
def test_counts_past_their_bounds_say_the_bound_and_why(setting, expected):
    line = one_error_line(marl_in_process("validate", "relay", "--set", setting))
    assert f":0:0: {expected}" in line, line


@pytest.mark.parametrize("args, expected", [
    (["judges", "report", "--per-kind", "1000000000"], "--per-kind 1000000000: at most 100,000 (each probe is a "
                                                        "judgment, and a report runs them all)"),
    (["judges", "report", "--retries", "1000000"], "--retries 1000000: at most 100"),
    (["judges", "report", "--timeout", "1e300"], "--timeout 1e+300: at most 86,400 (a day"),
    (["judges", "calibrate", "--max-tokens", BIG[:100]], f"--max-tokens {BIG[:40]}...: at most 32,768"),
])
def test_judges_options_past_their_bounds(args, expected, tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps(ITEM) + "\n")
    line = one_error_line(marl_in_process(*args, "--simulated", "--items", str(items), "--out",
                                          str(tmp_path / "r.json"), "--cache", str(tmp_path / "c.sqlite")))
    assert line.startswith(f"marl: error: {expected}"), line


def test_rm_options_past_their_bounds(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps(PAIR) + "\n")
    line = one_error_line(marl_in_process("rm", "train", "--pairs", str(pairs), "--base", str(tmp_path), "--out",
                                          str(tmp_path / "rm"), "--epochs", "1000000000"))
    assert line == "marl: error: --epochs 1000000000: at most 10,000 (each epoch passes over every training pair)"


def test_a_5000_digit_flag_is_one_argparse_line():
    line = one_error_line(marl_in_process("rollout", "relay", "--episodes", BIG))
    assert line.startswith("marl rollout: error: argument --episodes: invalid int value: '999")
    assert line.endswith("... (5,042 characters) (see marl rollout --help)") and len(line) < 400


def test_judges_outputs_that_are_a_fifo_or_a_device_are_refused_before_any_call(tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps(ITEM) + "\n")
    os.mkfifo(tmp_path / "cache")
    line = one_error_line(run_marl("judges", "report", "--simulated", "--items", str(items), "--out",
                                   str(tmp_path / "r.json"), "--cache", str(tmp_path / "cache")))
    assert line == f"marl: error: --cache {tmp_path / 'cache'}: {PIPE}; give a file path"
    # a report renamed over /dev/null would replace the device for everyone (as root)
    line = one_error_line(marl_in_process("judges", "report", "--simulated", "--items", str(items), "--out",
                                          "/dev/null", "--cache", str(tmp_path / "c.sqlite")))
    assert line == f"marl: error: --out /dev/null: {DEVICE}; give a file path"
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


@pytest.mark.parametrize("args, expected", [
    (["eval", "relay", "--retries", "1000000000"], "--retries 1000000000: at most 100 (each retry plays a failed task "
                                                   "again)"),
    (["eval", "relay", "--budgets", "8,1000000"], "--budgets 8,1000000: 1000000 is more than 32,768 tokens, the most an "
                                                  "agent may write in one turn (agents[].max_tokens)"),
    (["estimate", "relay", "--probe-steps", "1000000000"], "--probe-steps 1000000000: at most 1,000 (a probe times a "
                                                           "few steps to project the whole run"),
])
def test_command_counts_past_their_bounds(args, expected, tmp_path):
    line = one_error_line(marl_in_process(*args, cwd=tmp_path))
    assert line.startswith(f"marl: error: {expected}"), line
    assert list(tmp_path.iterdir()) == []  # refused before anything is written
