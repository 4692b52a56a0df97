"""examples/judge_pairs: the generator is seeded, its gold answers are right (recomputed here without its
code), train and held-out share no prompt, positions and styles are balanced, and the committed files are
what seed 0 writes."""

from __future__ import annotations

import importlib.util
import json
import re
from collections import Counter
from fractions import Fraction

import pytest
from helpers.paths import ROOT

FOLDER = ROOT / "examples" / "judge_pairs"


@pytest.fixture(scope="module")
def maker():
    spec = importlib.util.spec_from_file_location("make_pairs", FOLDER / "make_pairs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pairs(maker):
    return maker.make_pairs(0)


def read(name: str) -> list[dict]:
    return [json.loads(line) for line in (FOLDER / name).read_text(encoding="utf-8").splitlines()]


def test_the_generator_is_deterministic_by_seed_and_the_committed_files_are_seed_0(maker, pairs, tmp_path):
    assert maker.make_pairs(0) == pairs
    assert maker.make_pairs(1) != pairs
    maker.main(["--seed", "0", "--out-dir", str(tmp_path)])
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / name).read_bytes() == (FOLDER / name).read_bytes(), f"{name}: rerun make_pairs.py"


def test_sizes_positions_and_styles_are_balanced(pairs):
    train, heldout = pairs
    assert len(train) == len(heldout) == 200
    assert Counter(item["gold"] for item in heldout) == {0: 100, 1: 100}
    for rows in (train, heldout):
        assert Counter(row["kind"] for row in rows) == {"arithmetic": 55, "units": 52, "facts": 43, "code": 50}
    lengths, formats = Counter(i["length"] for i in heldout), Counter(i["format"] for i in heldout)
    assert lengths["same style"] == 100 and abs(lengths["correct"] - lengths["wrong"]) <= 6
    assert formats == {"both": 50, "neither": 50, "correct": 50, "wrong": 50}
    longer = sum(len(i["candidates"][i["gold"]]) > len(i["candidates"][1 - i["gold"]]) for i in heldout)
    assert 80 <= longer <= 120  # in characters too, the correct answer is the longer one about half the time


def test_no_question_is_asked_twice_in_any_wording(maker, pairs):
    """Train and held-out share no question, nor does one hold a question twice: a code question is its
    snippet, whatever the sentence before it; an arithmetic one its numbers and result; a unit one its amount
    and units (the parsers below, not the generator's own key)."""
    train, heldout = pairs
    rows = [(r["kind"], r["prompt"]) for r in train + heldout]
    keys = [_question(kind, prompt) for kind, prompt in rows]
    assert len(set(keys)) == len(keys) == 400
    extra = maker.extra_train_pairs(60)
    extra_keys = [_question(r["kind"], r["prompt"]) for r in extra]
    assert len(set(extra_keys)) == 60 and not set(extra_keys) & set(keys)


def _question(kind: str, prompt: str):
    if kind == "code":
        return kind, prompt.split("```python\n", 1)[1]
    if kind == "arithmetic":  # a word problem names its things too: 9 packs of 19 pencils are not 19 crates of 9 apples
        things = re.findall(r"[a-z]+", prompt) if prompt.startswith("If each") else ()
        return kind, _arithmetic(prompt), tuple(sorted(re.findall(r"\d+", prompt))), tuple(things)
    if kind == "units":
        names = {name for pair in FACTORS for name in pair}
        return kind, _units(prompt), tuple(re.findall(r"[\d.]+", prompt)), frozenset(set(prompt[:-1].split()) & names)
    return kind, prompt


def _gold_rows(pairs):
    """(kind, prompt, correct answer, wrong answer) of every pair, train and held-out."""
    train, heldout = pairs
    rows = [(r["kind"], r["prompt"], *r["answers"]) for r in train]
    return rows + [(i["kind"], i["prompt"], i["answers"][i["gold"]], i["answers"][1 - i["gold"]]) for i in heldout]


def _arithmetic(prompt: str) -> int:
    n = [int(x) for x in re.findall(r"\d+", prompt)]
    if m := re.fullmatch(r"If each \w+ holds (\d+) \w+, how many \w+ are in (\d+) of them\?", prompt):
        return int(m[1]) * int(m[2])
    if "%" in prompt:
        return n[0] * n[1] // 100
    if "+" in prompt or prompt.startswith("Add"):
        return n[0] + n[1]
    if prompt.startswith("Subtract"):
        return n[1] - n[0]
    if "-" in prompt:
        return n[0] - n[1]
    if "×" in prompt or "times" in prompt or prompt.startswith("Multiply"):
        return n[0] * n[1]
    assert "÷" in prompt or prompt.startswith("Divide"), prompt
    assert n[0] % n[1] == 0
    return n[0] // n[1]


FACTORS = {("kilometres", "metres"): 1000, ("metres", "centimetres"): 100, ("kilograms", "grams"): 1000,
           ("hours", "minutes"): 60, ("minutes", "seconds"): 60, ("days", "hours"): 24, ("feet", "inches"): 12,
           ("yards", "feet"): 3, ("litres", "millilitres"): 1000, ("inches", "centimetres"): Fraction("2.54"),
           ("weeks", "days"): 7, ("centimetres", "millimetres"): 10, ("tonnes", "kilograms"): 1000,
           ("miles", "yards"): 1760}


def _units(prompt: str) -> Fraction:
    if m := re.fullmatch(r"Convert (-?\d+) °C to degrees Fahrenheit\.", prompt):
        return Fraction(int(m[1])) * 9 / 5 + 32
    m = (re.fullmatch(r"How many (\w+) are in ([\d.]+) (\w+)\?", prompt)
         or re.fullmatch(r"Convert ([\d.]+) (\w+) to (\w+)\.", prompt))
    assert m, prompt
    target, amount, source = (m[1], m[2], m[3]) if prompt.startswith("How") else (m[3], m[1], m[2])
    return Fraction(amount) * FACTORS[source, target]


def test_arithmetic_and_unit_answers_are_right(maker, pairs):
    checked = Counter()
    extra = [(r["kind"], r["prompt"], *r["answers"]) for r in maker.extra_train_pairs(150)]
    for kind, prompt, right, wrong in _gold_rows(pairs) + extra:
        if kind == "arithmetic":
            assert int(right) == _arithmetic(prompt) != int(wrong), prompt
        elif kind == "units":
            assert Fraction(right) == _units(prompt) != Fraction(wrong), prompt
        checked[kind] += 1
    assert checked["arithmetic"] == 110 + 50 and checked["units"] == 104 + 50


def test_code_answers_are_what_python_prints(maker, pairs):
    import contextlib
    import io

    extra = [(r["kind"], r["prompt"], *r["answers"]) for r in maker.extra_train_pairs(150)]
    for kind, prompt, right, wrong in _gold_rows(pairs) + extra:
        if kind != "code":
            continue
        snippet = re.search(r"```python\n(.*)\n```", prompt, re.S)[1]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(snippet, {})
        assert out.getvalue().rstrip("\n") == right != wrong, snippet


KNOWN = {"What is the capital of Australia?": "Canberra", "What is the chemical symbol for gold?": "Au",
         "In which year did the Berlin Wall fall?": "1989", "How many bones are in the adult human body?": "206",
         "What does HTTP stand for?": "Hypertext Transfer Protocol", "Who wrote \"1984\"?": "George Orwell"}


def test_facts_come_from_the_table_with_their_answers(maker, pairs):
    table = {question: (right, wrong) for question, _, right, wrong in maker.FACTS}
    assert len(table) == len(maker.FACTS) and all(right != wrong for right, wrong in table.values())
    assert all(table[q][0] == a for q, a in KNOWN.items())
    facts = [(prompt, right, wrong) for kind, prompt, right, wrong in _gold_rows(pairs) if kind == "facts"]
    assert len(facts) == 86 and all(table[prompt] == (right, wrong) for prompt, right, wrong in facts)
