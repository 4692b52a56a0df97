"""marl: the torch-free core. Core nouns on top, two rooms below.

Top: `types.py` (Task and the plain data every layer shares), `options.py` (every option list of
the settings, defined once), `env.py` (a scenario as a PettingZoo environment), `tools.py`
(with `tool_host.py` and `tool_process.py`: calls run in processes a timeout and a memory limit stop),
`rewards.py` (episode rewards from a reward spec), `blend.py` (rule and judge scores into one
reward), `rollout.py` (the one lockstep episode engine: absent modes, replays with common random
numbers), `selfplay.py` (the opponent pool), `policies.py` (scripted policies for tests and
baselines), `addition.py` (the demo task), `testing.py` (the conformance check we ship). Rooms:

    scenario/  a YAML file -> a checked Scenario (schema, positions, checks, the turn graph)
    credit/    credit assignment: estimators, exact and sampled, coalition values, replay credit

Public names (imported on first use, so `import marl` stays light): `make_env`, `make_aec_env`,
`ScenarioEnv`, `load_scenario`, `Scenario`, `ScenarioError`, `Task`, `scenario_conformance`.

May import: common, judges, never trainers; nothing here imports torch, transformers, wandb or openai.
"""

from common.lazy import lazy_names  # the one eager import: a few lines, no library

_PUBLIC = {  # public name -> "module:attribute", imported on first use (PEP 562)
    "make_env": "marl.env:make_env",
    "make_aec_env": "marl.env:make_aec_env",
    "ScenarioEnv": "marl.env:ScenarioEnv",
    "load_scenario": "marl.scenario.load:load_scenario",
    "Scenario": "marl.scenario.load:Scenario",
    "ScenarioError": "marl.scenario.problems:ScenarioError",
    "Task": "marl.types:Task",
    "scenario_conformance": "marl.testing:scenario_conformance",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC, globals())
