"""Scenario files: YAML in, a checked `Scenario` out, every problem as FILE:LINE:COL.

    load.py            load_scenario: a file (or dict) and its `--set` overrides -> a checked Scenario
    overrides.py       `--set KEY=VALUE`, the one override grammar of every command (scenario and demo)
    problems.py        Problem, ScenarioError: every problem located as FILE:LINE:COL
    spec.py            the schema: strict, typed, documented models of a scenario file, with TrainKnobs
                       (every GRPO knob a scenario sets, written once; trainers.grpo.config.GRPOConfig adds
                       the two derived ones)
    sections.py        the Strict base and train's other sub-sections (stages, LoRA, continual, Ray...)
    checks.py          what `marl validate` refuses that `marl run` would fail on; bounded task generation
    yaml_positions.py  YAML loading that remembers where every key and value stands
    graph.py           the turn and visibility graph (networkx)

May import: marl's core nouns (types, tools), judges, common (imports). Torch-free.
"""
