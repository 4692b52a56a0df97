"""Scenario files: every problem is reported with FILE:LINE:COL and the key path, never a traceback."""

import textwrap

import pytest

from marl.scenario.load import ScenarioError, load_scenario
from helpers.inprocess import marl_in_process
from helpers.scenario_files import GOOD



def _problems(tmp_path, text, overrides=()):
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path, list(overrides))
    return [str(p) for p in caught.value.problems], str(path)


def test_the_good_file_loads(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(GOOD)
    scenario = load_scenario(path)
    assert scenario.agent_names == ["a", "b"] and scenario.tasks()[0].answer == "2"


def test_unknown_key_names_line_path_and_the_allowed_keys(tmp_path):
    problems, file = _problems(tmp_path, GOOD.replace("  - name: b\n", "  - name: b\n    tols: [x]\n"))
    assert problems == [f"{file}:5:5: agents.1.tols: unknown key 'tols' (did you mean 'tools'? remove it or fix its spelling; "
                        "allowed here: api_key_env, base_url, chat_template, max_tokens, name, observation, policy, role, tools, "
                        "trainable)"]


def test_missing_key(tmp_path):
    problems, file = _problems(tmp_path, GOOD.replace('      answer: "2"\n', "").replace('    - prompt: "1+1="\n',
                                                                                         '    - answer: "2"\n'))
    assert problems == [f"{file}:10:7: tasks.inline.0.prompt: required key 'prompt' is missing (add it)"]


def test_wrong_type(tmp_path):
    problems, file = _problems(tmp_path, GOOD.replace("  - name: a\n", "  - name: a\n    max_tokens: many\n"))
    assert len(problems) == 1 and problems[0].startswith(f"{file}:4:5: agents.0.max_tokens: Input should be a valid "
                                                         "integer")
    assert "(got 'many')" in problems[0]


def test_unknown_agent_in_the_graph(tmp_path):
    problems, file = _problems(tmp_path, GOOD.replace("[[a, b]]", "[[a, c]]"))
    assert problems == [f"{file}:6:15: graph.edges.0.1: unknown agent 'c' (known agents: a, b)"]


def test_cycle_where_a_dag_is_needed(tmp_path):
    problems, _ = _problems(tmp_path, GOOD.replace("[[a, b]]", "[[a, b], [b, a]]"))
    assert len(problems) == 1 and "graph.order: order 'topological' needs a DAG" in problems[0]
    assert ":7:3:" in problems[0]


def test_isolated_agent(tmp_path):
    text = GOOD.replace("  - name: b\n", "  - name: b\n  - name: loner\n")
    problems, _ = _problems(tmp_path, text)
    assert any("agent 'loner' is isolated" in p for p in problems)


def test_bad_import_path(tmp_path):
    text = GOOD.replace("  inline:\n    - prompt: \"1+1=\"\n      answer: \"2\"\n", "  generator: nowhere:tasks\n")
    problems, file = _problems(tmp_path, text)
    assert problems == [f"{file}:9:3: tasks.generator: cannot import 'nowhere:tasks': module nowhere not found "
                        f"(looked in {tmp_path} and sys.path) (fix the 'module:function' path)"]


def test_yaml_syntax_error(tmp_path):
    problems, file = _problems(tmp_path, GOOD.replace("  edges: [[a, b]]", "  edges: [[a, b]"))
    assert problems == [f"{file}:6:10: (file): YAML syntax error: the flow sequence that begins here is not closed "
                        "(expected ',' or ']', but got '<scalar>' at line 7 column 3); close it"]


def test_every_problem_is_reported_at_once(tmp_path):
    text = GOOD.replace("  - name: a\n", "  - name: a\n    colour: red\n    max_tokens: 0\n")
    problems, _ = _problems(tmp_path, text)
    assert len(problems) == 2


def test_overrides_are_validated_and_located(tmp_path):
    problems, file = _problems(tmp_path, GOOD, ["train.lr=-1"])
    assert problems[0].startswith(f"{file} (--set train.lr):0:0: train.lr: Input should be greater than 0")
    path = tmp_path / "scenario.yaml"
    assert load_scenario(path, ["train.lr=0.001"]).spec.train.lr == 0.001


def test_unknown_scorer_kind_and_bad_params(tmp_path):
    problems, _ = _problems(tmp_path, GOOD.replace("kind: exact", "kind: exakt"))
    assert len(problems) == 1 and "rewards.outcome.0.kind: unknown scorer kind 'exakt'" in problems[0]


def test_cli_validate_prints_problems_and_exits_2_without_traceback(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(GOOD.replace("[[a, b]]", "[[a, c]]"))
    result = marl_in_process("validate", str(path), "scenarios/relay.yaml")  # from the repository
    assert result.returncode == 2
    assert f"{path}:6:15: graph.edges.0.1: unknown agent 'c'" in result.stderr
    assert "scenarios/relay.yaml: ok" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_a_generator_that_raises_is_reported_not_a_traceback(tmp_path):
    (tmp_path / "gen.py").write_text("def tasks(seed, count):\n    raise RuntimeError('no data')\n")
    text = GOOD.replace("  inline:\n    - prompt: \"1+1=\"\n      answer: \"2\"\n", "  generator: gen:tasks\n")
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    scenario = load_scenario(path)
    with pytest.raises(ScenarioError, match=r"tasks.generator: gen:tasks raised RuntimeError: no data"):
        scenario.tasks()
    result = marl_in_process("validate", str(path))
    assert result.returncode == 2 and "raised RuntimeError" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args,message", [
    (["rollout", "no_such_scenario"], "no scenario file 'no_such_scenario'"),
    (["credit", "debate", "--episodes", "1"], "credit splits a team reward"),
    (["rollout", "relay", "--policy", "clever"], "unknown policy 'clever'"),
    (["rollout", "relay", "--policy", "clever"], "or a model directory (a path to a Hugging Face causal LM"),
    (["credit", "relay", "--policy", "clever"], "unknown policy 'clever': use expert, null, random or a "
                                               "'module:function'"),
])
def test_play_commands_report_bad_input_in_one_line(args, message):
    result = marl_in_process(*args)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
