"""A training signal that does not depend on what a model samples.

What a model samples from a seed differs across CPUs (AVX2, AVX-512, AMX give slightly different logits),
so a group of plays can score alike on one machine and differently on another; a test that needs an
update to happen (weights that move, a KL that grows, a non-zero loss) must not rely on the samples'
rewards having a spread. `by_seed` adds 10 to the reward of every odd-seeded episode: the members of a
group have consecutive seeds (trainers/team/trainer.py, `_play`), and rewards and credits lie in [-1, 1],
so every group of two or more plays has a spread, whatever was sampled.
"""

from __future__ import annotations

import math

OFFSET = 10.0


def by_seed(episode, agent, reward):
    """A reward transform (a StepPlan's reward_transform): the reward, plus 10 on odd seeds."""
    if isinstance(reward, float) and math.isnan(reward):
        return reward  # a masked reward stays masked
    return reward + OFFSET * (episode.job.seed % 2)


def with_signal(monkeypatch) -> None:
    """Make every MultiAgentTrainer.step of the test (a `marl run` called in-process included) apply
    `by_seed` after whatever reward transform the step was given."""
    from dataclasses import replace

    from trainers.team.trainer import MultiAgentTrainer, StepPlan

    step = MultiAgentTrainer.step

    def signalled(self, plan=None):
        plan = plan or StepPlan()
        given = plan.reward_transform

        def transform(episode, agent, reward):
            if given is not None:
                reward = given(episode, agent, reward)
            return by_seed(episode, agent, reward)

        return step(self, replace(plan, reward_transform=transform))

    monkeypatch.setattr(MultiAgentTrainer, "step", signalled)
