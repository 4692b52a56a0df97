"""Hostile scenario files and flags through the real `marl` command: one located line, exit 2, no traceback.

Each case writes real files into a temporary folder and runs the `marl` command on them, in this process
(helpers.inprocess); the assertion is on the whole of stderr (exactly one line: where, what, and the fix).
A generator that never returns runs in a fresh interpreter (`python -m trainers.cli.main`): its thread
cannot be stopped and spins until its process exits.
"""

import os
import time

import pytest

from marl.env import make_env
from helpers.scenario_files import GOOD  # one minimal sound scenario for both files
from helpers.cli import one_error_line, run_marl
from helpers.inprocess import marl_in_process
from helpers.paths import ROOT

GENERATED = GOOD.replace('  inline:\n    - prompt: "1+1="\n      answer: "2"\n', "  generator: gen_lib:{name}\n"
                                                                            "  timeout_s: 1\n")
GENERATORS = """\
def hang(seed, count):
    while True:
        pass


def ints(seed, count):
    return [1, 2, 3]


def text(seed, count):
    return "abc"
"""
BOMB = 'meta0: &a0 ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"meta{i + 1}: &a{i + 1} [{','.join([f'*a{i}'] * 9)}]\n" for i in range(9))


def _with(old: str, new: str, text: str = GOOD) -> str:
    assert old in text
    return text.replace(old, new, 1)


# name -> (file contents (str or bytes), extra files, the expected stderr line after "FILE")
FILES = {
    "end_on_unclosed": (_with("  order: topological\n", "  order: topological\n  end_on: \"(a\"\n"), {},
                        ":8:3: graph.end_on: pattern '(a' is not a valid regular expression for RE2 (missing ): (a)"),
    "end_on_backreference": (_with("  order: topological\n", "  order: topological\n  end_on: '(a)\\1'\n"), {},
                             ":8:3: graph.end_on: pattern '(a)\\\\1' is not a valid regular expression for RE2 "
                             "(invalid escape sequence: \\1); RE2 has no backreferences or lookaround"),
    "generator_hangs": (GENERATED.format(name="hang"), {"gen_lib.py": GENERATORS},
                        ":9:3: tasks.generator: gen_lib:hang did not return within 1 s (make it faster, or raise "
                        "tasks.timeout_s)"),
    "generator_import_hangs": (GENERATED.format(name="ints"), {"gen_lib.py": "while True:\n    pass\n" + GENERATORS},
                               ":9:3: tasks.generator: importing the module of gen_lib:ints did not finish within 1 s "
                               "(look for code that runs at import; or raise tasks.timeout_s)"),
    "generator_ints": (GENERATED.format(name="ints"), {"gen_lib.py": GENERATORS},
                       ":9:3: tasks.generator: gen_lib:ints returned 1 (of type int) as task 0; it must return a "
                       "list of task mappings such as {prompt: '1+1=', answer: '2'}"),
    "generator_string": (GENERATED.format(name="text"), {"gen_lib.py": GENERATORS},
                         ":9:3: tasks.generator: gen_lib:text returned 'abc' (of type str); it must return a list "
                         "of task mappings"),
    "rounds_huge": (_with("  order: topological\n", "  order: topological\n  rounds: 1000000000\n"), {},
                    ":8:3: graph.rounds: Input should be less than or equal to 1000 (got 1000000000)"),
    "alias_bomb": (GOOD + BOMB, {}, ":20:1: meta5: the document expands to more than 300000 values (YAML aliases such as "
                                    "*name repeat their anchor's value: remove the nested aliases)"),
    "duplicate_key": (_with("rewards:\n", "name: again\nrewards:\n"), {},
                      ":12:1: name: duplicate key 'name' (first given at line 1; keep one)"),
    "latin1": (_with("name: tiny", "name: tiny\ndescription: café").encode("latin-1"), {},
               ":2:17: (file): the file is not UTF-8 (byte 0xe9; perhaps latin-1 or cp1252): save it as UTF-8"),
    "utf16": (GOOD.encode("utf-16"), {}, ":1:1: (file): the file is UTF-16 text; save it as UTF-8"),
    "binary": (bytes(range(256)) * 4, {}, ":1:1: (file): the file is binary (a NUL byte), not YAML text"),
    "yaml_date": (_with("name: tiny", "name: tiny\ndescription: 2024-01-01"), {},
                  ":2:14: description: '2024-01-01' is read by YAML as a date/time, which scenarios do not use "
                  "(quote it if you mean text: \"2024-01-01\")"),
    "yaml_binary": (_with("name: tiny", "name: tiny\ndescription: !!binary aGVsbG8="), {},
                    ":2:14: description: !!binary values are not supported (write the value as text)"),
    "complex_key": (_with("name: tiny", "name: tiny\n? [a, b]\n: c"), {},
                    ":2:3: (file): a key must be plain text, not a list"),
    "bool_key": (_with("name: tiny", "name: tiny\nyes: 1"), {},
                 ":2:1: (file): key 'yes' is read by YAML as bool True, but keys must be text (quote it: 'yes')"),
    "deep_nesting": (_with("name: tiny", "name: tiny\ndescription: " + "[" * 3000 + "]" * 3000), {},
                     ":2:77: (file): nesting deeper than 64 levels"),
    "too_large": (GOOD + "# " + "x" * (2 << 20) + "\n", {}, f":1:1: (file): the file is {len(GOOD) + 3 + (2 << 20):,} "
                                                            "bytes; scenario files are limited to 1,048,576"),
    "unclosed_flow": (_with("  edges: [[a, b]]", "  edges: [[a, b]"), {},
                      ":6:10: (file): YAML syntax error: the flow sequence that begins here is not closed"),
    "unclosed_quote": (_with('prompt: "1+1="', 'prompt: "1+1='), {},
                       ":10:15: (file): YAML syntax error: the quoted string that begins here runs on to line 11"),
    "lr_inf": (GOOD + "train:\n  lr: .inf\n", {}, ":16:3: train.lr: Input should be a finite number (got inf)"),
    "template_unknown_field": (_with("  - name: a\n", "  - name: a\n    observation: \"{nosuch}\"\n"), {},
                               ":4:5: agents.0.observation: unknown field {nosuch} (fields: {prompt}, {role}"),
    "template_huge_width": (_with("  - name: a\n", "  - name: a\n    observation: \"{prompt:>2000000000}\"\n"), {},
                            ":4:5: agents.0.observation: {prompt:>2000000000}: width 2,000,000,000 is too large "
                            "(at most 10,000)"),
    "template_attribute": (_with("  - name: a\n", "  - name: a\n    observation: \"{prompt.__class__}\"\n"), {},
                           ":4:5: agents.0.observation: unknown field {prompt.__class__}"),
    "template_dunder": (_with("  - name: a\n", "  - name: a\n    observation: \"{task.__class__}\"\n"), {},
                        ":4:5: agents.0.observation: unknown field {task.__class__}"),
    "tool_timeout_huge": (GOOD + "tools:\n  - name: root\n    function: math:sqrt\n    timeout_s: 1.0e9\n", {},
                          ":18:5: tools.0.timeout_s: Input should be less than or equal to 600 (got '1.0e9')"),
    "regex_scorer_lookahead": (_with("    - kind: exact", "    - kind: regex\n      pattern: '(?=2)2'"), {},
                               ":14:7: rewards.outcome.0: regex: pattern '(?=2)2' is not a valid regular expression "
                               "for RE2 (invalid perl operator: (?=)"),
    "sql_database_text": (_with("    - kind: exact", "    - kind: sql\n      database: data.sqlite"),
                          {"data.sqlite": "not a database\n"},
                          ":15:7: rewards.outcome.0.database: database 'data.sqlite' is not an SQLite file"),
}
for module, function in (("os", "system"), ("subprocess", "run"), ("builtins", "eval"), ("shutil", "rmtree")):
    FILES[f"tool_{module}"] = (GOOD + f"tools:\n  - name: shell\n    function: {module}:{function}\n", {},
                               f":17:5: tools.0.function: tool function '{module}:{function}' must be defined in a "
                               f".py file in the scenario's folder")
FILES["tool_reexport"] = (GOOD + "tools:\n  - name: shell\n    function: evil_lib:system\n",
                          {"evil_lib.py": "from os import system\n"},
                          ":17:5: tools.0.function: tool function 'evil_lib:system' must be defined in a .py file "
                          "in the scenario's folder")


# a generator that never returns (or whose import never finishes) leaves a thread spinning for the rest of
# its process: those cases run in a fresh interpreter, every other case in this one
HANGS = {"generator_hangs", "generator_import_hangs"}


def _marl(*args, cwd=None, timeout=120):
    return run_marl(*args, cwd=cwd, timeout=timeout)


def _marl_on(name, *args):
    """The command on hostile case `name`: in a subprocess when the case hangs, else in this process."""
    return _marl(*args) if name in HANGS else marl_in_process(*args)


def _write_case(tmp_path, name):
    contents, extra, expected = FILES[name]
    path = tmp_path / "scenario.yaml"
    (path.write_bytes if isinstance(contents, bytes) else path.write_text)(contents)
    for file, text in extra.items():
        (tmp_path / file).write_text(text)
    return path, expected


@pytest.mark.parametrize("name", sorted(FILES))
def test_validate_reports_a_hostile_file_in_one_located_line(name, tmp_path):
    path, expected = _write_case(tmp_path, name)
    line = one_error_line(_marl_on(name, "validate", str(path)))  # marl's own limits answer: nothing hangs
    assert line.startswith(f"{path}{expected}"), line


@pytest.mark.parametrize("name", ["generator_hangs", "template_huge_width", "tool_os"])
def test_rollout_refuses_the_same_files(name, tmp_path):
    path, expected = _write_case(tmp_path, name)
    assert one_error_line(_marl_on(name, "rollout", str(path), "--policy", "null")).startswith(f"{path}{expected}")


SET_CASES = [
    ("name.x=1", "name.x: --set 'name.x=1': name is a str ('relay'), not a section with keys; set name=VALUE "
                 "instead"),
    ("agents.9.name=z", "agents.9.name: --set 'agents.9.name=z': agents is a list of 3 entries (indices 0-2); 9 is "
                        "not one of them"),
    ("train.lr=[1", "train.lr: --set 'train.lr=[1': the value is not valid YAML (YAML syntax error: the flow "
                    "sequence that begins here is not closed"),
    ("train.lr=.inf", "train.lr: Input should be a finite number (got inf)"),
    ("agents.0.observation='{nosuch}'", "agents.0.observation: unknown field {nosuch}"),
]


@pytest.mark.parametrize("command", ["validate", "rollout", "credit"])
@pytest.mark.parametrize("setting,expected", SET_CASES)
def test_bad_set_paths_are_one_line_in_play_commands(command, setting, expected):
    line = one_error_line(marl_in_process(command, "relay", "--set", setting))
    key = setting.split("=")[0]
    assert line.startswith(f"{_relay()} (--set {key}):0:0: {expected}"), line


def _relay() -> str:
    root = str(ROOT)
    return os.path.join(root, "scenarios", "relay.yaml")


@pytest.mark.parametrize("command", ["run", "eval", "estimate"])
def test_bad_set_paths_are_one_line_in_model_commands(command, tmp_path):
    extra = ["--out", str(tmp_path / "run")] if command == "run" else []
    line = one_error_line(marl_in_process(command, "relay", "--set", "agents.9.name=z", *extra))
    assert line.startswith(f"{_relay()} (--set agents.9.name):0:0: agents.9.name: --set 'agents.9.name=z': agents "
                           "is a list of 3 entries"), line
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_run_refuses_a_template_before_building_anything(tmp_path):
    path, expected = _write_case(tmp_path, "template_unknown_field")
    line = one_error_line(marl_in_process("run", str(path), "--out", str(tmp_path / "run")))
    assert line.startswith(f"{path}{expected}") and not (tmp_path / "run").exists()


@pytest.mark.parametrize("args,expected", [
    (["credit", "relay", "--episodes", "0"], "marl: error: --episodes 0: expected 1 or more"),
    (["rollout", "relay", "--episodes", "-1"], "marl: error: --episodes -1: expected 1 or more"),
    (["credit", "relay", "--budget", "0"], "credit.budget: Input should be greater than or equal to 1"),
    (["demo", "--steps", "0"], "(--set train.steps):0:0: train.steps: Input should be greater than or equal to 1"),
    (["demo", "--set", "train.lr.x=1"], "train.lr is a float (5e-05), not a section with keys; set train.lr=VALUE "
                                        "instead"),
    (["demo", "--set", "train.lr=inf"], "(--set train.lr):0:0: train.lr: Input should be a finite number (got 'inf')"),
    (["demo", "--set", "train.lr=[1"], "train.lr: --set 'train.lr=[1': the value is not valid YAML"),
])
def test_bad_flags_are_one_line(args, expected, tmp_path):
    if args[0] == "demo":
        args = [*args, "--out", str(tmp_path / "demo")]
    line = one_error_line(marl_in_process(*args))
    assert expected in line, line
    assert not (tmp_path / "demo").exists()  # refused before the run directory is made


def test_a_backtracking_end_on_matches_adversarial_text_in_linear_time():
    spec = {"name": "t", "agents": [{"name": "a"}], "graph": {"rounds": 3, "end_on": "(a+)+$"},
            "tasks": {"inline": [{"prompt": "p", "answer": "x"}]}, "rewards": {"outcome": [{"kind": "exact"}]},
            "action_max_chars": 4096}
    env = make_env(spec)
    env.reset(seed=0)
    assert type(env._end_on).__module__.startswith("re2")  # linear time by construction: no backtracking engine
    _, _, terminations, _, _ = env.step({"a": "a" * 4000 + "b"})  # Python's re would backtrack for ages
    assert not terminations["a"]
    _, _, terminations, _, _ = env.step({"a": "aaaa"})
    assert terminations["a"]  # a message that fully matches still ends the episode


def test_a_huge_turn_schedule_is_never_built():
    spec = {"name": "t", "agents": [{"name": "a"}, {"name": "b"}], "graph": {"rounds": 1000},
            "tasks": {"inline": [{"prompt": "p", "answer": "x"}]}, "rewards": {"outcome": [{"kind": "exact"}]}}
    env = make_env(spec)
    assert len(env.turns) == 2000 and env.turns[1999] == ("b",) and len(env.turns.one_round) == 2


def test_sound_templates_tools_and_overrides_are_still_accepted(tmp_path):
    (tmp_path / "calc_lib.py").write_text("def add(a: int, b: int) -> int:\n    return a + b\n")
    text = _with("  - name: a\n", "  - name: a\n    tools: [add, root]\n    observation: \"{role!r:>20}|{task.x}|"
                                  "{msg.b}|{{literal}}|{prompt}\"\n")
    text = _with('      answer: "2"\n', '      answer: "2"\n      metadata: {x: "7"}\n', text)  # {task.x} is a key tasks have
    text += ("tools:\n  - name: add\n    function: calc_lib:add\n  - name: root\n    function: math:sqrt\n"
             "train:\n  lr: 1.0e-4\n")
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    from marl.scenario.load import load_scenario

    scenario = load_scenario(path, ["train.steps=7", "agents.1.role=critic", "credit.unions.left=[a]"])
    assert scenario.spec.train.steps == 7 and scenario.spec.agents[1].role == "critic"
    env = make_env(scenario)
    observations, _ = env.reset(seed=0)
    assert observations["a"]["text"].endswith("|7||{literal}|1+1=")
    assert env.tools["a"].get("root").function(9.0) == 3.0


def test_a_generator_within_its_timeout_yields_at_most_count_tasks():
    from marl.scenario.checks import GeneratorProblem, run_generator

    def endless(seed, count):
        index = 0
        while True:
            yield {"prompt": f"{seed}-{index}"}
            index += 1

    tasks = run_generator(endless, "lib:endless", seed=3, count=5, timeout_s=5)
    assert [t["prompt"] for t in tasks] == ["3-0", "3-1", "3-2", "3-3", "3-4"]
    with pytest.raises(GeneratorProblem, match=r"^lib:slow did not return within 0.2 s"):
        run_generator(lambda seed, count: time.sleep(5), "lib:slow", seed=0, count=1, timeout_s=0.2)


def test_a_scripted_policy_that_raises_is_one_line():
    line = one_error_line(marl_in_process("rollout", "relay", "--policy", "os:system", "--episodes", "1"))
    assert line.startswith("marl: error: policy 'os:system' raised TypeError: ")  # the rest is Python's wording
    assert line.endswith("(a policy is called as function(agent, observation, task) and returns the agent's message)")
