"""Conformance checks for scenario environments, shipped with the library (as PettingZoo does).

`scenario_conformance(scenario)` runs PettingZoo's own `parallel_api_test`, `api_test` on the AEC
view and `parallel_seed_test`, then our check that PettingZoo's tests skip: every observation the
environment emits, in both APIs, lies inside its observation space.
"""

from __future__ import annotations

import warnings

from marl.env import env_fn, make_aec_env, make_env


def observations_in_space(env, episodes: int = 3, seed: int = 0) -> int:
    """Play random-action episodes through the parallel API; assert every observation is in its space.

    Returns the number of observations checked.
    """
    checked = 0
    for episode in range(episodes):
        observations, _ = env.reset(seed=seed + episode)
        for agent in env.possible_agents:
            env.action_space(agent).seed(seed + episode)
        while True:
            for agent, observation in observations.items():
                assert env.observation_space(agent).contains(observation), \
                    f"observation of {agent} outside its space: {observation!r}"
                checked += 1
            if not env.agents:
                break
            actions = {agent: env.action_space(agent).sample() for agent in env.agents}
            observations, *_ = env.step(actions)
    return checked


def aec_observations_in_space(aec_env, seed: int = 0) -> int:
    """The same check through the AEC API (observe() of each agent as it acts)."""
    aec_env.reset(seed=seed)
    checked = 0
    for agent in aec_env.agent_iter():
        observation, _, terminated, truncated, _ = aec_env.last()
        assert aec_env.observation_space(agent).contains(observation), \
            f"AEC observation of {agent} outside its space: {observation!r}"
        checked += 1
        action = None if terminated or truncated else aec_env.action_space(agent).sample()
        aec_env.step(action)
    return checked


def scenario_conformance(scenario, num_cycles: int = 10) -> dict[str, int]:
    """Every check above on one scenario (a name, path, dict or Scenario); raises on any failure."""
    from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PettingZoo warns that text observations are not NumPy arrays
        parallel_api_test(make_env(scenario), num_cycles=num_cycles)
        api_test(make_aec_env(scenario), num_cycles=num_cycles)
        parallel_seed_test(env_fn(scenario))
    return {"parallel": observations_in_space(make_env(scenario)),
            "aec": aec_observations_in_space(make_aec_env(scenario))}
