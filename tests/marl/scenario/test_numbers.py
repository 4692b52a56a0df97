"""Numbers in a scenario: integers too long to read are located problems, and counts past their bounds say
the bound and why (marl.scenario.yaml_positions, overrides, sections.at_most), in every way a value arrives."""

import pytest

from common.files import MAX_INT_DIGITS
from marl.scenario.load import ScenarioError, load_scenario
from marl.scenario.overrides import apply_overrides, shown
from marl.scenario.sections import MAX_STEPS
from marl.scenario.spec import ScenarioSpec
from marl.scenario.yaml_positions import YamlSyntaxError, YamlValueError, load_with_positions
from helpers.scenario_files import GOOD


@pytest.mark.parametrize("text, where", [
    ("steps: " + "9" * 5000, (1, 8)),
    ("steps: -" + "1" * 5000, (1, 8)),
    ("steps: 1_" + "0" * 5000, (1, 8)),  # YAML 1.1 underscores are not digits, and not a way around the bound
    ("steps: 0x" + "f" * 4000, (1, 8)),  # hex: Python converts it whatever its length; its size is bounded
    ("steps: 0b" + "1" * 20_000, (1, 8)),
    ("a:\n  - [1, 2, " + "9" * 5000 + "]", (2, 12)),
])
def test_an_integer_too_long_is_a_located_value_error(text, where):
    with pytest.raises(YamlValueError) as caught:
        load_with_positions(text)
    assert (caught.value.line, caught.value.column) == where
    assert caught.value.message.startswith("an integer of ") and "(at most 4,300 are read" in caught.value.message


def test_long_numbers_that_are_text_or_within_the_bound_are_read():
    data, _ = load_with_positions(f"a: '{'9' * 5000}'\nb: {'9' * MAX_INT_DIGITS}\nc: 1.0e+400\n")
    assert data["a"] == "9" * 5000 and data["b"] == 10 ** MAX_INT_DIGITS - 1 and data["c"] == float("inf")


def test_a_long_integer_as_a_key_is_a_located_problem():
    with pytest.raises(YamlSyntaxError) as caught:
        load_with_positions("a: 1\n" + "9" * 900 + ": x\n")  # a simple key is at most 1024 characters
    assert caught.value.line == 2 and "key" in caught.value.message


def test_a_set_value_too_long_is_one_line_quoting_the_start_of_it():
    with pytest.raises(ScenarioError) as caught:
        apply_overrides({}, ["train.steps=" + "9" * 5000], "s.yaml")
    assert str(caught.value) == ("s.yaml (--set train.steps):0:0: train.steps: --set 'train.steps=" + "9" * 48 +
                                 "'... (5,012 characters): an integer of 5,000 digits (at most 4,300 are read; no "
                                 "setting needs that many): write a smaller number, or quote it if it is text")
    with pytest.raises(ScenarioError, match=r"s\.yaml \(--set agents\.9{53}\.\.\.\):0:0: .* is a list of 1 "
                                         r"entries .* '9{60}'\.\.\. \(5,000 characters\) is not one of them$"):
        apply_overrides({"agents": [{}]}, ["agents." + "9" * 5000 + ".name=x"], "s.yaml")
    assert shown("a=1") == "'a=1'" and shown("k=" + "x" * 100).endswith("'... (102 characters)")


def test_a_set_date_is_a_value_problem_not_a_syntax_one():
    with pytest.raises(ScenarioError) as caught:
        apply_overrides({}, ["description=2024-01-01"], "s.yaml")
    assert "not valid YAML" not in str(caught.value) and "is read by YAML as a date/time" in str(caught.value)


def _problem(**train) -> str:
    data, _ = load_with_positions(GOOD)
    with pytest.raises(ScenarioError) as caught:
        load_scenario({**data, "train": train})
    (problem,) = caught.value.problems
    return f"{'.'.join(map(str, problem.path))}: {problem.message}"


@pytest.mark.parametrize("value", [MAX_STEPS + 1, float(MAX_STEPS + 1), 1e30, str(MAX_STEPS + 1), float("inf")])
def test_steps_past_the_bound_in_any_form(value):
    assert _problem(steps=value).startswith(f"train.steps: at most {MAX_STEPS:,} (a step plays episodes and updates "
                                            "the model")


def test_bounds_of_nested_sections_and_optional_counts():
    assert _problem(reflection={"steps": 10**9}).startswith("train.reflection.steps: at most 1,000,000")
    assert _problem(eval_every=10**9).startswith("train.eval_every: at most 1,000,000")
    assert _problem(selfplay={"pool_size": 10**6}).startswith("train.selfplay.pool_size: at most 1,024 (each "
                                                               "snapshot is a copy of the model, kept in memory)")
    assert _problem(threads=10**6).startswith("train.threads: at most 1,024 (more threads than any machine has")


def test_sound_counts_at_their_bounds_are_accepted():
    data, _ = load_with_positions(GOOD)
    spec = ScenarioSpec.model_validate({**data, "train": {"steps": MAX_STEPS, "eval_every": None, "seed": 2**32 - 1,
                                                           "group_size": 1024}})
    assert spec.train.steps == MAX_STEPS and spec.train.eval_every is None and spec.train.seed == 2**32 - 1
