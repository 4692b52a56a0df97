"""text_to_sql and code_pair train on templated fills and hold out fills no training task has.

The held-out tasks of both scenarios are fills of a template (a question over another department, a
function with another constant) whose value no training task of that template uses, so a model that
memorised its training answers fails them and one that carries the value across passes. The expert
still solves every one of them, and a value copied from another fill does not.
"""

from __future__ import annotations

import re
import sqlite3

import pytest

from marl import make_env
from marl.scenario.load import load_scenario
from helpers.paths import ROOT


def _fill(task, values: list) -> str | None:
    """The slot value of a templated task's prompt (the longest one that occurs), else None."""
    found = [str(v) for v in values if re.search(rf"(?<![\w.]){re.escape(str(v))}(?![\w])", task.prompt)]
    return max(found, key=len) if found else None


def test_text_to_sql_holds_out_template_fills_no_training_task_has():
    scenario = load_scenario("text_to_sql")
    lib = scenario.resolve("text_to_sql_lib:expert").__globals__
    train, held_out = scenario.split()
    assert len(held_out) == 40 and len(train) == len(lib["QUESTIONS"]) + len(lib["templated_tasks"]()) - 40
    templates = {question.split("{")[0]: slot for slot, question, _ in lib["TEMPLATES"]}

    def key(task):
        head = next((h for h in templates if task.prompt.startswith(h) and h), None)
        return None if head is None else (head, _fill(task, lib["SLOTS"][templates[head]]))

    seen = {key(task) for task in train}
    held = [key(task) for task in held_out]
    assert all(k is not None and k[1] is not None for k in held)  # every held-out task is a template fill
    assert not set(held) & seen and len(set(held)) == len(held)
    assert {k[0] for k in held} <= {k[0] for k in seen if k}  # each template was trained on


def test_text_to_sql_expert_solves_the_held_out_fills_and_a_borrowed_value_fails():
    env = make_env("text_to_sql")
    _, held_out = env.scenario.split()
    database = sqlite3.connect(ROOT / "scenarios" / "text_to_sql.sqlite")
    rewards = []
    for task in held_out[:6]:
        env.reset(options={"task": task})
        rewards.append(env.step({"analyst": {"text": task.metadata["reference_query"]}})[1]["analyst"])
    assert rewards == [pytest.approx(1.0)] * 6
    # the query of one fill answers another fill of its template wrongly
    task = next(t for t in held_out if "department?" in t.prompt and "How many employees work" in t.prompt)
    other = "Sales" if "'Sales'" not in task.metadata["reference_query"] else "Legal"
    borrowed = re.sub(r"d\.name = '[^']+'", f"d.name = '{other}'", task.metadata["reference_query"])
    assert database.execute(borrowed).fetchall() != database.execute(task.metadata["reference_query"]).fetchall()
    env.reset(options={"task": task})
    assert env.step({"analyst": {"text": borrowed}})[1]["analyst"] < 0.5


def test_code_pair_holds_out_family_fills_with_a_constant_their_family_never_trained_on():
    scenario = load_scenario("code_pair")
    train, held_out = scenario.split()
    lib = scenario.resolve("code_pair_lib:generate_tasks").__globals__
    families = {entry for entry, *_ in lib["FAMILIES"]}
    assert len(held_out) == 20 and all(t.metadata["entry"] in families for t in held_out)
    assert {t.metadata["entry"] for t in train} >= families | {entry for entry, *_ in lib["FUNCTIONS"]}
    train_ids = {t.id for t in train}
    assert not any(t.id in train_ids for t in held_out)  # ids name (family, K): no fill is in both


def test_code_pair_family_mutants_pass_the_visible_example_and_are_caught_by_the_hidden_tests():
    lib = load_scenario("code_pair").resolve("code_pair_lib:generate_tasks").__globals__
    for task in lib["family_tasks"](0):
        meta = task["metadata"]
        calls = [example.split(" == ")[0] for example in meta["examples"]]
        hidden = [test["call"] for test in meta["tests"]]
        reference = lib["_evaluate"](meta["solution"], calls)
        assert all(lib["_evaluate"](mutant, calls) == reference for mutant in meta["mutants"]), task["id"]
        expected = [test["expected"] for test in meta["tests"]]
        assert all(lib["_evaluate"](mutant, hidden) != expected for mutant in meta["mutants"]), task["id"]


def test_no_training_fill_of_a_code_pair_family_passes_a_held_out_fill():
    """A held-out fill's hidden tests and example tell its K from every other K of its family: the
    solution the coder learnt for a training fill (K' dividing K, say) fails it."""
    scenario = load_scenario("code_pair")
    train, held_out = scenario.split()
    run = scenario.resolve("code_pair_lib:generate_tasks").__globals__["_evaluate"]
    for task in held_out:
        meta = task.metadata
        calls = [test["call"] for test in meta["tests"]] + [e.split(" == ")[0] for e in meta["examples"]]
        expected = run(meta["solution"], calls)
        for other in train:
            if other.metadata["entry"] == meta["entry"]:
                assert run(other.metadata["solution"], calls) != expected, (task.id, other.id)


def test_no_training_query_of_a_text_to_sql_template_gives_a_held_out_fills_result():
    """Two fills of one template with one result (two departments with the same top salary) would let
    the training fill's query, or a constant, pass the held-out one: such fills are left out. (Across
    templates, the sql verifier's perturbed database variants tell queries apart.)"""
    scenario = load_scenario("text_to_sql")
    train, held_out = scenario.split()
    templates = scenario.resolve("text_to_sql_lib:expert").__globals__["TEMPLATES"]
    database = sqlite3.connect(ROOT / "scenarios" / "text_to_sql.sqlite")

    def key(task):
        head = next((q.split("{")[0] for _, q, _ in templates if task.prompt.startswith(q.split("{")[0])), None)
        return head, repr(sorted(database.execute(task.metadata["reference_query"]).fetchall(), key=repr))

    trained = {key(task) for task in train}
    assert not [task.id for task in held_out if key(task) in trained]
