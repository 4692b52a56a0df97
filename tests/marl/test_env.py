"""The scenario environment: turns, visibility, clipping, termination, tools, rewards in every mode."""

import math
import shutil

import pytest

from marl.env import make_env
from marl.policies import get_policy, rollout
from marl.scenario.load import load_scenario
from helpers.paths import FIXTURES



def _scenario(tmp_path, **sections):
    """A scenario dict written next to env_lib.py so 'env_lib:...' references resolve."""
    shutil.copy(FIXTURES / "env_lib.py", tmp_path / "env_lib.py")
    base = {
        "name": "t", "agents": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
        "tasks": {"inline": [{"prompt": "p1", "answer": "A"}, {"prompt": "p2", "answer": "B"}]},
        "rewards": {"answer_from": "c", "outcome": [{"kind": "exact"}]},
    }
    base.update(sections)
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(base))
    return load_scenario(path)


def _play(env, texts: dict[str, str], seed=0):
    observations, _ = env.reset(seed=seed, options={"task": 0})
    seen = []
    while env.agents:
        acting = env.acting_agents()
        seen.append((acting, {a: observations[a]["text"] for a in acting}))
        observations, rewards, terms, truncs, infos = env.step({a: {"text": texts.get(a, "")} for a in env.agents})
    return seen, rewards, terms, truncs, infos


def test_round_robin_turns_and_default_visibility(tmp_path):
    env = make_env(_scenario(tmp_path, graph={"rounds": 2}))
    seen, rewards, terms, *_ = _play(env, {"a": "x", "b": "y", "c": "A"})
    assert [acting for acting, _ in seen] == [("a",), ("b",), ("c",)] * 2
    assert "a: x" in seen[2][1]["c"] and "b: y" in seen[2][1]["c"]  # everyone sees everyone
    assert rewards == {"a": 1.0, "b": 1.0, "c": 1.0} and all(terms.values())


def test_topological_order_and_restricted_visibility(tmp_path):
    agents = [{"name": "a", "observation": "{msg.b}|{msg.c}"}, {"name": "b"},
              {"name": "c", "observation": "{msg.a}+{msg.b}"}]
    env = make_env(_scenario(tmp_path, agents=agents, graph={"edges": [["a", "c"], ["b", "c"]],
                                                             "order": "topological"}))
    seen, *_ = _play(env, {"a": "1", "b": "2", "c": "A"})
    assert [acting for acting, _ in seen] == [("a", "b"), ("c",)]
    assert seen[1][1]["c"] == "1+2"
    env.reset(seed=0)
    env.step({"a": "1", "b": "2", "c": "ignored"})
    assert env._observe("a")["text"] == "|"  # a sees neither b nor c


def test_schedule_and_off_turn_actions_are_ignored(tmp_path):
    env = make_env(_scenario(tmp_path, graph={"order": "schedule", "schedule": ["c", ["a", "b"]]}))
    env.reset(seed=0)
    _, _, _, _, infos = env.step({"a": "not my turn", "b": "nor mine", "c": "first"})
    assert [t["agent"] for t in env.transcript] == ["c"]
    assert infos["a"]["your_turn"] and infos["b"]["your_turn"] and not infos["c"]["your_turn"]


def test_end_on_terminates_early_and_max_cycles_truncates(tmp_path):
    env = make_env(_scenario(tmp_path, graph={"rounds": 5, "end_on": "DONE.*"}))
    seen, _, terms, truncs, _ = _play(env, {"a": "DONE now"})
    assert len(seen) == 1 and all(terms.values()) and not any(truncs.values())
    env = make_env(_scenario(tmp_path, graph={"rounds": 5}), max_cycles=4)
    seen, _, terms, truncs, _ = _play(env, {})
    assert len(seen) == 4 and all(truncs.values()) and not any(terms.values())


def test_everything_emitted_is_clipped_to_its_space(tmp_path):
    env = make_env(_scenario(tmp_path, observation_max_chars=20, action_max_chars=5))
    observations, _ = env.reset(seed=0)
    env.step({"a": "0123456789 caf\u00e9 \u2603"})
    assert env.transcript[0]["text"] == "01234"
    env.step({"b": "\u00e9\u00e9\u00e9"})
    assert env.transcript[1]["text"] == "???"
    for agent in env.agents:
        observation = env._observe(agent)
        assert env.observation_space(agent).contains(observation) and len(observation["text"]) <= 20


def test_reset_is_deterministic_for_a_seed(tmp_path):
    env = make_env(_scenario(tmp_path, tasks={"inline": [{"prompt": f"p{i}", "answer": "A"} for i in range(20)]}))
    picks = [env.reset(seed=s)[1]["a"]["task_id"] for s in (1, 2, 1, 2)]
    assert picks[0] == picks[2] and picks[1] == picks[3]


def test_competitive_rewards_are_zero_sum(tmp_path):
    env = make_env(_scenario(tmp_path, mode="competitive", rewards={"outcome": [{"kind": "exact"}]}))
    _, rewards, *_ = _play(env, {"a": "A", "b": "wrong", "c": "A"})
    assert sum(rewards.values()) == pytest.approx(0.0)
    assert rewards["a"] == rewards["c"] > 0 > rewards["b"]


def test_mixed_mode_is_zero_sum_between_teams(tmp_path):
    env = make_env(_scenario(tmp_path, mode="mixed", teams={"x": ["a", "b"], "y": ["c"]},
                             rewards={"outcome": [{"kind": "exact"}]}))
    _, rewards, *_ = _play(env, {"a": "A", "b": "A", "c": "no"})
    assert rewards["a"] == rewards["b"] == pytest.approx(0.5) and rewards["c"] == pytest.approx(-0.5)


def test_a_failed_judge_masks_the_reward_instead_of_scoring_zero(tmp_path):
    env = make_env(_scenario(tmp_path, rewards={"answer_from": "c", "outcome": [
        {"kind": "callable", "function": "env_lib:always_fails"}]}))
    _, rewards, _, _, infos = _play(env, {"c": "A"})
    assert all(math.isnan(r) for r in rewards.values())
    component = infos["a"]["reward_breakdown"]["team"]["components"][0]
    assert component["status"] == "api_error" and component["score"] is None


def test_process_layer_gives_a_third_to_a_correct_answer_without_markers(tmp_path):
    rewards_spec = {"answer_from": "c", "normalize": False, "weights": {"outcome": 0.6, "process": 0.3},
                    "outcome": [{"kind": "exact"}], "process": [{"kind": "process", "markers": ["because"]}]}
    env = make_env(_scenario(tmp_path, rewards=rewards_spec))
    _, rewards, *_ = _play(env, {"c": "A"})
    assert rewards["c"] == pytest.approx(0.6 + 0.3 / 3)
    _, rewards, *_ = _play(env, {"a": "because", "c": "A"})
    assert rewards["c"] == pytest.approx(0.9)


def test_tools_run_from_agent_text_and_validity_is_counted(tmp_path):
    tools = [{"name": "echo", "function": "env_lib:echo", "description": "echo text",
              "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]
    agents = [{"name": "a", "tools": ["echo"], "observation": "{tools}\n{tool_results}"}, {"name": "b"}, {"name": "c"}]
    env = make_env(_scenario(tmp_path, tools=tools, agents=agents, graph={"rounds": 2}))
    env.reset(seed=0)
    _, _, _, _, infos = env.step({"a": 'echo(text="hi") then echo(nope=1)'})
    assert [r["result"] for r in infos["a"]["tool_results"]] == ["echo:hi", infos["a"]["tool_results"][1]["result"]]
    assert infos["a"]["tool_results"][1]["ok"] is False
    assert infos["a"]["tool_validity"] == 0.5
    assert "[echo] echo:hi" in env._observe("a")["text"] and "echo(text: string)" in env._observe("a")["text"]


def test_scripted_random_and_null_policies(tmp_path):
    scenario = _scenario(tmp_path)
    env = make_env(scenario)
    from marl.types import Task

    scripted = rollout(env, get_policy("env_lib:shout", scenario), task=Task(id="x", prompt="p", answer="C"))
    assert [t["text"] for t in scripted.transcript] == ["A", "B", "C"] and scripted.rewards["a"] == 1.0
    noisy = rollout(env, get_policy("random", scenario, seed=3), task=0)
    assert noisy.rewards["a"] == 0.0
    assert [t["text"] for t in rollout(env, get_policy("null", scenario), task=0).transcript] == ["", "", ""]
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("clever", scenario)


def test_step_after_the_end_is_an_error(tmp_path):
    env = make_env(_scenario(tmp_path))
    _play(env, {})
    with pytest.raises(RuntimeError, match="reset"):
        env.step({})
