"""marl: the torch-free core. Core nouns on top, two rooms below.

Top: `types.py` (Task and the plain data every layer shares), `options.py` (every option list of
the settings, defined once), `env.py` (a scenario as a PettingZoo environment), `tools.py`,
`rewards.py` (episode rewards from a reward spec), `blend.py` (rule and judge scores into one
reward), `rollout.py` (the one lockstep episode engine: absent modes, replays with common random
numbers), `selfplay.py` (the opponent pool), `policies.py` (scripted policies for tests and
baselines), `addition.py` (the demo task), `testing.py` (the conformance check we ship). Rooms:

    scenario/  a YAML file -> a checked Scenario (schema, positions, checks, the turn graph)
    credit/    credit assignment: estimators, exact and sampled, coalition values, replay credit

May import: judges, never trainers; nothing here imports torch, transformers, wandb or openai.
`marl.make_env`, `marl.make_aec_env` and `marl.load_scenario` are imported lazily so that
`import marl` stays light.
"""

_LAZY = {
    "make_env": "marl.env",
    "make_aec_env": "marl.env",
    "load_scenario": "marl.scenario.load",
    "ScenarioError": "marl.scenario.load",
    "Task": "marl.types",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'marl' has no attribute {name!r}")


__all__ = list(_LAZY)
