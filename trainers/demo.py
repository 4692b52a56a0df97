"""`marl demo`: the single-policy case of `marl run`, end to end: one agent learns two-number addition.

The demo is the built-in scenario `addition` (scenarios/addition.yaml: one agent, the tiny addition
model, an exact-match reward) run by the same job and the same training step as every scenario
(trainers/run.py, trainers/team/trainer.py): held-out team success at temperature 0 before and after,
metrics.jsonl, checkpoints, report.md and (with the default tracker) an offline W&B run. Its flags are
shorthands for `--set train.KEY=VALUE` (`--steps`, `--threads`, `--seed`, `--model`).

The tiny addition model it trains (relay's agents play it too) is built by
trainers/policy/addition_model.py.
"""

from __future__ import annotations

from trainers.run import RunOptions, run_scenario

SCENARIO = "addition"
FLAGS = {"steps": "train.steps", "threads": "train.threads", "seed": "train.seed", "model": "train.model"}


def demo_options(overrides: list[str] = (), *, out: str = "runs/demo", resume: bool = False,
                 tracker: str | None = None, cache_dir: str | None = None, **flags):
    """The `marl run` options of the demo: the addition scenario, each flag of FLAGS (steps, threads, seed,
    model) as its --set, then the `overrides` (so an explicit --set wins)."""
    sets = [f"{FLAGS[name]}={value}" for name, value in flags.items() if value is not None]
    return RunOptions(scenario=SCENARIO, overrides=sets + list(overrides), out=out, resume=resume, tracker=tracker,
                      cache_dir=cache_dir)


def run_demo(options, log=print) -> dict:
    """Run the demo (a `demo_options` RunOptions) as `marl run` runs a scenario; its summary."""
    return run_scenario(options, log)
