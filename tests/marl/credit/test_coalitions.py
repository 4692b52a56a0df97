"""Coalition values from a scenario: every absent-agent policy, common random numbers, caching."""

import pytest

from marl.credit.coalitions import ScenarioCoalitionValue
from marl.env import make_env
from marl.policies import get_policy

ALL = frozenset({"left", "right", "final"})


@pytest.fixture
def relay():
    env = make_env("relay")
    return env, get_policy("expert", env.scenario), env.tasks[0]


@pytest.mark.parametrize("absent", ["null_message", "skip_turn", "replay"])
def test_relay_needs_every_agent(relay, absent):
    env, expert, task = relay
    v = ScenarioCoalitionValue(env, expert, task, absent=absent)
    assert v(ALL) == 1.0
    for missing in ALL:
        assert v(ALL - {missing}) == 0.0
    assert v(frozenset()) == 0.0


def test_mask_credits_only_what_the_transcript_still_shows(relay):
    env, expert, task = relay
    v = ScenarioCoalitionValue(env, expert, task, absent="mask")
    # no re-run: final's answer was already written, so blanking left or right changes nothing downstream
    assert v(ALL - {"left"}) == v(ALL - {"right"}) == 1.0 and v(ALL - {"final"}) == 0.0


def test_default_policy_stands_in_for_the_absent_agent(relay):
    env, expert, task = relay
    v = ScenarioCoalitionValue(env, expert, task, absent="default_policy", default_policy=expert)
    assert v(frozenset({"final"})) == 1.0  # the stand-in is the expert itself: nobody is missed


def _recording(policy, calls: list):
    """The policy, noting in `calls` which agent it spoke for each time."""
    def act(agent, observation, task):
        calls.append(agent)
        return policy(agent, observation, task)

    return act


def test_episodes_are_cached_per_coalition_and_seed(relay):
    env, expert, task = relay
    calls = []
    v = ScenarioCoalitionValue(env, _recording(expert, calls), task, rollouts=3)
    v(ALL), v(ALL)
    assert len(calls) == 3 * 3 and sorted(seed for _, seed in v.returns) == [0, 1, 2]


def test_mask_replays_nothing(relay):
    env, expert, task = relay
    calls = []
    v = ScenarioCoalitionValue(env, _recording(expert, calls), task, absent="mask")
    v(frozenset({"left"})), v(frozenset({"right", "final"}))
    assert len(calls) == 3  # only the full-team reference episode was played


def test_replay_keeps_messages_before_the_first_absence(relay):
    env, expert, task = relay
    seen = []
    v = ScenarioCoalitionValue(env, _recording(expert, seen), task, absent="replay")
    v(ALL)
    seen.clear()
    v(frozenset({"left", "final"}))  # right is absent in the first turn, so only final regenerates
    assert seen == ["final"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(absent="vanish"), "not one of"),
    (dict(absent="default_policy"), "needs a default policy"),
    (dict(absent="resample"), "accepts seed"),
])
def test_bad_choices_are_explained(relay, kwargs, message):
    env, expert, task = relay
    with pytest.raises(ValueError, match=message):
        ScenarioCoalitionValue(env, expert, task, **kwargs)


def test_competitive_scenarios_have_no_team_reward_to_split():
    env = make_env("debate")
    with pytest.raises(ValueError, match="team reward"):
        ScenarioCoalitionValue(env, get_policy("expert", env.scenario), env.tasks[0])


def test_relay_credit_matches_the_closed_form(relay):
    from marl.credit.coalitions import episode_credit
    from marl.scenario.spec import CreditSpec

    env, expert, task = relay
    shapley, _ = episode_credit(env, expert, task, CreditSpec(method="shapley"))
    difference, _ = episode_credit(env, expert, task, CreditSpec(method="difference"))
    masked, _ = episode_credit(env, expert, task, CreditSpec(method="shapley", absent="mask"))
    assert shapley.values == pytest.approx({"left": 1 / 3, "right": 1 / 3, "final": 1 / 3}, abs=1e-12)
    assert sum(shapley.values.values()) == pytest.approx(1.0)  # efficient: the team reward is conserved
    assert difference.values == {"left": 1.0, "right": 1.0, "final": 1.0}
    assert masked.values == pytest.approx({"left": 0.0, "right": 0.0, "final": 1.0}, abs=1e-12)


def test_cli_credit_prints_a_table(tmp_path):
    from helpers.inprocess import marl_in_process

    result = marl_in_process("credit", "relay", "--episodes", "3", "--method", "shapley", "--absent", "null_message")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[2:5]}
    assert rows == {agent: ["0.3333", "0.0000", "0.0000"] for agent in ("left", "right", "final")}
    bad = marl_in_process("credit", "relay", "--absent", "vanish")
    assert bad.returncode == 2 and "credit.absent" in bad.stderr and "Traceback" not in bad.stderr


def test_exact_credit_plays_every_coalition_with_one_batched_call_per_turn(relay):
    from marl.credit.coalitions import episode_credit
    from marl.scenario.spec import CreditSpec

    env, expert, task = relay

    class BatchedExpert:
        """A policy that answers many prompts at once, like an LLM's batched generate."""

        def __init__(self):
            self.batches = []

        def __call__(self, agent, observation, task_):
            raise AssertionError("the batched path must not fall back to one call per agent")

        def batch(self, requests):
            self.batches.append(len(requests))
            return [expert(*request) for request in requests]

    policy = BatchedExpert()
    estimate, value = episode_credit(env, policy, task, CreditSpec(method="shapley", rollouts=2))
    assert estimate.values == pytest.approx({"left": 1 / 3, "right": 1 / 3, "final": 1 / 3}, abs=1e-12)
    assert len(policy.batches) == 2  # relay has two turns: (left, right), then final
    assert len(value.returns) == 8 * 2  # every coalition, every seed, played once
    assert sum(policy.batches) == 2 * (4 + 4 + 4)  # each agent is present in 4 of the 8 coalitions
