"""A candidate cannot turn its own 0 into a masked reward (issue 27, item 5).

Whatever a candidate produces (arbitrary text, huge integers, deep nesting, odd unicode, NUL bytes,
very long lines), every rule scorer gives an ok judgment with a finite score in [0, 1]: an exception
while parsing or comparing what the candidate produced is the candidate's 0 with its reason, never a
failed (masked) judgment. Only the scorer's own failure (a sandbox that cannot start) is masked.
"""

from __future__ import annotations

import math
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from judges.rules.code import CodeTestsVerifier
from judges.rules.code_harness import Claim, claim_matches, decode_literal, equal
from judges.rules.registry import KNOWN_KINDS, build_scorer
from judges.rules.sandbox import SandboxError
from judges.types import Candidate, CandidateError, Item, ToolCallRecord, candidate_input
from marl.env import make_env
from helpers.paths import SCENARIOS

FAST = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(max_examples=6, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- what a candidate may write ------------------------------------------------------------------

_DEPTH = st.integers(1, 6000)
_DIGITS = st.integers(300, 6000)
PAYLOADS = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(exclude_categories=())),  # surrogates, private use, unassigned, controls
    st.sampled_from(["\x00", "1\x00", "\ud800", "\u202e42", "4\u03052", "\u2028", "\ufeff", "nan", "inf", "-inf",
                     "1e400", "-1e400", "10**400", "1/0", "0/0", "NaN%", "$1e999"]),
    _DEPTH.map(lambda n: "[" * n + "]" * n),
    _DEPTH.map(lambda n: "(" * n + ")" * n),
    _DEPTH.map(lambda n: '{"a": ' * n + "1" + "}" * n),
    _DEPTH.map(lambda n: "-" * n + "1"),
    _DIGITS.map(lambda n: "9" * n),
    _DIGITS.map(lambda n: "1/" + "7" * n),
    _DIGITS.map(lambda n: "1" * n + ".5"),
    st.integers(10_000, 300_000).map(lambda n: "x" * n),  # one very long line
)
TEMPLATES = st.sampled_from([
    "{}", "Final answer: {}", "Answer:\n{}", "#### {}", "\\boxed{{{}}}", "```json\n{}\n```", "{{\"a\": {}}}",
    "```python\ndef add(a, b):\n    return {}\n```", "```sql\nSELECT {}\n```", "SELECT {} FROM employees",
    "assert add_numbers({}, 1) == 0\nAPPROVED", "assert add_numbers(1, 1) == {}\nAPPROVED",
    "assert add_numbers(1, 1) == 2\nassert {}\nAPPROVED"])
TEXTS = st.builds(lambda template, payload: template.format(payload), TEMPLATES, PAYLOADS)

TRIGGERS = [  # the issue's own: each made a scorer raise, so the episode was masked instead of scored 0
    "assert add_numbers(" + "-" * 900 + "1, 1) == 0\nAPPROVED",  # RecursionError in ast.unparse
    "Final answer: 1/" + "9" * 5000,  # int()'s digit limit
    '```json\n' + "[" * 5000 + "]" * 5000 + "\n```",  # RecursionError in json.loads
    "Final answer: 1e400",
]


def _candidate(text: str) -> Candidate:
    return Candidate(text=text, reasoning=text, transcript=({"agent": "tester", "text": text, "turn": 0},),
                     tool_calls=(ToolCallRecord("tester", text[:1000], {"q": text[:1000]}, True),), agent="tester")


def assert_scored(judgment) -> None:
    """The property: an ok judgment, a finite score in [0, 1]."""
    assert judgment.status == "ok", judgment
    assert math.isfinite(judgment.score) and 0.0 <= judgment.score <= 1.0, judgment


# -- every rule scorer (code_tests: below, with fewer examples) ------------------------------------

def _code_pair_task():
    env = make_env("code_pair")
    return next(task for task in env.tasks if task.metadata["entry"] == "add_numbers")


SCORERS = {  # kind -> (params, item)
    "exact": ({}, Item("?", answer="42")),
    "numeric": ({}, Item("?", answer="3.5")),
    "regex": ({"pattern": "{answer}|[0-9]+"}, Item("?", answer="4(2)")),
    "contains": ({"substrings": ["ok", "\u00e9"]}, Item("?")),
    "json_schema": ({"schema": {"type": "object", "required": ["a"], "properties": {
        "a": {"type": ["array", "integer", "number"], "items": {"type": "array"}, "minimum": 0, "maximum": 1e308}}}},
        Item("?")),
    "sql": ({"database": SCENARIOS / "text_to_sql.sqlite", "variants": 1},
            Item("?", metadata={"reference_query": "SELECT COUNT(*) FROM employees"})),
    "tool_use": ({"required": ["search", "search"], "ordered": True, "forbidden": ["rm"]}, Item("?")),
    "process": ({"markers": ["first", "(a|b)+c"], "regex": True}, Item("?")),
    "format": ({"max_chars": 100, "min_chars": 1, "pattern": "(?s).*APPROVED", "require_marker": True,
                "forbidden": ["\x00"]}, Item("?")),
}


@pytest.fixture(scope="module")
def scorers():
    built = {kind: (build_scorer(kind, params), item) for kind, (params, item) in SCORERS.items()}
    task = _code_pair_task()  # callable: code_pair's tester scorer, the real parser of a tester's asserts
    built["callable"] = (build_scorer("callable", {"function": "code_pair_lib:tester_tests_valid"}, SCENARIOS),
                         Item(task.prompt, metadata=dict(task.metadata)))
    return built


def test_every_rule_kind_is_fuzzed():
    assert set(SCORERS) | {"callable", "code_tests"} == set(KNOWN_KINDS)


@FAST
@given(text=TEXTS)
@example(text=TRIGGERS[0])
@example(text=TRIGGERS[1])
@example(text=TRIGGERS[2])
@example(text=TRIGGERS[3])
def test_any_candidate_text_gets_a_finite_score_from_every_rule_scorer(scorers, text):
    for kind, (scorer, item) in scorers.items():
        judgment = scorer.score(item, [_candidate(text)])[0]
        assert_scored(judgment), kind


def test_the_issues_triggers_score_zero_with_their_reason(scorers):
    tester, item = scorers["callable"]
    assert tester.score(item, [_candidate(TRIGGERS[0])])[0].score == 0.0  # a line that earns nothing
    numeric, number = scorers["numeric"]
    judgment = numeric.score(number, [_candidate(TRIGGERS[1])])[0]
    assert (judgment.score, judgment.rationale) == (0.0, "numeric: the answer could not be scored (ValueError)")
    assert numeric.score(number, [_candidate("Final answer: 3.5")])[0].score == 1.0  # a right answer still is 1
    schema, item = scorers["json_schema"]
    judgment = schema.score(item, [_candidate(TRIGGERS[2])])[0]
    assert judgment.score == 0.0 and "RecursionError" in judgment.rationale


# -- code_tests: the sandbox runs each candidate, so few examples; its parsing parts get many ----------

CODE_TESTS = [{"call": "add(1, 2)", "expected": "3.0"}, {"call": "add(0, 0)", "expected": "1" + "0" * 400},
              {"call": "add(2, 2)", "expected": "1" + "0" * 400 + ".5"}, "assert add(2, 2) == 4",
              "assert add(1, 1) > 1"]
HOSTILE_CODE = [
    "def add(a, b):\n    return 10**400",  # OverflowError in math.isclose against a float
    "import os\nos.write(3, b'loaded\\n' + b'0' * 5000 + b'1 value 3\\n')\ndef add(a, b):\n    return a + b",
    "def add(a, b):\n    x = []\n    for _ in range(100000):\n        x = [x]\n    return x",
    "def add(a, b):\n    return float('nan')",
    "import sys\nsys.set_int_max_str_digits(0)\ndef add(a, b):\n    return int('9' * 6000)",
]


@pytest.mark.parametrize("code", HOSTILE_CODE)
def test_hostile_return_values_and_reports_score_zero_not_masked(code):
    judgment = CodeTestsVerifier(CODE_TESTS, entry="add", timeout_s=10).score(Item("add"), [Candidate(code)])[0]
    assert_scored(judgment)
    assert judgment.score < 1.0  # wrong on 3.0 and on the 400-digit values, or a forged report


def test_a_right_answer_still_passes_beside_huge_expected_values():
    judgment = CodeTestsVerifier(CODE_TESTS, entry="add", timeout_s=10).score(
        Item("add"), [Candidate("def add(a, b):\n    return a + b")])[0]
    assert (judgment.score, judgment.rationale) == (3 / 5, "3/5 hidden tests passed")  # not the two 400-digit ones


@SLOW
@given(text=TEXTS)
def test_any_candidate_text_gets_a_finite_score_from_the_code_verifier(text):
    judgment = CodeTestsVerifier(CODE_TESTS, entry="add", timeout_s=10).score(Item("add"), [Candidate(text)])[0]
    assert_scored(judgment)


LITERALS = st.one_of(PAYLOADS, st.builds(repr, st.recursive(
    st.one_of(st.integers(), st.floats(), st.text(), st.booleans(), st.none()),
    lambda inner: st.lists(inner) | st.tuples(inner, inner) | st.dictionaries(st.text(), inner), max_leaves=20)),
    st.builds(lambda n: repr(10 ** n), st.integers(300, 4000)), st.builds(lambda n: repr(-(10 ** n) * 1.0 if n < 308
                                                                                         else 1e308), st.integers(0, 400)))


@FAST
@given(kind=st.sampled_from(["value", "text", "raise", "big", "missing"]), got=LITERALS, expected=LITERALS)
def test_a_claim_compared_with_any_expected_value_is_true_or_false(kind, got, expected):
    """The comparison outside the sandbox decides, never raises: decode_literal raises only ValueError
    and equal() takes any two decoded values (10**400 against a float is exact, not OverflowError)."""
    assert claim_matches(Claim(kind, got), expected) in (True, False)
    try:
        left, right = decode_literal(got), decode_literal(expected)
    except ValueError:
        return
    assert equal(left, right) in (True, False)


def test_huge_ints_and_floats_compare_exactly():
    assert not equal(10 ** 400, 1.5) and not equal(1.5, 10 ** 400) and not equal(10 ** 400, math.inf)
    assert equal(10 ** 300, 1e300) and not equal(10 ** 309, sys.float_info.max)


# -- the guard itself -------------------------------------------------------------------------------

def test_candidate_input_turns_any_exception_into_the_candidates_failure_but_not_the_scorers():
    with pytest.raises(CandidateError, match=r"the answer could not be scored \(RecursionError\)"):
        with candidate_input("the answer"):
            raise RecursionError("secret text of the candidate's")
    with pytest.raises(SandboxError):  # the scorer's own failure passes through: masked, never 0
        with candidate_input("the answer"):
            raise SandboxError("the interpreter could not be started")


def test_a_sandbox_failure_is_still_masked(monkeypatch):
    import judges.rules.code_harness as harness

    def broken(*args, **kwargs):
        raise SandboxError("the interpreter could not be started")

    monkeypatch.setattr(harness, "run_python", broken)
    judgment = CodeTestsVerifier(CODE_TESTS, entry="add").score(Item("add"), [Candidate("def add(a, b): ...")])[0]
    assert judgment.status == "error" and judgment.score is None
