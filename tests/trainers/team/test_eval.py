"""`marl eval`: held-out metrics at temperature 0, on scripted teams with known answers and on a real checkpoint."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from marl.scenario.load import load_scenario
from trainers.policy.actors import build_actors
from trainers.cli.main import main
from trainers.checkpoint_eval import load_actors
from trainers.records.layout import resolve_checkpoint
from marl.rollout import EpisodePlayer
from trainers.team.evaluation import evaluate_scenario, evaluate_team, write_eval_report

METRICS = {"pass_rate", "first_try_success", "tool_call_validity", "format_compliance", "paraphrase_robustness",
           "effective_reasoning_rate"}
EXPERTS = ["agents.0.policy=expert", "agents.1.policy=expert", "agents.2.policy=expert"]

# A probe scenario: the solver adds `a+b=` exactly as written, fails on any other wording
# (writing '?'), and always succeeds once it is told to retry. The chatter hears the solver, says 'hi',
# and its message reaches no one.
PROBE_LIB = '''
import re


def solver(agent, observation, task):
    if observation.startswith("retry:"):
        return task.answer
    match = re.fullmatch(r"(\\d+)\\+(\\d+)=", observation)
    return str(int(match.group(1)) + int(match.group(2))) if match else "?"


def chatter(agent, observation, task):
    return "hi"
'''

PROBE_YAML = """
name: probe
mode: cooperative
agents:
  - name: solver
    policy: probe_lib:solver
    observation: "{prompt}"
  - name: chatter
    policy: probe_lib:chatter
    observation: "{prompt}"
graph:
  edges: [[solver, chatter]]
tasks:
  eval_count: 4
  inline:
    - {id: train, prompt: "1+2=", answer: "3"}
    - {id: agree-fail, prompt: "1+1 =", answer: "2", variants: ["what is 1+1?"]}
    - {id: disagree, prompt: "2+3=", answer: "5", variants: ["what is 2+3?", "2+3="]}
    - {id: same-words, prompt: "4+4=", answer: "8", variants: ["4+4="]}
    - {id: plain, prompt: "6+1=", answer: "7"}
rewards:
  answer_from: solver
  outcome:
    - kind: exact
  format:
    - kind: regex
      pattern: "[0-9]+"
credit:
  method: shapley
"""


def _sets(overrides: list[str]) -> list[str]:
    return [argument for override in overrides for argument in ("--set", override)]


def _player(source, overrides=()):
    scenario = load_scenario(source, list(overrides))
    actors, seats = build_actors(scenario, None)
    return EpisodePlayer(scenario, actors, seats), scenario.split()[1]


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "probe_lib.py").write_text(PROBE_LIB)
    path = tmp_path / "probe.yaml"
    path.write_text(textwrap.dedent(PROBE_YAML))
    return path


def test_expert_relay_team_gets_full_marks_and_equal_credit():
    player, tasks = _player("relay", [*EXPERTS, "tasks.eval_count=12", "credit.absent=null_message"])
    result = evaluate_scenario(player, tasks)
    metrics = result["metrics"]
    assert set(metrics) == METRICS
    assert metrics["pass_rate"] == metrics["first_try_success"] == 1.0
    assert metrics["format_compliance"] == 1.0
    assert metrics["effective_reasoning_rate"] == 1.0
    assert metrics["tool_call_validity"] is None  # relay has no tools
    for agent in ("left", "right", "final"):  # each is pivotal: Shapley gives 1/3 of the team reward
        assert result["credit"]["agents"][agent]["value"] == pytest.approx(1 / 3)
        assert result["credit"]["agents"][agent]["share"] == pytest.approx(1 / 3)
    assert result["credit"]["successful_episodes"] == 12


def test_against_an_expert_stand_in_an_expert_team_earns_no_credit():
    """relay's own credit replaces an absent agent by the expert: an expert is no better than itself,
    while effective reasoning (silencing an agent) still finds every message necessary."""
    player, tasks = _player("relay", [*EXPERTS, "tasks.eval_count=6"])
    result = evaluate_scenario(player, tasks)
    assert result["credit"]["absent"] == "default_policy"
    assert all(result["credit"]["agents"][a]["value"] == 0.0 for a in ("left", "right", "final"))
    assert all(result["credit"]["agents"][a]["share"] == 0.0 for a in ("left", "right", "final"))  # nothing to split
    assert result["metrics"]["effective_reasoning_rate"] == 1.0


def test_relay_variants_reach_the_agents_through_metadata():
    """Relay's variants hand the pairs to the other agent or swap operands (metadata overrides): the
    agents see new observations, and an expert team agrees with itself on every wording."""
    player, tasks = _player("relay", [*EXPERTS, "tasks.eval_count=5"])
    paraphrase = evaluate_scenario(player, tasks, credit=False)["paraphrase"]
    assert paraphrase["tasks_with_variants"] == 5 and paraphrase["wordings_played"] == 10
    assert paraphrase["tasks_reached"] == 5 and paraphrase["variant_success"] == 1.0
    swapped = tasks[0].variant(0)
    assert (swapped.metadata["left"], swapped.metadata["right"]) == (tasks[0].metadata["right"],
                                                                     tasks[0].metadata["left"])
    assert swapped.answer == tasks[0].answer and swapped.variants == ()


def test_a_silent_agent_fails_every_task_and_takes_the_blame():
    player, tasks = _player("relay", [*EXPERTS[:2], "agents.2.policy='null'", "tasks.eval_count=6"])
    result = evaluate_scenario(player, tasks)
    metrics = result["metrics"]
    assert metrics["pass_rate"] == metrics["first_try_success"] == 0.0
    assert metrics["format_compliance"] == 0.0
    assert metrics["effective_reasoning_rate"] is None  # no successful episode to judge
    credit = result["credit"]["agents"]  # against an expert stand-in, the silent agent takes all the blame
    assert credit["left"]["value"] == credit["right"]["value"] == 0.0 and credit["final"]["value"] == -1.0
    assert credit["final"]["share"] == -1.0  # logged whatever the sign: all the (negative) credit is its
    assert [row["solved"] for row in result["per_task"]] == [0.0] * 6


def test_retries_separate_pass_rate_from_first_try_success(probe):
    player, tasks = _player(probe)
    with_retry = evaluate_scenario(player, tasks, retries=1)["metrics"]
    assert with_retry["first_try_success"] == 0.75  # '1+1 =' is misread on the first try
    assert with_retry["pass_rate"] == 1.0
    assert with_retry["format_compliance"] == 0.75
    no_retry = evaluate_scenario(player, tasks, retries=0)["metrics"]
    assert no_retry["pass_rate"] == no_retry["first_try_success"] == 0.75


def test_paraphrase_robustness_counts_only_wordings_agents_saw(probe):
    player, tasks = _player(probe)
    result = evaluate_scenario(player, tasks)
    assert result["paraphrase"]["tasks_with_variants"] == 3
    assert result["paraphrase"]["tasks_reached"] == 2  # '4+4=' reworded as itself reaches no one
    assert result["metrics"]["paraphrase_robustness"] == 0.5  # 'agree-fail' agrees, 'disagree' does not
    rows = {row["task"]: row["variants_agree"] for row in result["per_task"]}
    assert rows == {"agree-fail": True, "disagree": False, "same-words": None, "plain": None}


def test_an_agent_nobody_hears_makes_no_episode_effective(probe):
    player, tasks = _player(probe)
    result = evaluate_scenario(player, tasks)
    assert result["metrics"]["effective_reasoning_rate"] == 0.0
    credit = result["credit"]["agents"]
    assert credit["chatter"]["value"] == 0.0
    assert credit["solver"]["value"] == pytest.approx(0.75) and credit["solver"]["share"] == 1.0


def test_weather_tool_calls_and_reworded_questions():
    player, tasks = _player("weather", ["agents.0.policy=expert"])
    result = evaluate_scenario(player, tasks[:4], credit=False)
    metrics = result["metrics"]
    assert metrics["pass_rate"] == 1.0 and metrics["tool_call_validity"] == 1.0
    assert metrics["format_compliance"] is None  # weather has no format scorers
    assert metrics["paraphrase_robustness"] == 1.0 and result["paraphrase"]["tasks_reached"] == 4
    assert result["credit"] is None and metrics["effective_reasoning_rate"] is None


def test_evaluate_team_is_unchanged_by_the_richer_evaluation():
    player, tasks = _player("relay", [*EXPERTS, "tasks.eval_count=4"])
    assert evaluate_team(player, tasks) == {"team_success": 1.0, "team_reward": 1.0, "masked_episodes": 0.0,
                                            "episodes": 4.0, "agent/left/reward": 1.0,
                                            "agent/right/reward": 1.0, "agent/final/reward": 1.0,
                                            "well_formed/left": 1.0, "well_formed/right": 1.0,
                                            "well_formed/final": 1.0, "well_formed": 1.0}


def test_reports_are_json_and_a_markdown_table(tmp_path):
    player, tasks = _player("relay", [*EXPERTS, "tasks.eval_count=3", "credit.absent=null_message"])
    json_path, md_path = write_eval_report(evaluate_scenario(player, tasks), tmp_path / "out")
    assert set(json.loads(json_path.read_text())["metrics"]) == METRICS
    markdown = md_path.read_text()
    assert "| pass_rate | 1.000 |" in markdown and "| left | 0.333 | 0.333 |" in markdown


def test_cli_evaluates_a_scripted_team(tmp_path, capsys):
    code = main(["eval", "relay", *_sets(EXPERTS), "--tasks", "5", "--out", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "pass_rate" in printed and "1.000" in printed
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["tasks"] == 5 and result["checkpoint"] == "base model"


def test_a_seat_is_played_by_another_agents_policy(tmp_path, capsys):
    # final is silent (null) and fails every task; seated with left's expert it adds what it sees
    team = ["agents.0.policy=expert", "agents.1.policy=expert", "agents.2.policy='null'"]
    common = ["eval", "relay", *_sets(team), "--tasks", "4", "--no-credit"]
    assert main([*common, "--out", str(tmp_path / "as-is")]) == 0
    assert main([*common, "--seat", "final=left", "--out", str(tmp_path / "seated")]) == 0
    printed = capsys.readouterr().out
    as_is, seated = (json.loads((tmp_path / d / "eval.json").read_text()) for d in ("as-is", "seated"))
    assert as_is["metrics"]["pass_rate"] == 0.0 and seated["metrics"]["pass_rate"] == 1.0
    assert seated["played_by"] == {"final": "left"} and as_is["played_by"] == {}
    assert "seats: final played by left's policy" in printed
    assert "final played by left's policy" in (tmp_path / "seated" / "eval.md").read_text()


def test_reseat_swaps_two_roles_and_keeps_the_others():
    from trainers.checkpoint_eval import reseat

    seats = {"left": "left", "right": "shared", "final": "final"}
    assert reseat(seats, {"left": "final", "final": "left"}) == {"left": "final", "right": "shared", "final": "left"}
    assert reseat(seats, None) == seats
    with pytest.raises(ValueError, match="'middle' is not an agent of this scenario"):
        reseat(seats, {"middle": "left"})


@pytest.mark.parametrize("arguments, message", [
    (["--seat", "final"], "--seat 'final': expected AGENT=OTHER, e.g. --seat left=final"),
    (["--seat", "final=judge"], "--seat final=judge: 'judge' is not an agent of this scenario (agents: left, right, "
                                "final)"),
    (["--seat", "final=left", "--seat", "final=right"], "--seat final=right: 'final' is seated twice"),
    (["--checkpoint", "does/not/exist"], "--checkpoint does/not/exist: no such directory"),
    (["--set", "tasks.eval_count=0"], "has no held-out tasks: set tasks.eval_count"),
])
def test_bad_input_is_one_line_and_exit_2(arguments, message, capsys):
    assert main(["eval", "relay", *arguments]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_scenario_problems_print_as_file_line_col(capsys):
    assert main(["eval", "relay", "--set", "tasks.eval_count=-1"]) == 2
    err = capsys.readouterr().err
    assert "relay.yaml (--set tasks.eval_count):0:0: tasks.eval_count:" in err and "Traceback" not in err


RUN_OVERRIDES = ["tasks.eval_count=8", "agents.0.policy=own"]  # left trains its own copy of the model


# make test (--dist loadgroup): this module's tests run on one worker, so trained_run is built once
pytestmark = pytest.mark.xdist_group("team_eval")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, demo_model_dir):
    """A 2-step `marl run relay` on the tiny model: checkpoints hold model/ (right, final) and model-left/.
    Every group has a reward spread (helpers/signal.py), so both policies train whatever the model samples."""
    from helpers.signal import with_signal

    out = tmp_path_factory.mktemp("eval") / "run"
    with pytest.MonkeyPatch.context() as patch:
        with_signal(patch)
        code = main(["run", "relay", *_sets(RUN_OVERRIDES), "--set", "train.steps=2",
                     "--set", "train.warmup.rl_steps=0", "--set", "train.prompts_per_step=2",
                     "--set", "train.group_size=2", "--tracker", "none", "--out", str(out)])
    assert code == 0
    return out


def _same_weights(model, directory) -> bool:
    from trainers.policy.tinylm import load_policy

    saved, loaded = load_policy(directory)[0].state_dict(), model.state_dict()
    return saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)


def test_checkpoint_models_replace_the_base_model(trained_run):
    step = resolve_checkpoint(str(trained_run))
    assert step.parent == trained_run / "checkpoints"
    actors, seats = load_actors(load_scenario("relay", RUN_OVERRIDES), step, None)
    assert seats == {"left": "left", "right": "shared", "final": "shared"}
    assert _same_weights(actors["shared"].model, step / "model")
    assert _same_weights(actors["left"].model, step / "model-left")
    assert not _same_weights(actors["left"].model, step / "model")  # trained apart, so they differ


def test_eval_of_a_checkpoint_is_deterministic(trained_run, tmp_path):
    common = ["eval", "relay", *_sets(RUN_OVERRIDES), "--checkpoint", str(trained_run)]
    assert main([*common, "--out", str(tmp_path / "a")]) == 0
    assert main([*common, "--out", str(tmp_path / "b")]) == 0
    first, second = ((tmp_path / d / "eval.json").read_text() for d in "ab")
    assert first == second
    result = json.loads(first)
    assert result["checkpoint"].endswith("checkpoints/step-000002") and result["tasks"] == 8
    for name, value in result["metrics"].items():
        assert value is None or 0.0 <= value <= 1.0, name
    assert result["metrics"]["format_compliance"] is not None and result["credit"] is not None


def test_eval_of_a_step_directory_writes_into_its_run(trained_run):
    step = trained_run / "checkpoints" / (trained_run / "checkpoints" / "latest").read_text().strip()
    assert main(["eval", "relay", *_sets(RUN_OVERRIDES), "--tasks", "2", "--no-credit",
                 "--checkpoint", str(step)]) == 0
    result = json.loads((trained_run / "eval.json").read_text())
    assert result["tasks"] == 2 and result["credit"] is None
    assert (trained_run / "eval.md").read_text().startswith("# marl eval: relay")


def test_a_checkpoint_no_agent_uses_is_refused(trained_run, capsys):
    assert main(["eval", "relay", *_sets(EXPERTS), "--checkpoint", str(trained_run)]) == 2
    assert "no agent of 'relay' is played by a model it holds" in capsys.readouterr().err
