"""The Ray backend against the local one, on a real local Ray cluster (127.0.0.1, two workers).

With the same seed and max_staleness 0, a run played by Ray rollout workers gives the same per-step
rewards, losses and final weights as the one played in this process (sampling is keyed by episode,
turn, agent and position, never by call order). A worker killed by its PID is replaced and its
episodes are played again with the same keys: the step's result does not change.
"""

from __future__ import annotations

import math
import os
import signal

import pytest
import torch

pytest.importorskip("ray")

from marl.scenario.load import load_scenario  # noqa: E402
from trainers.grpo.config import GRPOConfig  # noqa: E402
from trainers.policy.actors import ModelActor  # noqa: E402
from trainers.team.trainer import MultiAgentTrainer  # noqa: E402

pytestmark = pytest.mark.ray
RELAY = ["tasks.count=40", "tasks.eval_count=4", "credit.method=shapley"]
STEPS = 3


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module (2 CPUs, loopback only, a small object store)."""
    from trainers.ray.cluster import connect, shutdown
    from marl.scenario.spec import RaySpec

    connect(RaySpec(object_store_mb=128, rollout_workers=2), log=lambda message: None)
    yield
    shutdown()


def _trainer(micro_policy, backend: str, scenario="relay", overrides=RELAY, staleness=0):
    settings = [*overrides, f"train.backend={backend}", "train.ray.rollout_workers=2",
                f"train.ray.max_staleness={staleness}", "train.ray.num_cpus=0.5"]
    spec = load_scenario(scenario, settings)
    model, tokenizer = micro_policy()
    actors = {"shared": ModelActor("shared", model, tokenizer, seed=0)}
    seats = {agent: "shared" for agent in spec.agent_names}
    config = GRPOConfig(steps=STEPS, prompts_per_step=2, group_size=3, max_new_tokens=4, lr=1e-2, seed=0,
                        floor_reward=0.0, diversity_penalty=0.0)
    return MultiAgentTrainer(spec, actors, seats, spec.split()[0], config, log=lambda message: None)


def _run(trainer, steps=STEPS):
    losses, rewards = [], []
    for _ in range(steps):
        metrics = trainer.step()
        losses.append(metrics["policy/shared/loss"])
        rewards.append([[row[a] for a in sorted(row)] for row in trainer.last_step.rewards])
    texts = [[t.text for t in e.turns] for e in trainer.last_step.episodes]
    return losses, rewards, texts


def test_ray_steps_equal_local_steps_and_weights(cluster, micro_policy):
    local = _trainer(micro_policy, "local")
    remote = _trainer(micro_policy, "ray")
    try:
        local_losses, local_rewards, local_texts = _run(local)
        ray_losses, ray_rewards, ray_texts = _run(remote)
    finally:
        remote.player.close()
    assert ray_texts == local_texts
    assert ray_rewards == local_rewards
    assert ray_losses == pytest.approx(local_losses, rel=1e-5, abs=1e-7)
    assert any(loss != 0 for loss in local_losses)  # something was trained on
    for (name, a), (_, b) in zip(local.actors["shared"].model.named_parameters(),
                                 remote.actors["shared"].model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
    assert remote.player.version == STEPS - 1  # one version per update that was played with
