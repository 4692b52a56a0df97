"""Scenario coalition values through the one engine (marl.rollout): the values pinned from the coalition
player that came before it (deterministic scripted policies only), and the engine surface they use."""

import math

import pytest

from marl.credit.coalitions import ABSENT_POLICIES, ScenarioCoalitionValue
from marl.env import make_env
from marl.policies import get_policy
from marl.rollout import ABSENT_MODES, EpisodeJob, EpisodePlayer, PolicyActor, policy_player

SEVEN_NINTHS, ONE_THIRD = 0.7777777777777778, 0.33333333333333337
# v(S) of code_pair's first task with the expert, one rollout, seed 0: computed by the separate
# coalition player before the merge (commit a568a39)
CODE_PAIR = {
    "null_message": {(): 0.0, ("coder",): SEVEN_NINTHS, ("tester",): ONE_THIRD, ("coder", "tester"): 1.0},
    "default_policy": {(): 1.0, ("coder",): 1.0, ("tester",): 1.0, ("coder", "tester"): 1.0},
}
CODE_PAIR["skip_turn"] = CODE_PAIR["replay"] = CODE_PAIR["mask"] = CODE_PAIR["null_message"]
# relay (left and right each add a pair, final adds their sums) under mask: final's answer was already written
RELAY_MASK = {(): 0.0, ("final",): 1.0, ("final", "left"): 1.0, ("final", "right"): 1.0, ("left",): 0.0,
              ("left", "right"): 0.0, ("right",): 0.0, ("final", "left", "right"): 1.0}


@pytest.fixture(scope="module")
def code_pair():
    env = make_env("code_pair")
    return env, get_policy("expert", env.scenario), env.tasks[0]


@pytest.mark.parametrize("absent", sorted(CODE_PAIR))
def test_code_pair_values_are_those_of_the_player_before_the_merge(code_pair, absent):
    env, expert, task = code_pair
    value = ScenarioCoalitionValue(env, expert, task, absent=absent,
                                   default_policy=expert if absent == "default_policy" else None)
    value.evaluate_many([frozenset(c) for c in CODE_PAIR[absent]])
    assert {c: value(frozenset(c)) for c in CODE_PAIR[absent]} == CODE_PAIR[absent]


def test_relay_mask_values_are_those_of_the_player_before_the_merge():
    env = make_env("relay")
    value = ScenarioCoalitionValue(env, get_policy("expert", env.scenario), env.tasks[0], absent="mask", rollouts=2)
    assert {c: value(frozenset(c)) for c in RELAY_MASK} == RELAY_MASK


def test_resample_calls_the_absent_agents_policy_with_the_shifted_seed():
    env = make_env("relay")
    expert, seeds = get_policy("expert", env.scenario), []

    def policy(agent, observation, task, seed=None):
        if seed is None:
            return expert(agent, observation, task)
        seeds.append((agent, seed))
        return ""  # a resampled message that is always wrong

    value = ScenarioCoalitionValue(env, policy, env.tasks[0], absent="resample", rollouts=2, seed=10)
    assert value(frozenset({"left", "final"})) == 0.0 and value(frozenset({"left", "right", "final"})) == 1.0
    assert seeds == [("right", 10 + 1_000_003), ("right", 11 + 1_000_003)]


def test_the_coalition_value_plays_through_the_engine_on_the_given_environment():
    env = make_env("relay")
    value = ScenarioCoalitionValue(env, get_policy("expert", env.scenario), env.tasks[0])
    assert isinstance(value.player, EpisodePlayer) and value.player._envs[0] is env
    value.evaluate_many([frozenset(), frozenset({"left"}), frozenset({"left", "right", "final"})])
    assert len(value.player._envs) == 3  # one lockstep batch, the extra environments sharing env's scorer
    assert all(other.scorer is env.scorer for other in value.player._envs)


def test_the_absent_modes_are_listed_once():
    from typing import get_args

    from marl.scenario.spec import CreditSpec

    assert ABSENT_POLICIES is ABSENT_MODES
    assert set(get_args(CreditSpec.model_fields["absent"].annotation)) == set(ABSENT_MODES)
    with pytest.raises(ValueError, match="not one of null_message, skip_turn"):
        ScenarioCoalitionValue(make_env("relay"), None, None, absent="vanish")


# -- the engine surface the merge added --------------------------------------------------------------

def test_policy_actor_calls_in_the_given_order_and_answers_in_request_order():
    calls = []

    def policy(agent, observation, task):
        calls.append(agent)
        return agent.upper()

    requests = [("b", "", None), ("c", "", None), ("a", "", None)]
    assert PolicyActor(policy, order=["a", "b", "c"]).act(requests).texts == ["B", "C", "A"]
    assert calls == ["a", "b", "c"]
    calls.clear()
    assert PolicyActor(policy).act(requests).texts == ["B", "C", "A"] and calls == ["b", "c", "a"]


def test_policy_actor_uses_batch_only_without_an_order():
    class Batched:
        def __call__(self, agent, observation, task):
            return "one"

        def batch(self, requests):
            return ["many"] * len(requests)

    requests = [("a", "", None), ("b", "", None)]
    assert PolicyActor(Batched()).act(requests).texts == ["many", "many"]
    assert PolicyActor(Batched(), order=["a", "b"]).act(requests).texts == ["one", "one"]


def test_history_rule_keeps_recorded_messages_until_the_transcript_differs():
    env = make_env("relay")
    expert, calls = get_policy("expert", env.scenario), []

    def policy(agent, observation, task):
        calls.append(agent)
        return expert(agent, observation, task)

    player = policy_player(env, policy, order=env.possible_agents)
    [full] = player.play([EpisodeJob(env.tasks[0], 0)]).episodes
    history = [{k: t[k] for k in ("agent", "text", "turn")} for t in full.transcript]
    calls.clear()
    [same] = player.play([EpisodeJob(env.tasks[0], 0, coalition=frozenset(env.possible_agents),
                                     absent_mode="replay", history=history)]).episodes
    # the first message of each step is the next recorded one; right (second in its step) regenerates
    assert same.transcript == full.transcript and calls == ["right"]
    calls.clear()
    [changed] = player.play([EpisodeJob(env.tasks[0], 0, coalition=frozenset({"right", "final"}),
                                        absent_mode="replay", history=history)]).episodes
    assert calls == ["right", "final"] and changed.team_reward() == 0.0


def test_the_player_names_its_visibility_graph_and_resolves_the_default_policy_when_needed():
    from marl.scenario.load import load_scenario

    scenario = load_scenario("relay")  # credit.default_policy: relay_lib:expert
    player = EpisodePlayer(scenario, {}, {})
    assert set(player.visibility.predecessors("final")) == {"left", "right"}
    assert player._default_policy is None and player.default_policy is not None


def test_policies_rollout_is_the_engine_with_one_policy():
    from marl.policies import rollout

    env = make_env("relay")
    expert = get_policy("expert", env.scenario)
    result = rollout(env, expert, task=1, seed=4)
    [episode] = policy_player(env, expert).play([EpisodeJob(1, 4)]).episodes
    assert result.transcript == episode.transcript and result.rewards == episode.rewards
    assert result.task == env.tasks[1] and [o["agent"] for o in result.observations] == ["left", "right", "final"]


def test_a_non_finite_value_is_a_typed_error():
    from marl.credit.estimators import CoalitionError, NonFiniteValue, shapley

    with pytest.raises(NonFiniteValue) as raised:
        shapley(lambda c: math.nan if c else 0.0, ["a", "b"])
    assert isinstance(raised.value, CoalitionError)
