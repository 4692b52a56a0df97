"""Every built-in scenario: PettingZoo's own tests, observations inside their spaces, and rewards that
discriminate (the expert scores >= 0.95, the null policy about 0)."""

import math
import statistics

import pytest

from marl.env import make_env
from marl.policies import get_policy, mean_reward, rollout
from marl.scenario.load import BUILTIN_DIR, load_scenario
from marl.testing import scenario_conformance

SCENARIOS = sorted(path.stem for path in BUILTIN_DIR.glob("*.yaml"))
EPISODES = 20


def test_the_builtin_scenarios_are_all_here():
    assert {"relay", "weather", "text_to_sql", "code_pair", "debate", "negotiation", "tictactoe",
            "kuhn_poker"} <= set(SCENARIOS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_pettingzoo_conformance_and_observations_in_space(name):
    checked = scenario_conformance(name)
    assert checked["parallel"] > 0 and checked["aec"] > 0


def _scores(name: str, policy_name: str) -> list[float]:
    scenario = load_scenario(name)
    env = make_env(scenario)
    train, held_out = scenario.split()
    tasks = (held_out or train)[:EPISODES]
    policy = get_policy(policy_name, scenario)
    scores = []
    for index, task in enumerate(tasks):
        result = rollout(env, policy, task=task, seed=index)
        if scenario.spec.mode == "cooperative":
            scores.append(statistics.fmean(result.rewards.values()))
        else:  # zero-sum: judge each side's own score
            scores.append(max(b.total for b in result.breakdown.values()))
    return scores


def _null_seat_scores(name: str) -> list[float]:
    """A competitive scenario: the null policy's own score in each seat, the expert in every other."""
    scenario = load_scenario(name)
    env, (train, held_out) = make_env(scenario), scenario.split()
    expert, null = get_policy("expert", scenario), get_policy("null", scenario)
    scores = []
    for seat in scenario.agent_names:
        def mixed(agent, observation, task, seat=seat):
            return (null if agent == seat else expert)(agent, observation, task)
        for index, task in enumerate((held_out or train)[:EPISODES // 2]):
            scores.append(rollout(env, mixed, task=task, seed=index).breakdown[seat].total)
    return scores


GAMES_OF_CHANCE = {"kuhn_poker"}  # the expert's hands are won and lost by the cards: tests/marl/scenario/test_kuhn_poker.py
EXPERT_FLOOR = {"negotiation": 0.5}  # two experts agree on the efficient split, which scores 0.5 for each by design


@pytest.mark.parametrize("name", [name for name in SCENARIOS if name not in GAMES_OF_CHANCE])
def test_rewards_discriminate_expert_from_null(name):
    """The expert scores >= 0.95 (negotiation: its fair deal, 0.5); the null policy about 0 (cooperative:
    the whole team null; competitive: one null seat against the expert, since a game can hand the other
    seat a win by forfeit)."""
    competitive = load_scenario(name).spec.mode != "cooperative"
    expert, null = _scores(name, "expert"), _null_seat_scores(name) if competitive else _scores(name, "null")
    assert not any(math.isnan(s) for s in expert + null)
    assert statistics.fmean(expert) >= EXPERT_FLOOR.get(name, 0.95), expert
    assert statistics.fmean(null) <= 0.05, null


def test_relay_is_deterministic_for_a_seed():
    env = make_env("relay")
    first = env.reset(seed=7)[0]
    assert env.reset(seed=7)[0] == first
    assert mean_reward(env, get_policy("expert", env.scenario), env.tasks[:5]) == 1.0


def _weather_total(messages: list[str]) -> float:
    env = make_env("weather")
    task = next(t for t in env.tasks if t.metadata.get("city") == "Paris")
    env.reset(seed=0, options={"task": task})
    rewards = {}
    for text in messages:
        _, rewards, *_ = env.step({"runner": {"text": text.replace("VERDICT", task.answer)}})
        if not env.agents:
            break
    return rewards["runner"]


@pytest.mark.parametrize("messages,expected", [
    (['get_weather(city="Paris")\nget_air_quality(city="Paris")', "ANSWER: VERDICT"], 1.5),
    (['get_weather(city="Paris")', "ANSWER: VERDICT"], 1.0),
    (['get_weather(city="Paris")\nget_air_quality(city="Paris")', "ANSWER: wrong"], 0.5),
    (["ANSWER: VERDICT"], -0.5),  # answering blind
    (['get_weather(city="Paris") ANSWER: VERDICT'], 0.0),  # the answer came before the weather was seen
    (["", "", ""], 0.0),  # silence is not an answer
])
def test_weather_rewards_follow_the_rules(messages, expected):
    assert _weather_total(messages) == pytest.approx(expected)
