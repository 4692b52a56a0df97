"""Kuhn poker: exact exploitability (0 for the whole Nash family, closed-form values for simple strategies),
the referee's rules (private cards, showdowns, an illegal word is a fold) and the scenario's own figures."""

from __future__ import annotations

import pytest

from helpers.paths import SCENARIOS
from marl.env import make_env
from marl.scenario.load import load_scenario, resolve_callable


@pytest.fixture(scope="module")
def kuhn():
    return resolve_callable("kuhn_poker_lib:play", SCENARIOS).__globals__  # the module's namespace


@pytest.mark.parametrize("alpha", [0.0, 0.1, 1 / 6, 1 / 3])
def test_the_nash_family_is_unexploitable_and_worth_minus_one_eighteenth(kuhn, alpha):
    strategy = kuhn["nash"](alpha)
    assert kuhn["exploitability"](strategy) == pytest.approx(0.0, abs=1e-12)
    assert kuhn["game_value"](strategy, strategy) == pytest.approx(-1 / 18, abs=1e-12)


def test_always_bet_and_always_pass_have_their_closed_form_exploitability(kuhn):
    """Always bet or call: a best-responding second folds J, calls Q (0) and K (+2): 1/3; a best-responding
    first loses 1 with J (check, fold), 0 with Q, +2 with K: 1/3; so (1/3 + 1/3) / 2 = 1/3. Always check or
    fold: each seat's best response bets every hand and wins the ante: (1 + 1) / 2 = 1."""
    always_bet = {key: 1.0 for key in kuhn["nash"]()}
    always_pass = {key: 0.0 for key in kuhn["nash"]()}
    assert kuhn["exploitability"](always_bet) == pytest.approx(1 / 3, abs=1e-12)
    assert kuhn["exploitability"](always_pass) == pytest.approx(1.0, abs=1e-12)


def test_the_strategy_of_a_text_policy_is_read_at_every_information_set(kuhn):
    def aggressive(agent, observation, task):
        return "bet" if "Say bet" in observation else "call"

    assert kuhn["strategy_of"](aggressive) == {key: 1.0 for key in kuhn["nash"]()}
    assert kuhn["strategy_of"](lambda agent, observation, task: "gibberish") == {key: 0.0 for key in kuhn["nash"]()}
    figures = kuhn["evaluation"](aggressive)
    assert figures["exploitability"] == pytest.approx(1 / 3)


def _hand(deal, messages):
    env = make_env("kuhn_poker")
    task = next(t for t in env.tasks if (t.metadata["first"], t.metadata["second"]) == deal)
    observations, _ = env.reset(seed=0, options={"task": task})
    seen = [observations]
    rewards = {}
    for index, text in enumerate(messages):
        mover = ("first", "second")[index % 2]
        observations, rewards, *_ = env.step({mover: {"text": text}})
        seen.append(observations)
        if not env.agents:
            break
    return env, seen, rewards


def test_each_player_sees_its_own_card_only():
    env, seen, _ = _hand(("K", "J"), ["check", "check"])
    assert seen[0]["first"]["text"] == "Card K. Moves: none. Say bet or check." and "J" not in seen[0]["first"]["text"]
    assert seen[1]["second"]["text"] == "Card J. Moves: check. Say bet or check." and "K" not in seen[1]["second"]["text"]


@pytest.mark.parametrize("deal, messages, chips, verdict", [
    (("K", "J"), ["check", "check"], 1, "check check: first wins 1"),
    (("J", "K"), ["bet", "call"], -2, "bet call: second wins 2"),
    (("J", "Q"), ["bet", "fold"], 1, "bet fold: first wins 1"),
    (("Q", "K"), ["check", "bet", "call"], -2, "check bet call: second wins 2"),
    (("Q", "J"), ["check", "bet", "fold"], -1, "check bet fold: second wins 1"),
    (("K", "Q"), ["raise"], -1, "first said 'raise', not check or bet: a fold"),  # an illegal word folds
    (("K", "Q"), ["bet", ""], 1, "second said '', not fold or call: a fold"),
])
def test_showdowns_folds_and_illegal_words(deal, messages, chips, verdict):
    env, _, rewards = _hand(deal, messages)
    assert rewards == {"first": chips / 4, "second": -chips / 4}
    assert env.transcript[-1]["referee"] == verdict and not env.agents


def test_the_evaluation_logs_exploitability_and_games_against_the_equilibrium():
    from marl.rollout import EpisodePlayer
    from trainers.policy.actors import build_actors
    from trainers.team.evaluation import evaluate_team

    scenario = load_scenario("kuhn_poker", ["agents.0.policy=expert", "agents.1.policy=expert"])
    player = EpisodePlayer(scenario, *build_actors(scenario, None, seed=0))
    figures = evaluate_team(player, scenario.split()[1][:12])
    assert 0.0 <= figures["game/exploitability"] <= 1.0 and "game/value_vs_nash" in figures
    assert {"vs/nash/first/reward", "vs/nash/second/not_lost", "vs/nash/not_lost"} <= set(figures)


def test_an_evaluation_that_raises_is_one_line(tmp_path):
    from marl.rollout import EpisodePlayer
    from trainers.policy.actors import build_actors
    from trainers.team.evaluation import evaluate_team

    (tmp_path / "kuhn_poker_lib.py").write_text((SCENARIOS / "kuhn_poker_lib.py").read_text()
                                                + "\n\ndef broken(policy):\n    return {'x': 'high'}\n")
    (tmp_path / "game.yaml").write_text((SCENARIOS / "kuhn_poker.yaml").read_text()
                                        .replace("evaluation: kuhn_poker_lib:evaluation",
                                                 "evaluation: kuhn_poker_lib:broken"))
    scenario = load_scenario(tmp_path / "game.yaml", ["agents.0.policy=expert", "agents.1.policy=expert"])
    player = EpisodePlayer(scenario, *build_actors(scenario, None, seed=0))
    with pytest.raises(ValueError, match=r"evaluation kuhn_poker_lib:broken returned \{'x': 'high'\}, not a"):
        evaluate_team(player, scenario.split()[1][:2])


def test_no_pure_strategy_is_worth_less_than_one_sixth(kuhn):
    """Why the evaluation measures the mixed strategy a model plays: greedy play is a pure strategy, and
    the least exploitable of all 2^12 of them is worth 1/6 (the equilibrium mixes)."""
    import itertools

    keys = list(kuhn["nash"]())
    least = min(kuhn["exploitability"](dict(zip(keys, bits))) for bits in itertools.product((0.0, 1.0), repeat=12))
    assert least == pytest.approx(1 / 6, abs=1e-12)


def test_the_evaluation_reads_the_mixed_strategy_of_a_policy_that_can_say_its_probabilities(kuhn):
    equilibrium = kuhn["nash"](1 / 6)

    class Mixed:  # a policy that samples the equilibrium: greedy it plays the likelier word
        def __call__(self, agent, observation, task):
            passive, aggressive = self.offer(agent, observation)
            return aggressive if self.p(agent, observation, task) > 0.5 else passive

        def offer(self, agent, observation):
            history = observation.split("Moves: ")[1].split(".")[0]
            return kuhn["OFFERS"][(agent, "" if history == "none" else history)]

        def p(self, agent, observation, task):
            history = observation.split("Moves: ")[1].split(".")[0]
            return equilibrium[(agent, task.metadata[agent], "" if history == "none" else history)]

        def probabilities(self, agent, observation, task, messages):
            aggressive = self.offer(agent, observation)[1]
            return [self.p(agent, observation, task) if m == aggressive else 0.0 for m in messages]

    assert kuhn["mixed_strategy_of"](Mixed()) == pytest.approx(equilibrium)
    figures = kuhn["evaluation"](Mixed())
    assert figures["exploitability"] == pytest.approx(0.0, abs=1e-12)
    assert figures["exploitability_greedy"] >= 1 / 6 - 1e-12
    assert kuhn["mixed_strategy_of"](lambda agent, observation, task: "bet") is None  # a scripted policy


def test_the_average_strategy_is_worth_what_drawing_one_strategy_per_hand_is(kuhn):
    """Kuhn's theorem: the reach-weighted average of strategies plays like drawing one of them per hand, so
    against any opponent it is worth the mean of their values; the plain mean of the moves is not."""
    import random

    keys = list(kuhn["nash"]())
    rng = random.Random(3)
    strategies = [{key: rng.random() for key in keys} for _ in range(4)]
    opponent = {key: rng.random() for key in keys}
    average = kuhn["average_strategy"](strategies)
    mean_first = sum(kuhn["game_value"](s, opponent) for s in strategies) / 4
    mean_second = sum(kuhn["game_value"](opponent, s) for s in strategies) / 4
    assert kuhn["game_value"](average, opponent) == pytest.approx(mean_first, abs=1e-12)
    assert kuhn["game_value"](opponent, average) == pytest.approx(mean_second, abs=1e-12)
    plain = {key: sum(s[key] for s in strategies) / 4 for key in keys}
    assert kuhn["game_value"](plain, opponent) != pytest.approx(mean_first, abs=1e-6)
    # first's later decision after 'check bet' is weighted by how often each strategy checks first
    always_bet, always_check = ({key: value for key in keys} for value in (1.0, 0.0))
    two = kuhn["average_strategy"]([always_bet, always_check])
    assert two[("first", "Q", "check bet")] == 0.0  # only always_check ever reaches it
    assert two[("first", "Q", "")] == 0.5 and two[("second", "K", "bet")] == 0.5


def test_averaging_two_equilibria_stays_an_equilibrium_and_averaging_needs_a_strategy(kuhn):
    average = kuhn["average_strategy"]([kuhn["nash"](0.0), kuhn["nash"](1 / 3)])
    assert kuhn["exploitability"](average) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="at least one strategy"):
        kuhn["average_strategy"]([])
