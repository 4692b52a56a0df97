"""Scenario files: YAML in, a checked `Scenario` out, every problem as FILE:LINE:COL.

    load.py            load_scenario, ScenarioError, overrides (`--set key=value`)
    spec.py            the schema: strict, typed, documented models of a scenario file
    checks.py          what `marl validate` refuses that `marl run` would fail on; bounded task generation
    yaml_positions.py  YAML loading that remembers where every key and value stands
    graph.py           the turn and visibility graph (networkx)

May import: marl's core nouns (types, tools), judges. Torch-free.
"""
