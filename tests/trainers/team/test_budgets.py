"""The thinking-budget curve (`marl eval --budgets`, `train.budget_curve`): a team whose answers need a
known number of tokens gives a known, monotone curve; the real command writes the curve's files; a
malformed list is one line and exit 2, with nothing written."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass

import pytest
import torch

from helpers.cli import one_error_line
from helpers.inprocess import marl_in_process
from marl.rollout import EpisodePlayer, Generation
from marl.scenario.load import load_scenario
from trainers.cli.main import main
from trainers.team.budgets import budget_curve, budget_markdown, parse_budgets, write_budget_curve

BUDGETS = [1, 2, 3, 4, 8]

SPELL_YAML = """
name: spell
mode: cooperative
agents:
  - name: solver
    policy: "null"
    observation: "{{prompt}}"
    max_tokens: 4
tasks:
  eval_count: {count}
  inline:
    - {{id: train, prompt: "a", answer: "1"}}
{tasks}
rewards:
  answer_from: solver
  outcome:
    - kind: exact
"""


@dataclass
class Written:
    """The two fields of a model's Completions the curve reads: tokens up to and including the stop
    token, and whether no stop token came within the budget."""

    completion_mask: torch.Tensor
    truncated: torch.Tensor


class Speller:
    """A frozen actor whose answer (the task's answer) needs one token per character: it writes as much
    of it as the budget allows, then its stop token when there is room left for one."""

    trainable = False

    def act(self, requests, *, max_new_tokens, greedy=False, keys=None) -> Generation:
        answers = [task.answer for _, _, task in requests]
        cut = [len(answer) >= max_new_tokens for answer in answers]
        mask = torch.zeros((len(answers), max_new_tokens), dtype=torch.long)
        for row, answer in enumerate(answers):
            mask[row, :min(len(answer) + 1, max_new_tokens)] = 1
        return Generation([answer[:max_new_tokens] for answer in answers], Written(mask, torch.tensor(cut)))


def _spelling_player(tmp_path, answers: list[str]):
    tasks = "\n".join(f'    - {{id: t{k}, prompt: "q{k}", answer: "{a}"}}' for k, a in enumerate(answers))
    path = tmp_path / "spell.yaml"
    path.write_text(textwrap.dedent(SPELL_YAML.format(count=len(answers), tasks=tasks)))
    scenario = load_scenario(path)
    return EpisodePlayer(scenario, {"speller": Speller()}, {"solver": "speller"}), scenario.split()[1]


def _column(curve: dict, name: str) -> list:
    return [row[name] for row in curve["rows"]]


def test_an_answer_of_n_tokens_fails_below_n_and_succeeds_from_n_on(tmp_path):
    player, tasks = _spelling_player(tmp_path, ["357", "802", "111"])  # every answer needs N = 3 tokens
    curve = budget_curve(player, tasks, BUDGETS)
    success = _column(curve, "team_success")
    assert success == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert success == sorted(success)  # monotone
    assert _column(curve, "tokens_per_turn") == [1.0, 2.0, 3.0, 3.0, 3.0]
    assert _column(curve, "at_budget") == [1.0, 1.0, 1.0, 0.0, 0.0]  # at 3 tokens no room is left to stop
    assert _column(curve, "model_turns") == [3] * 5 and _column(curve, "capped") == [{}] * 5


def test_answers_of_several_lengths_give_a_staircase(tmp_path):
    player, tasks = _spelling_player(tmp_path, ["7", "42", "357", "1234"])
    curve = budget_curve(player, tasks, [8, 3, 1, 4, 2])  # played in increasing order
    assert _column(curve, "budget") == BUDGETS
    assert _column(curve, "team_success") == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert _column(curve, "team_reward") == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert _column(curve, "tokens_per_turn") == [1.0, 1.75, 2.25, 2.5, 2.5]
    assert _column(curve, "at_budget") == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert curve["tasks"] == 4 and curve["default_max_tokens"] == {"solver": 4}
    assert player.max_tokens == {"solver": 4} and isinstance(player.actors["speller"], Speller)  # left as found


def test_the_reports_hold_the_curve(tmp_path):
    player, tasks = _spelling_player(tmp_path, ["7", "42"])
    curve = {**budget_curve(player, tasks, [1, 2]), "checkpoint": "base model"}
    json_path, md_path, png_path = write_budget_curve(curve, tmp_path / "out")
    assert json.loads(json_path.read_text()) == curve
    markdown = md_path.read_text()
    assert "| 1 | 0.500 | 0.500 | 1.00 | 1.000 |" in markdown and "| 2 | 1.000 | 1.000 | 1.50 | 0.500 |" in markdown
    assert "![thinking-budget curve](budget_curve.png)" in markdown
    assert png_path.read_bytes().startswith(b"\x89PNG")
    assert not list((tmp_path / "out").glob(".*"))  # no temporary file left behind


def test_a_budget_past_the_models_context_is_capped(tmp_path, micro_policy):
    from trainers.policy.actors import ModelActor
    from trainers.policy.prompts import agent_styles

    player, tasks = _spelling_player(tmp_path, ["12", "34"])
    model, tokenizer = micro_policy()  # 32 positions
    styles = agent_styles(player.scenario.spec)
    actor = ModelActor("shared", model, tokenizer, styles=styles)
    player = EpisodePlayer(player.scenario, {"shared": actor}, {"solver": "shared"})
    curve = budget_curve(player, tasks, [4, 1000])
    small, large = curve["rows"]
    assert small["capped"] == {} and large["capped"] == {"solver": 31}  # one prompt token, 31 answer tokens
    assert small["model_turns"] == large["model_turns"] == 2
    assert 0 <= small["tokens_per_turn"] <= 4 and 0 <= large["tokens_per_turn"] <= 31
    assert actor.styles == styles and actor.styles["solver"].max_tokens == 4  # its prompts fitted for 4 again
    assert "Capped by the model's context: 1000 (solver 31)." in budget_markdown(curve)


@pytest.mark.parametrize("text, problem", [
    ("8,x,32", "'x' is not a whole number of tokens"),
    ("8.5", "'8.5' is not a whole number of tokens"),
    ("0,8", "0 is below 1"),
    ("8,-4", "-4 is below 1"),
    ("8,16,8", "8 is given twice"),
    ("", "no budget given"),
    ("8,,16", "an empty item between commas"),
])
def test_a_malformed_budget_list_is_one_line_naming_the_problem_and_the_fix(text, problem, tmp_path, capsys):
    with pytest.raises(ValueError, match=problem):
        parse_budgets(text)
    assert main(["eval", "relay", "--budgets", text, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("marl: error: --budgets ") and problem in err[0]
    assert "e.g. --budgets 8,16,32" in err[0]
    assert not (tmp_path / "out").exists()


def test_the_command_refuses_a_malformed_list_before_anything_loads(tmp_path):
    line = one_error_line(marl_in_process("eval", "relay", "--budgets", "16,8,16", "--out", str(tmp_path / "out")))
    assert line == "marl: error: --budgets 16,8,16: 16 is given twice; list each budget once, e.g. --budgets 8,16,32"
    assert not (tmp_path / "out").exists()


def test_parse_budgets_sorts_and_strips():
    assert parse_budgets(" 32, 8,16 ") == [8, 16, 32]


def test_the_train_setting_is_off_by_default_and_checked():
    from marl.scenario.load import ScenarioError

    assert load_scenario("relay").spec.train.budget_curve == []
    assert load_scenario("relay", ["train.budget_curve=[16, 8]"]).spec.train.budget_curve == [8, 16]
    for bad, says in (("[8, 8]", "each budget at most once"), ("[0]", "greater than or equal to 1")):
        with pytest.raises(ScenarioError, match=says):
            load_scenario("relay", [f"train.budget_curve={bad}"])


def test_marl_eval_writes_the_curve_of_the_base_model(tmp_path, demo_model_dir):
    """The real command on the default tiny model: at relay's own budget (4 tokens) the curve's team
    success is eval.json's first-try success (the same tasks, seeds and greedy decoding)."""
    result = marl_in_process("eval", "relay", "--budgets", "4,16", "--tasks", "4", "--no-credit", "--retries", "0",
                             "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "thinking-budget curve (4 held-out tasks, temperature 0):" in result.stdout
    curve = json.loads((tmp_path / "budget_curve.json").read_text())
    evaluation = json.loads((tmp_path / "eval.json").read_text())
    assert "budget_curve" not in evaluation and curve["checkpoint"] == "base model"
    assert _column(curve, "budget") == [4, 16]
    assert curve["rows"][0]["team_success"] == evaluation["metrics"]["first_try_success"]
    for row in curve["rows"]:
        assert row["model_turns"] == 12 and row["capped"] == {}  # 3 agents x 4 tasks, all model-played
        assert 0 <= row["tokens_per_turn"] <= row["budget"] and 0 <= row["at_budget"] <= 1
    assert (tmp_path / "budget_curve.md").read_text().startswith("# marl eval: relay, thinking-budget curve")
    assert (tmp_path / "budget_curve.png").read_bytes().startswith(b"\x89PNG")


def test_marl_run_logs_the_curve_of_its_final_policy(tmp_path, demo_model_dir):
    """train.budget_curve: after training, the curve at relay's own budget is after.json's team success."""
    out = tmp_path / "run"
    code = main(["run", "relay", "--set", "tasks.eval_count=4", "--set", "train.steps=1", "--set",
                 "train.warmup.rl_steps=0", "--set", "train.prompts_per_step=2", "--set", "train.group_size=2",
                 "--set", "train.budget_curve=[2, 4]", "--tracker", "jsonl", "--out", str(out)])
    assert code == 0
    curve = json.loads((out / "budget_curve.json").read_text())
    after = json.loads((out / "after.json").read_text())
    assert _column(curve, "budget") == [2, 4] and curve["checkpoint"] == "step 1"
    assert curve["rows"][1]["team_success"] == after["team_success"]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    row = next(r for r in logged if "eval/budget/4/team_success" in r)
    assert row["eval/step"] == 1 and row["eval/budget/4/team_success"] == after["team_success"]
    assert row["eval/budget/2/at_budget"] == curve["rows"][0]["at_budget"]
    report = (out / "report.md").read_text()
    assert "## Thinking-budget curve (train.budget_curve)" in report and "![thinking-budget curve]" in report
    assert (out / "budget_curve.png").is_file()
