"""Every built-in scenario's own scorer functions score any transcript an agent can write (issue 27, item 5).

The functions a scenario names in its reward spec (`kind: callable`: negotiation's payoff_score, kuhn
poker's chips_score, tictactoe's outcome_score, weather's three, code_pair's tester scorer) read the
agents' text. Whatever that text is (huge numbers, deep nesting, odd unicode, very long lines) and
whatever arguments its tool calls carry, each gives an ok judgment with a finite score in [0, 1]: a
failure parsing it is the agents' own 0, never a masked episode.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from judges.rules.registry import build_scorer
from judges.types import ToolCallRecord
from marl.env import make_env
from marl.rewards import LAYERS, build_candidate
from marl.scenario.load import BUILTIN_DIR, load_scenario

FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

_HUGE = "9" * 5000  # past int()'s and str()'s 4300-digit limit
PAYLOADS = st.one_of(
    st.text(max_size=50),
    st.text(alphabet=st.characters(exclude_categories=()), max_size=50),
    st.sampled_from(["", "\x00", "\ud800", "\u202e5", "\u0665", "nan", "1e400", "-1", "0", _HUGE, "-" + _HUGE]),
    st.integers(1, 6000).map(lambda n: "[" * n + "]" * n),
    st.integers(300, 6000).map(lambda n: "9" * n),
    st.integers(10_000, 200_000).map(lambda n: "x" * n),
)
TEMPLATES = st.sampled_from([
    "{}", "PROPOSE books={} hats=0 balls=0", "PROPOSE books=1 hats={} balls=1", "VALUES books={}", "ACCEPT",
    "ACCEPT {}", "ANSWER: yes {}", "ANSWER: no", "{} ANSWER: yes", "bet {}", "check", "call", "fold", "{} 5",
    "5 {}", "ANSWER: VERDICT {}", "assert add_numbers({}, 1) == 2\nAPPROVED"])
TEXTS = st.builds(lambda template, payload: template.format(payload), TEMPLATES, PAYLOADS)
ARGUMENTS = st.one_of(PAYLOADS, st.integers(), st.just(10 ** 5000), st.lists(st.integers(), max_size=3),
                      st.none(), st.floats())


def _callables(name: str) -> list[tuple[str, object]]:
    """(function reference, built scorer) for every callable scorer of the scenario's reward spec."""
    scenario = load_scenario(name)
    rewards = scenario.spec.rewards
    specs = [spec for layer in LAYERS + ("penalties",) for spec in getattr(rewards, layer) if spec.kind == "callable"]
    return [(spec.params()["function"], build_scorer("callable", spec.params(), scenario.base_dir)) for spec in specs]


SCENARIOS = sorted(path.stem for path in BUILTIN_DIR.glob("*.yaml"))
WITH_FUNCTIONS = [name for name in SCENARIOS if _callables(name)]


def test_every_scenario_with_scorer_functions_is_fuzzed():
    assert {"negotiation", "kuhn_poker", "tictactoe", "weather", "code_pair"} <= set(WITH_FUNCTIONS)


def _check(name: str, texts: list[str], city, task_index: int = 0) -> None:
    env = make_env(name)
    agents = env.possible_agents
    task = env.tasks[task_index % len(env.tasks)]
    texts = [text.replace("VERDICT", str(task.answer)) for text in texts]  # the right answer, where it has one
    transcript = [{"agent": agents[turn % len(agents)], "text": text, "turn": turn} for turn, text in enumerate(texts)]
    calls = [ToolCallRecord(agents[0], tool, {"city": city}, True, "{}", turn=0)
             for tool in ("get_weather", "get_air_quality")]
    from judges.types import Item

    item = Item(prompt=task.prompt, answer=task.answer, metadata=dict(task.metadata))
    for reference, scorer in _callables(name):
        for agent in agents:
            judgment = scorer.score(item, [build_candidate(transcript, calls, agent)])[0]
            assert judgment.status == "ok", (reference, agent, judgment)
            assert math.isfinite(judgment.score) and 0.0 <= judgment.score <= 1.0, (reference, judgment)


@pytest.mark.parametrize("name", WITH_FUNCTIONS)
@FUZZ
@given(texts=st.lists(TEXTS, min_size=1, max_size=5), city=ARGUMENTS, task_index=st.integers(0, 50))
@example(texts=["PROPOSE books=" + _HUGE + " hats=0 balls=0", "ACCEPT"], city="Paris", task_index=0)
@example(texts=["get_weather", "ANSWER: VERDICT"], city=10 ** 5000, task_index=0)  # str() past the digit limit
@example(texts=["5", "5"], city="Paris", task_index=0)
def test_any_transcript_gets_a_finite_score_from_every_scenario_function(name, texts, city, task_index):
    _check(name, texts, city, task_index)


def test_a_proposal_past_the_digit_limit_is_no_offer_never_a_mask_nor_an_escape():
    (reference, scorer), = _callables("negotiation")
    env = make_env("negotiation")
    task = env.tasks[0]
    from judges.types import Item

    item = Item(task.prompt, metadata=dict(task.metadata))

    def scores(transcript):
        judged = [scorer.score(item, [build_candidate(transcript, [], agent)])[0] for agent in ("alice", "bob")]
        assert all(judgment.ok for judgment in judged), judged
        return [judgment.score for judgment in judged]

    huge = "PROPOSE books=" + _HUGE + " hats=0 balls=0"
    assert scores([{"agent": "alice", "text": huge, "turn": 0}, {"agent": "bob", "text": "ACCEPT", "turn": 1}]) == [0, 0]
    # bob's standing offer is imposed whatever alice writes after it: an unreadable count is no escape into a tie
    fair = [{"agent": "bob", "text": "PROPOSE books=0 hats=0 balls=0", "turn": 0}]
    assert scores(fair + [{"agent": "alice", "text": huge, "turn": 1}]) == scores(fair)
    honest = [{"agent": "alice", "text": "PROPOSE books=0 hats=0 balls=0", "turn": 0},
              {"agent": "bob", "text": "ACCEPT", "turn": 1}]
    assert scores(honest)[1] > 0  # an honest deal (alice takes nothing) still pays bob
