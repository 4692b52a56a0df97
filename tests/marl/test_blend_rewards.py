"""rewards.blend: a rule verifier and a model judge (a real loopback endpoint) blended into the outcome,
and the trainer's shrinkage of judge-decided rewards toward their group mean."""

from __future__ import annotations

import math
import re

import pytest
import yaml

from helpers.judge_server import JudgeServer
from marl.scenario.load import ScenarioError, load_scenario
from trainers.policy.actors import ScriptedActor
from marl.rollout import EpisodeJob, EpisodePlayer
from marl.credit.replay import shrink_factors, shrink_rewards

TASKS = [{"id": "checked", "prompt": "2+2=", "answer": "4"}, {"id": "open", "prompt": "Write a line."}]


def _rating(body) -> tuple:
    """The judge reads 'RATE<d>' inside the candidate and answers that rating; no marker: a 400."""
    found = re.search(r"RATE(\d)", body["messages"][-1]["content"])
    return ("ok", f"Rating: [[{found.group(1)}]]") if found else ("status", 400)


def _scenario(tmp_path, url, **blend):
    spec = {
        "name": "blended", "agents": [{"name": "writer", "observation": "{prompt}"}],
        "tasks": {"inline": TASKS},
        "judges": [{"name": "critic", "backend": "openai", "model": "judge", "base_url": url,
                    "api_key_env": "NO_SUCH_KEY", "timeout_s": 5, "scale": [1, 9]}],
        "rewards": {"outcome": [{"kind": "exact"}, {"kind": "critic"}], "blend": {"rule": "exact", "judge": "critic",
                                                                               **blend}},
        "train": {"group_size": 4},
    }
    path = tmp_path / "blended.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_scenario(path)


def _play(scenario, answers: list[str], task: int):
    answers = iter(answers)
    actors = {"writer": ScriptedActor("writer", lambda agent, observation, t: next(answers))}
    player = EpisodePlayer(scenario, actors, {"writer": "writer"})
    jobs = [EpisodeJob(scenario.tasks()[task], seed) for seed in range(4)]
    return player, player.play(jobs).episodes


def test_gate_takes_the_rule_where_it_applies_and_the_judge_elsewhere(tmp_path):
    with JudgeServer(default=_rating) as server:
        scenario = _scenario(tmp_path, server.url)
        _, checked = _play(scenario, ["4 RATE1", "5 RATE9", "4 RATE1", "5 RATE9"], task=0)
        _, open_ = _play(scenario, ["RATE9", "RATE5", "RATE1", "no rating"], task=1)
    assert [e.team_reward() for e in checked] == [0.0, 0.0, 0.0, 0.0]  # exact needs the answer alone
    assert [e.breakdown["team"].blend["source"] for e in checked] == ["rule"] * 4
    assert [e.team_reward() for e in open_][:3] == pytest.approx([1.0, 0.5, 0.0])
    assert [e.breakdown["team"].blend["source"] for e in open_] == ["judge", "judge", "judge", "masked"]
    assert math.isnan(open_[3].team_reward())  # a failed judgment is masked, never 0


def test_sum_mode_weights_rule_and_judge(tmp_path):
    with JudgeServer(default=_rating) as server:
        scenario = _scenario(tmp_path, server.url, mode="sum", weights=[3, 1])
        _, episodes = _play(scenario, ["4", "4", "4", "4"], task=0)
    # the exact rule passes and the judge fails on every answer: sum needs both, so all are masked
    assert all(math.isnan(e.team_reward()) for e in episodes)
    with JudgeServer(default=("ok", "Rating: [[5]]")) as server:
        scenario = _scenario(tmp_path, server.url, mode="sum", weights=[3, 1])
        _, episodes = _play(scenario, ["4", "5", "4", "5"], task=0)
    assert [e.team_reward() for e in episodes] == pytest.approx([(3 + 0.5) / 4, 0.5 / 4] * 2)


def test_the_trainer_shrinks_judge_decided_rewards_toward_the_group_mean(tmp_path):
    with JudgeServer(default=_rating) as server:
        scenario = _scenario(tmp_path, server.url, default_variance=0.05)
        player, episodes = _play(scenario, ["RATE9", "RATE5", "RATE1", "RATE3"], task=1)
    raw = [1.0, 0.5, 0.0, 0.25]
    assert [e.team_reward() for e in episodes] == pytest.approx(raw)
    factors = shrink_factors(episodes, 4, scenario.spec)
    mean, spread = sum(raw) / 4, sum((r - sum(raw) / 4) ** 2 for r in raw) / 4
    factor = 1 / (1 + 0.05 / spread)
    assert factors == pytest.approx([factor] * 4)
    assert all(e.breakdown["team"].blend["shrink"] == pytest.approx(factor) for e in episodes)
    rows = [{"writer": r, "other": 2 * r} for r in raw]  # per-agent rewards, e.g. after credit assignment
    assert shrink_rewards(rows, factors, 4, ["writer", "other"]) == 4
    assert [row["writer"] for row in rows] == pytest.approx([mean + factor * (r - mean) for r in raw])
    assert [row["other"] for row in rows] == pytest.approx([2 * (mean + factor * (r - mean)) for r in raw])


def test_shrinkage_leaves_rule_decided_rewards_alone(tmp_path):
    with JudgeServer(default=_rating) as server:
        scenario = _scenario(tmp_path, server.url)
        player, episodes = _play(scenario, ["4", "5", "4", "4"], task=0)
    rewards = [e.team_reward() for e in episodes]
    assert rewards == [1.0, 0.0, 1.0, 1.0]
    assert shrink_factors(episodes, 4, scenario.spec) == [None] * 4
    rows = [{"writer": r} for r in rewards]
    assert shrink_rewards(rows, [None] * 4, 4, ["writer"]) == 0 and [row["writer"] for row in rows] == rewards


def test_blend_must_name_the_outcome_layers_rule_and_judge(tmp_path):
    with pytest.raises(ScenarioError) as raised:
        _scenario(tmp_path, "http://127.0.0.1:1/v1", rule="numeric")
    message = str(raised.value)
    assert "rewards.outcome" in message and "exactly the rule 'numeric' and the judge 'critic'" in message
    with pytest.raises(ScenarioError, match="is not a judge under `judges`"):
        _scenario(tmp_path, "http://127.0.0.1:1/v1", judge="nobody")


def test_finished_episodes_are_judged_concurrently(tmp_path):
    """The lockstep player scores the episodes that end together in threads: judge requests overlap."""
    with JudgeServer(default=("ok", "Rating: [[5]]"), latency_s=0.2) as server:
        scenario = _scenario(tmp_path, server.url)
        player, episodes = _play(scenario, ["RATE5"] * 4, task=1)
        assert server.requests == 4 and server.max_in_flight > 1
    assert [e.team_reward() for e in episodes] == pytest.approx([0.5] * 4)
