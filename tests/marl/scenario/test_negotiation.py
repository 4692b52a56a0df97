"""The negotiation scenario measures skill (issue 32, item 2): no safe draw, final-offer arbitration,
scripted opponents of graded strength."""

from __future__ import annotations

import types

import pytest

from helpers.paths import SCENARIOS
from judges.rules.registry import build_scorer
from judges.types import Item
from marl.env import make_env
from marl.policies import get_policy, rollout
from marl.rewards import build_candidate
from marl.scenario.load import load_scenario, resolve_callable

lib = types.SimpleNamespace(**resolve_callable("negotiation_lib:expert", SCENARIOS).__globals__)  # the module

SCENARIO = load_scenario("negotiation")
ENV = make_env(SCENARIO)
TASKS = ENV.tasks[:40]


def scores(task, messages: list[tuple[str, str]]) -> dict[str, float]:
    """Each agent's score (payoff over twice its fair share) for a scripted transcript."""
    scorer = build_scorer("callable", {"function": "negotiation_lib:payoff_score"}, SCENARIO.base_dir)
    transcript = [{"agent": agent, "text": text, "turn": turn} for turn, (agent, text) in enumerate(messages)]
    item = Item(task.prompt, metadata=dict(task.metadata))
    judged = {agent: scorer.score(item, [build_candidate(transcript, [], agent)])[0] for agent in lib.AGENTS}
    assert all(judgment.ok for judgment in judged.values()), judged
    return {agent: judgment.score for agent, judgment in judged.items()}


def efficient(task, agent: str) -> dict:
    """What `agent` gets under the efficient split."""
    pool, values = lib.parse_counts(task.metadata["pool"]), task.metadata["values"]
    other = next(a for a in lib.AGENTS if a != agent)
    return {i: pool[i] if values[agent][i] > values[other][i] else 0 for i in lib.ITEMS}


def score_of(task, agent: str, gets: dict) -> float:
    """The score of `agent` receiving `gets` (payoff over twice its fair share, clipped to 1)."""
    pool, values = lib.parse_counts(task.metadata["pool"]), task.metadata["values"]
    other = next(a for a in lib.AGENTS if a != agent)
    share = lib.fair_share(pool, values[agent], values[other])
    return min(1.0, sum(gets[i] * values[agent][i] for i in lib.ITEMS) / (2 * share))


@pytest.mark.parametrize("task", TASKS[:10], ids=lambda task: task.id)
def test_walking_away_is_no_draw_any_offer_beats_silence(task):
    pool = lib.parse_counts(task.metadata["pool"])
    claim = {i: pool[i] - (i == "hats") for i in lib.ITEMS}  # all but one hat
    rest = {i: pool[i] - claim[i] for i in lib.ITEMS}
    got = scores(task, [("alice", f"PROPOSE {lib.render(claim)}"), ("bob", "hello"), ("alice", "VALUES books=1")])
    # the only standing offer is imposed, exactly as if bob had accepted it
    assert got == {"alice": score_of(task, "alice", claim), "bob": score_of(task, "bob", rest)}
    assert got["alice"] > got["bob"] or got["alice"] == 1.0  # silence lost (unless even one hat is worth more)
    assert scores(task, [("alice", "hello"), ("bob", "VALUES books=2")]) == {"alice": 0.0, "bob": 0.0}


@pytest.mark.parametrize("task", TASKS[:10], ids=lambda task: task.id)
def test_the_arbitrator_imposes_the_fairer_last_offer_whoever_spoke_last(task):
    pool = lib.parse_counts(task.metadata["pool"])
    fair, greedy = lib.render(efficient(task, "alice")), lib.render(pool)
    both_fair = {"alice": 0.5, "bob": 0.5}
    assert scores(task, [("alice", f"PROPOSE {fair}"), ("bob", f"PROPOSE {greedy}")]) == both_fair
    assert scores(task, [("bob", f"PROPOSE {greedy}"), ("alice", f"PROPOSE {fair}")]) == both_fair
    # only the LAST offer of each counts: alice's fair offer withdrawn for a greedy one loses to bob's fair one
    bob_fair = lib.render(efficient(task, "bob"))
    assert scores(task, [("alice", f"PROPOSE {fair}"), ("bob", f"PROPOSE {bob_fair}"),
                         ("alice", f"PROPOSE {greedy}")]) == both_fair
    assert lib.advantage(pool, task.metadata["values"], "alice", efficient(task, "alice")) == pytest.approx(0.0)


def play(first, second, task) -> dict[str, float]:
    """The zero-sum rewards of one game: `first` plays alice, `second` bob."""
    players = {"alice": first, "bob": second}
    return rollout(ENV, lambda agent, observation, t: players[agent](agent, observation, t), task=task).rewards


def test_nothing_beats_the_strong_player_from_either_seat():
    others = {"expert": get_policy("expert", SCENARIO), "null": get_policy("null", SCENARIO),
              "random": lib.random_player, "greedy": lib.greedy_player}
    for name, other in others.items():
        for task in TASKS:
            strong_first = play(lib.strong_player, other, task)
            strong_second = play(other, lib.strong_player, task)
            assert strong_first["alice"] >= -1e-9 and strong_second["bob"] >= -1e-9, (name, task.id)


def test_opponents_are_graded_the_expert_wins_most_against_random_never_against_strong():
    expert = get_policy("expert", SCENARIO)

    def won(opponent) -> float:
        games = [play(expert, opponent, task)["alice"] for task in TASKS] + \
                [play(opponent, expert, task)["bob"] for task in TASKS]
        return sum(reward > 1e-9 for reward in games) / len(games)

    random_won, greedy_won, strong_won = won(lib.random_player), won(lib.greedy_player), won(lib.strong_player)
    assert random_won > greedy_won > strong_won == 0.0
    assert won(expert) == 0.0  # two honest experts agree on the efficient split: a tie every time


def test_two_experts_agree_on_the_efficient_split():
    expert = get_policy("expert", SCENARIO)
    for task in TASKS[:10]:
        result = rollout(ENV, expert, task=task)
        assert result.transcript[-1]["text"] == "ACCEPT"
        assert {agent: breakdown.total for agent, breakdown in result.breakdown.items()} == {"alice": 0.5, "bob": 0.5}
