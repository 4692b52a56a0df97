"""marl: torch-free core: scenarios (YAML -> PettingZoo environments), tasks, rewards, tools.

`marl.make_env`, `marl.make_aec_env` and `marl.load_scenario` are imported lazily so that
`import marl` stays light.
"""

_LAZY = {
    "make_env": "marl.env",
    "make_aec_env": "marl.env",
    "load_scenario": "marl.scenario",
    "ScenarioError": "marl.scenario",
    "Task": "marl.types",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'marl' has no attribute {name!r}")


__all__ = list(_LAZY)
