"""MultiAgentTrainer.step() on the relay and a two-player race, with the micro policy (instant, untrained).

What is asserted is behaviour, never sampled tokens: the step result names what was played and trained
on, a masked reward stays NaN with advantage 0, one shared model trains on every agent's turns,
cooperative credit splits the team reward, competitive rewards are each agent's own, and a restored
state continues exactly like the trainer it came from.
"""

from __future__ import annotations

import math

import pytest
import torch

from marl.scenario.load import load_scenario
from trainers.grpo.config import GRPOConfig
from trainers.policy.actors import ModelActor
from trainers.config import resolve_config
from trainers.team.trainer import MultiAgentTrainer, StepPlan, StepResult
from helpers.scenario_files import race_yaml

PROMPTS, G = 2, 2
RELAY = ["tasks.count=40", "tasks.eval_count=4", "credit.absent=null_message"]  # v(nobody) = 0: silence scores 0
RACE = race_yaml()


def _by_seed(episode, agent, reward):
    """A reward transform that gives the two members of every group different rewards: a signal to train on."""
    return reward + episode.job.seed % 2


@pytest.fixture
def team(micro_policy):
    """Factory of a trainer whose every agent is played by one trainable micro model ('shared')."""

    def make(scenario: str = "relay", overrides=RELAY):
        spec = load_scenario(scenario, list(overrides))
        model, tokenizer = micro_policy()
        actors = {"shared": ModelActor("shared", model, tokenizer, seed=0)}
        seats = {agent: "shared" for agent in spec.agent_names}
        config = GRPOConfig(steps=4, prompts_per_step=PROMPTS, group_size=G, max_new_tokens=4, lr=1e-3, seed=0,
                            floor_reward=0.0, diversity_penalty=0.0)
        train_tasks, _ = spec.split()
        return MultiAgentTrainer(spec, actors, seats, train_tasks, resolve_config(spec, grpo=config), log=lambda message: None)

    return make


def _spy_updates(trainer, name: str = "shared") -> list:
    """Record (completions, advantages) of every update of the learner `name`, which still runs."""
    learner, calls = trainer.learners[name], []
    update = learner.update

    def spy(completions, advantages, **kwargs):
        calls.append((completions, advantages))
        return update(completions, advantages, **kwargs)

    learner.update = spy
    return calls


def _finite(value) -> bool:
    return not math.isnan(value)


def test_the_step_result_names_what_the_step_played_and_trained_on(team):
    trainer = team()
    assert trainer.last_step is None
    metrics = trainer.step()
    result = trainer.last_step
    assert isinstance(result, StepResult) and result.episodes is result.batch.episodes
    episodes, agents = result.episodes, trainer.agents
    assert len(episodes) == PROMPTS * G
    tasks = [e.job.task.id for e in episodes]
    assert tasks == [tasks[0]] * G + [tasks[G]] * G  # G episodes per task, task by task
    assert len(result.rewards) == len(episodes) and all(set(row) == set(agents) for row in result.rewards)
    assert set(result.advantages) == set(agents) and all(len(v) == len(episodes) for v in result.advantages.values())
    assert len(result.credits) == len(episodes)  # cooperative: one credit estimate per episode
    assert set(result.batch.generations) == {"shared"}
    assert metrics["train/step"] == 1 and "policy/shared/loss" in metrics
    for agent in agents:
        assert f"train/agent/{agent}/reward" in metrics and f"credit/{agent}/value" in metrics
        for start in range(0, len(episodes), G):  # group-normalised: each agent's advantages centre on 0 per task
            assert sum(result.advantages[agent][start:start + G]) == pytest.approx(0.0, abs=1e-9)


def test_a_masked_reward_stays_nan_with_advantage_zero(team):
    trainer = team()
    marked = []

    def mask_one(episode, agent, reward):  # the first episode the transform sees loses right's reward
        marked[:] = marked or [episode]
        return math.nan if episode is marked[0] and agent == "right" else _by_seed(episode, agent, reward)

    trainer.step(StepPlan(reward_transform=mask_one))
    result = trainer.last_step
    index = next(i for i, e in enumerate(result.episodes) if e is marked[0])
    assert math.isnan(result.rewards[index]["right"])
    assert result.advantages["right"][index] == 0.0
    assert all(_finite(result.rewards[index][agent]) for agent in ("left", "final"))
    assert all(_finite(a) for values in result.advantages.values() for a in values)
    assert result.advantages["left"][index] != 0.0  # the other agents of the episode still learn from it


def test_a_shared_model_trains_on_every_agents_samples(team):
    trainer = team()
    assert set(trainer.learners) == {"shared"}  # three agents, one model, one learner
    updates = _spy_updates(trainer)
    before = {name: p.detach().clone() for name, p in trainer.actors["shared"].model.named_parameters()}
    metrics = trainer.step(StepPlan(reward_transform=_by_seed))
    result = trainer.last_step
    (completions, advantages), = updates  # one update per step for the one trainable policy
    turns = [(e, turn) for e, episode in enumerate(result.episodes) for turn in episode.turns]
    assert {turn.agent for _, turn in turns} == set(trainer.agents) and all(t.actor == "shared" for _, t in turns)
    assert completions.completion_ids.size(0) == len(turns) == advantages.numel()
    expected = sorted(result.advantages[turn.agent][e] for e, turn in turns)
    assert sorted(advantages.tolist()) == pytest.approx(expected)
    assert metrics["policy/shared/trained_rows"] > 0
    after = dict(trainer.actors["shared"].model.named_parameters())
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_cooperative_credit_splits_each_team_reward_among_the_agents(team):
    trainer = team()
    for _ in range(2):
        trainer.step()
        result = trainer.last_step
        for episode, credit, row in zip(result.episodes, result.credits, result.rewards):
            assert credit is not None and set(credit.values) == set(trainer.agents)
            # Shapley is efficient: the shares sum to v(everyone) - v(nobody), and silence scores 0
            assert sum(credit.values.values()) == pytest.approx(episode.team_reward())
            assert row == pytest.approx(credit.values)  # each agent trains on its own share


def test_competitive_rewards_are_each_agents_own(team, tmp_path):
    path = tmp_path / "race.yaml"
    path.write_text(RACE)
    trainer = team(str(path), [])
    metrics = trainer.step()
    result = trainer.last_step
    assert result.credits is None and not any(key.startswith("credit/") for key in metrics)
    for episode, row in zip(result.episodes, result.rewards):
        assert row == pytest.approx(episode.rewards)
    assert {"train/agent/first/win_rate", "train/agent/second/win_rate"} <= set(metrics)


def _comparable(metrics: dict) -> dict:
    return {key: value for key, value in metrics.items() if not key.startswith("time/")}


def test_a_restored_state_continues_exactly_like_the_trainer_it_came_from(team):
    straight = team()
    history = [_comparable(straight.step(StepPlan(reward_transform=_by_seed))) for _ in range(2)]
    first = team()
    first.step(StepPlan(reward_transform=_by_seed))
    state = first.state_dict()
    resumed = team()
    resumed.load_state_dict(state)
    assert resumed.step_count == 1
    assert _comparable(resumed.step(StepPlan(reward_transform=_by_seed))) == history[1]
    for (name, a), (_, b) in zip(straight.actors["shared"].model.named_parameters(),
                                 resumed.actors["shared"].model.named_parameters()):
        assert torch.equal(a, b), f"{name} differs after the restore"


def test_a_setting_added_since_a_checkpoint_is_not_a_change_but_a_changed_one_is():
    from trainers.records.fingerprint import _differences

    saved = {"train": {"lr": 5e-5, "group_size": 8}, "name": "relay"}
    now = {"train": {"lr": 5e-5, "group_size": 8, "packing": "auto"}, "name": "relay"}  # packing: newer marl
    assert _differences(saved, now) == []
    assert _differences(saved, {**now, "train": {**now["train"], "lr": 1e-4}}) == ["train.lr: 5e-05 -> 0.0001"]
    assert _differences({**saved, "mode": "cooperative"}, now) == ["mode: 'cooperative' -> None"]  # a removed one is


def test_a_moved_base_model_is_the_same_scenario_for_a_resume_and_another_model_is_not(real_model_dirs, tmp_path):
    import shutil

    from marl.scenario.load import load_scenario
    from trainers.records.fingerprint import _differences, _identified, resume_fingerprint

    moved = shutil.copytree(real_model_dirs["qwen2"], tmp_path / "elsewhere" / "qwen2")
    before = resume_fingerprint(load_scenario("relay", [f"train.model={real_model_dirs['qwen2']}"]).spec)
    assert before["train"]["model"].startswith("sha256:")
    assert _differences(before, resume_fingerprint(load_scenario("relay", [f"train.model={moved}"]).spec)) == []
    other = resume_fingerprint(load_scenario("relay", [f"train.model={real_model_dirs['llama']}"]).spec)
    assert [line.split(":")[0] for line in _differences(before, other)] == ["train.model"]
    # a checkpoint written before models were recorded by content holds the path: still the same model
    by_path = {**before, "train": {**before["train"], "model": str(real_model_dirs["qwen2"])}}
    assert _differences(_identified(by_path), resume_fingerprint(load_scenario("relay", [f"train.model={moved}"]).spec)) == []
