"""What `marl validate` used to pass and the run then failed on, and the smaller CLI answers of issue 27
(items 6 and 8): each is one line naming where and how to fix it, exit status 2, no traceback.

The commands are called in-process (`trainers.cli.main.main`) with scripted policies: nothing trains.
"""

import ast
import inspect
import json
from types import SimpleNamespace

import pytest

from helpers.scenario_files import GOOD
from marl.scenario.load import find_scenario, load_scenario
from trainers.cli.main import main

WITH_METADATA = GOOD.replace('      answer: "2"\n', '      answer: "2"\n      metadata: {qty: 3}\n')


def _with(old: str, new: str, text: str = GOOD) -> str:
    assert old in text
    return text.replace(old, new, 1)


def _one_line(capsys, *args) -> str:
    """The command's only stderr line, after checking exit status 2 and that no traceback was printed."""
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _write(tmp_path, text: str, **extra):
    for name, contents in extra.items():
        (tmp_path / name).write_text(contents)
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


# -- template fields against the keys the tasks really have ----------------------------------------------
def test_a_task_field_no_task_has_is_located_at_its_template_with_the_keys_that_exist(tmp_path, capsys):
    path = _write(tmp_path, _with("  - name: a\n", "  - name: a\n    observation: \"{task.qtty}{prompt}\"\n",
                                  WITH_METADATA))
    line = _one_line(capsys, "validate", str(path))
    assert line == (f"{path}:4:5: agents.0.observation: {{task.qtty}}: no task has metadata key 'qtty', so it "
                    "would always be empty (did you mean {task.qty}? the tasks' keys: qty)")
    # the run's commands refuse it too (the agent would have seen `6*=`), before anything plays
    assert _one_line(capsys, "rollout", str(path), "--policy", "null") == line


def test_a_generator_is_sampled_for_its_keys(tmp_path, capsys):
    generator = "def tasks(seed, count):\n    return [{'prompt': 'p', 'answer': 'a', 'metadata': {'a': 1, 'b': 2}}] * count\n"
    text = _with('  inline:\n    - prompt: "1+1="\n      answer: "2"\n', "  generator: gen_lib:tasks\n  count: 5\n")
    ok = _write(tmp_path, _with("  - name: a\n", "  - name: a\n    observation: \"{task.a}{task.b}\"\n", text),
                **{"gen_lib.py": generator})
    assert main(["validate", str(ok)]) == 0
    capsys.readouterr()
    bad = _write(tmp_path, _with("  - name: a\n", "  - name: a\n    observation: \"{task.c}\"\n", text))
    assert _one_line(capsys, "validate", str(bad)).endswith(
        "agents.0.observation: {task.c}: no task has metadata key 'c', so it would always be empty (the tasks' "
        "keys: a, b)")


def test_a_task_field_given_by_set_is_located_at_that_set(capsys):
    line = _one_line(capsys, "validate", "relay", "--set", "agents.0.observation='{task.nothing}'")
    assert line.startswith(f"{find_scenario('relay')} (--set agents.0.observation):0:0: agents.0.observation: "
                           "{task.nothing}: no task has metadata key 'nothing'")


# -- URLs, backends and counts -----------------------------------------------------------------------------
@pytest.mark.parametrize("section,expected", [
    ("judges:\n  - {name: j, model: m, base_url: 'localhost:8000/v1'}\n",
     ":16:25: judges.0.base_url: expected an http:// or https:// URL with a host, e.g. http://localhost:8000/v1 "
     "(got 'localhost:8000/v1')"),
    ("judges:\n  - {name: j, model: m, base_url: 'http://host:port/v1'}\n",
     ":16:25: judges.0.base_url: the port of 'http://host:port/v1' is not a number"),
])
def test_a_judge_url_without_a_scheme_or_a_port_is_a_validation_error(section, expected, tmp_path, capsys):
    path = _write(tmp_path, GOOD + section)
    assert _one_line(capsys, "validate", str(path)).startswith(f"{path}{expected}")


def test_an_endpoint_policy_url_is_parsed_too(tmp_path, capsys):
    path = _write(tmp_path, _with("  - name: b\n", "  - name: b\n    policy: openai:m\n    base_url: example.com\n"))
    assert _one_line(capsys, "validate", str(path)).startswith(
        f"{path}:6:5: agents.1.base_url: expected an http:// or https:// URL with a host, e.g. http://example.com")
    assert load_scenario(_write(tmp_path, _with("example.com", "https://example.com/v1",
                                                (tmp_path / "scenario.yaml").read_text())))


def test_the_simulated_backend_is_refused_in_a_scenario_with_where_it_runs(tmp_path, capsys):
    path = _write(tmp_path, GOOD + "judges:\n  - {name: j, backend: simulated, model: m}\n")
    line = _one_line(capsys, "validate", str(path))
    assert line.startswith(f"{path}:16:15: judges.0.backend: backend 'simulated' needs a quality function, so it runs "
                           "only from Python")
    assert "marl judges report --simulated" in line and "use openai, local or reward_model" in line


def test_a_held_out_count_that_leaves_no_training_task_is_refused(tmp_path, capsys):
    path = _write(tmp_path, _with("  inline:\n", "  eval_count: 1\n  inline:\n"))
    assert _one_line(capsys, "validate", str(path)) == (
        f"{path}:9:3: tasks.eval_count: eval_count 1 holds out every one of the 1 task(s), leaving none to train "
        "on (set it to at most 0, or add tasks)")
    line = _one_line(capsys, "rollout", "relay", "--set", "tasks.count=10", "--set", "tasks.eval_count=10")
    assert line.startswith(f"{find_scenario('relay')} (--set tasks.eval_count):0:0: tasks.eval_count: eval_count 10 "
                           "holds out every one of the 10 task(s)")


# -- the --set grammar ----------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["validate", "relay"], ["run", "relay"], ["rollout", "relay"], ["demo"]])
def test_set_without_an_equals_sign_is_answered_with_the_set_grammar(command, capsys):
    line = _one_line(capsys, *command, "--set", "train.steps", "50")
    assert line == ("marl: error: --set train.steps: expected KEY=VALUE as one word (no spaces around '='; quote an "
                    "item whose value has spaces), e.g. --set train.steps=50")


def test_an_unknown_set_key_is_located_at_its_set_with_the_close_keys(capsys):
    line = _one_line(capsys, "validate", "relay", "--set", "trian.steps=5")
    assert line.startswith(f"{find_scenario('relay')} (--set trian.steps):0:0: trian: unknown key 'trian' in "
                           "--set trian.steps=5 (did you mean 'train'? allowed here: action_max_chars, agents,")
    line = _one_line(capsys, "validate", "relay", "--set", "train.stesp=5")
    assert "unknown key 'stesp' in --set train.stesp=5 (did you mean 'steps'" in line


# -- named choices, counts and help texts -------------------------------------------------------------------
def test_an_unknown_simulated_bias_is_one_line_listing_the_names(tmp_path, capsys):
    from trainers.cli.judges import SIM_BIASES

    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "q1", "prompt": "p", "candidates": ["a", "b"], "gold": 0}\n')
    line = _one_line(capsys, "judges", "report", "--simulated", "--sim-bias", "format=0.8", "--items", str(items),
                     "--out", str(tmp_path / "out" / "r.json"), "--cache", str(tmp_path / "c.sqlite"))
    assert line == ("marl: error: --sim-bias 'format=0.8': unknown bias 'format'; choose one of position, "
                    "length_slope, format_effect, authority, self_preference, master_key, leniency "
                    "(e.g. --sim-bias position=0.6)")
    assert not (tmp_path / "out").exists()  # refused before anything was created or called
    from judges.model.simulated import SimulatedClient

    assert set(SIM_BIASES) <= set(inspect.signature(SimulatedClient).parameters)  # each name is a real bias


def test_judges_help_lists_the_bias_names_and_says_what_an_items_file_holds(capsys):
    with pytest.raises(SystemExit):
        main(["judges", "report", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "one of position, length_slope, format_effect, authority, self_preference, master_key, leniency" in help_text
    items_help = help_text.split("options:", 1)[1].split("--items FILE.jsonl", 1)[1].split("--gold", 1)[0]
    assert '"candidates": ["answer 1", "answer 2"]' in items_help and "--help" not in items_help


def test_a_judge_base_url_flag_without_a_scheme_is_refused(tmp_path, capsys):
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "q1", "prompt": "p", "candidates": ["a", "b"]}\n')
    line = _one_line(capsys, "judges", "report", "--base-url", "localhost:8000/v1", "--items", str(items),
                     "--out", str(tmp_path / "r.json"), "--cache", str(tmp_path / "c.sqlite"))
    assert line == ("marl: error: --base-url localhost:8000/v1: expected an http:// or https:// URL with a host, "
                    "e.g. http://localhost:8000/v1")


def _summary(capsys, *args) -> dict:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_rollout_plays_the_episodes_asked_held_out_first_or_refuses_more_than_there_are_tasks(capsys):
    small = ["--set", "tasks.count=10", "--set", "tasks.eval_count=2", "--quiet"]
    assert _summary(capsys, "rollout", "relay", "--episodes", "7", *small)["episodes"] == 7  # 2 held out, then 5
    assert _summary(capsys, "rollout", "relay", "--episodes", "10", *small)["episodes"] == 10
    assert _one_line(capsys, "rollout", "relay", "--episodes", "11", *small) == (
        "marl: error: --episodes 11: scenario 'relay' has 10 tasks (2 held out, 8 for training) and plays each "
        "once; ask for --episodes 10 or fewer, or raise tasks.count (--set tasks.count=N)")


def test_the_default_episode_count_plays_every_task_of_a_smaller_scenario(tmp_path, capsys):
    path = _write(tmp_path, GOOD)  # one task: the default of 3 plays it once, as before, and is not refused
    assert _summary(capsys, "rollout", str(path), "--policy", "null", "--quiet")["episodes"] == 1


def test_the_warm_up_sample_keeps_the_front_of_an_error_observation():
    from trainers.stages.warmup import SAMPLE_WIDTH, show_samples

    error = "[run_tests] SyntaxError in the tests: " + "x" * 200 + " line 3: missing ')'"
    turn = SimpleNamespace(agent="tester", observation=error, text="assert f(1) == 2")
    step = SimpleNamespace(episodes=[SimpleNamespace(turns=[turn])], rewards=[{"tester": 0.0}],
                           advantages={"tester": [0.0]})
    lines = []
    show_samples(SimpleNamespace(last_step=step), 1, lines.append)
    shown = ast.literal_eval(lines[0].split("tester: ", 1)[1].split(" -> ", 1)[0])  # the observation as shown
    assert shown.startswith("[run_tests] SyntaxError") and shown.endswith("line 3: missing ')'")
    assert len(shown) <= SAMPLE_WIDTH + len(" ... ")
