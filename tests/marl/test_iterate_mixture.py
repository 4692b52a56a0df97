"""`converge: average`: the mixture of self-play's iterates, drawn once per game, IS the average strategy.

On Kuhn poker's information sets, the behaviour strategy of the mixture (played exactly: every draw,
every deal, every move of a fixed opponent enumerated) equals the reach-weighted average of the
snapshots, sum_k w_k reach_k(I) pi_k(a|I) / sum_k w_k reach_k(I), with the weights the mixture gives the
snapshots (the steps each stood for). The draw is seeded per game and comes each weight's share.
"""

from __future__ import annotations

import random

import pytest

from helpers.paths import SCENARIOS
from marl.scenario.load import resolve_callable
from marl.selfplay import IterateMixture


@pytest.fixture(scope="module")
def kuhn():
    return resolve_callable("kuhn_poker_lib:play", SCENARIOS).__globals__  # the module's namespace


def _tabular(kuhn, seed: int) -> dict:
    """A snapshot whose action probabilities are known: P(bet or call) at each information set."""
    rng = random.Random(seed)
    return {key: rng.choice([0.0, 1.0, rng.random()]) for key in kuhn["INFOSETS"]}


def _played_behaviour(kuhn, components, seat: str, opponent: dict) -> dict:
    """The behaviour strategy of `seat` playing the mixture (one component drawn per game with its weight)
    against `opponent`, from the game played exactly: P(reach I and take the aggressive move) / P(reach I)."""
    reach, aggressive = {}, {}

    def walk(strategy, deal, history, probability):
        player = kuhn["to_act"](history)
        if player is None or probability == 0:
            return
        card = deal[0] if player == "first" else deal[1]
        key = (player, card, history)
        p = (strategy if player == seat else opponent)[key]
        if player == seat:
            reach[key] = reach.get(key, 0.0) + probability
            aggressive[key] = aggressive.get(key, 0.0) + probability * p
        passive_word, aggressive_word = kuhn["OFFERS"][(player, history)]
        walk(strategy, deal, f"{history} {passive_word}".strip(), probability * (1 - p))
        walk(strategy, deal, f"{history} {aggressive_word}".strip(), probability * p)

    for weight, _, strategy in components:
        for deal in kuhn["DEALS"]:
            walk(strategy, deal, "", weight / len(kuhn["DEALS"]))
    return {key: aggressive[key] / reach[key] for key in reach if reach[key] > 0}


def _mixture(kuhn) -> tuple[IterateMixture, dict]:
    """Snapshots every 2 steps (0, 2, 4) and the live policy at step 5: weights 2/6, 2/6, 1/6, 1/6."""
    mixture = IterateMixture(every=2, seed=7)
    for step in (0, 2, 4):
        mixture.add(step, _tabular(kuhn, step))
    return mixture, _tabular(kuhn, 5)


def test_the_weights_are_the_steps_each_snapshot_stood_for():
    mixture = IterateMixture(every=1)
    for step in range(4):
        mixture.add(step, f"s{step}")
    assert [(w, s) for w, s, _ in mixture.components(3, live="live")] == [(0.25, 0), (0.25, 1), (0.25, 2), (0.25, 3)]
    every_two = IterateMixture(every=2)
    for step in (0, 2, 4):
        every_two.add(step, f"s{step}")
    components = every_two.components(5, live="live")
    assert [(w, s, x) for w, s, x in components] == [(2 / 6, 0, "s0"), (2 / 6, 2, "s2"), (1 / 6, 4, "s4"),
                                                     (1 / 6, 5, "live")]
    assert [w for w, _, _ in every_two.components(4, live="live")] == [0.4, 0.4, 0.2]  # the snapshot of 4 is it
    assert every_two.due(4) and not every_two.due(5)
    with pytest.raises(ValueError, match="steps move forward"):
        every_two.add(3, "late")
    with pytest.raises(ValueError, match="empty"):
        IterateMixture().components(0)


@pytest.mark.parametrize("seat", ["first", "second"])
def test_the_mixtures_behaviour_strategy_is_the_reach_weighted_average_of_the_snapshots(kuhn, seat):
    mixture, live = _mixture(kuhn)
    components = mixture.components(5, live=live)
    opponent = _tabular(kuhn, 99)
    played = _played_behaviour(kuhn, components, seat, opponent)
    weights, strategies = [w for w, _, _ in components], [s for _, _, s in components]
    average = kuhn["average_strategy"](strategies, weights)
    assert played and all(key[0] == seat for key in played)
    for key, probability in played.items():
        assert probability == pytest.approx(average[key], abs=1e-12), key
        # the definition: sum_k w_k reach_k(I) pi_k(a|I) / sum_k w_k reach_k(I), reach_k of the seat's own moves
        own = [w * kuhn["_moves_reach"](s, key[2], key[0], key[1]) for w, s in zip(weights, strategies)]
        assert probability == pytest.approx(sum(r * s[key] for r, s in zip(own, strategies)) / sum(own), abs=1e-12)
    # and the mixture is worth, against any opponent, the weighted mean of what its snapshots are worth
    value = kuhn["game_value"](average, opponent) if seat == "first" else kuhn["game_value"](opponent, average)
    each = [kuhn["game_value"](s, opponent) if seat == "first" else kuhn["game_value"](opponent, s)
            for s in strategies]
    assert value == pytest.approx(sum(w * v for w, v in zip(weights, each)), abs=1e-12)


def test_the_evaluation_of_a_mixture_reads_its_components_strategies(kuhn):
    class Tabular:
        def __init__(self, strategy):
            self.strategy = strategy

        def __call__(self, agent, observation, task):
            card, history = kuhn["_view"](observation)
            passive, aggressive = kuhn["OFFERS"][(agent, history)]
            return aggressive if self.strategy[(agent, card, history)] > 0.5 else passive

        def probabilities(self, agent, observation, task, messages):
            card, history = kuhn["_view"](observation)
            return [self.strategy[(agent, card, history)]]

    mixture, live = _mixture(kuhn)
    components = mixture.components(5, live=live)
    served = type("Served", (), {"mixture": [(w, Tabular(s)) for w, _, s in components]})()
    weights, strategies = [w for w, _, _ in components], [s for _, _, s in components]
    figures = kuhn["evaluation"](served)
    expected = kuhn["exploitability"](kuhn["average_strategy"](strategies, weights))
    assert figures["exploitability"] == pytest.approx(expected, abs=1e-12)
    greedy = [{key: float(p > 0.5) for key, p in s.items()} for s in strategies]
    assert figures["exploitability_greedy"] == pytest.approx(
        kuhn["exploitability"](kuhn["average_strategy"](greedy, weights)), abs=1e-12)


def test_one_component_is_drawn_per_game_seeded_and_in_its_weights_share():
    mixture = IterateMixture(seed=3)
    weights = [0.5, 0.25, 0.125, 0.125]
    draws = [mixture.draw(weights, f"game-{index}") for index in range(20_000)]
    assert draws[:50] == [mixture.draw(weights, f"game-{index}") for index in range(50)]  # the same game, the same
    for component, weight in enumerate(weights):
        assert draws.count(component) / len(draws) == pytest.approx(weight, abs=0.015)
    other = IterateMixture(seed=4)
    assert [other.draw(weights, f"game-{index}") for index in range(50)] != draws[:50]


def test_the_state_round_trip_keeps_the_snapshots():
    mixture = IterateMixture(every=3, seed=5)
    mixture.add(0, {"w": 1})
    mixture.add(3, {"w": 2})
    copy = IterateMixture()
    copy.load_state_dict(mixture.state_dict())
    assert copy.components(4, live="x") == mixture.components(4, live="x") and copy.every == 3 and copy.seed == 5
