"""Benchmark per-role policies against one shared policy on relay, with the role-swap test.

Run from a checkout: `python bench/roles.py` (2 seeds x 100 steps per condition, about 15 minutes on
a 2-core CPU once the tiny model is cached), or `--quick` (1 seed x 1 step, 12 held-out tasks, for
tests/integration/test_benchmarks.py).

Conditions, differing only in who plays each agent (everything else is relay's own settings: 8
prompts x 8 candidates per step, lr 5e-5, Shapley credit against the expert):

    shared     one model plays left, right and final (the scenario's default)
    own        each agent its own copy of the same start model (`policy: own`), trained on its
               own turns only
    own_lora   each agent its own LoRA adapter (`train.lora.r`, default 16) on the one frozen start
               model, at `--lora-lr` (adapters move less per step than full weights)

`--conditions` picks them (default shared,own; `--conditions shared,own,own_lora` adds the adapters).

Relay's roles differ in what they add: `left` and `right` add two numbers in [10, 49] (sums up to
98), `final` adds two of those sums (up to 196, a carry into the hundreds). Each condition is
evaluated greedy on the held-out tasks (`trainers.team.evaluation.evaluate_team`) as trained, and,
for the per-role conditions, with two roles' policies swapped (`trainers.checkpoint_eval.reseat`, what
`marl eval --seat left=final --seat final=left` does): each seat keeps its own observation but is
played by the other role's policy. If the policies specialised, a swap costs team success; under
the shared policy a swap changes nothing by construction (the same model plays every seat), so the
shared row is the control.

The last line, `ratio: ...`, is the per-role condition's final held-out team success (own, else
own_lora) over shared's (the anchor, trained in this run), each floored at one task of the evaluation
set.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ("left", "right", "final")
CONDITIONS = ("shared", "own", "own_lora")
SWAPS = {  # name -> played_by (agent -> the agent whose policy plays its seat)
    "left<->final": {"left": "final", "final": "left"},
    "right<->final": {"right": "final", "final": "right"},
    "left<->right": {"left": "right", "right": "left"},
}


def condition_settings(condition: str, seed: int, args) -> list[str]:
    """--set overrides of one condition (see the module doc)."""
    settings = [f"train.seed={seed}", "train.threads=1", f"train.eval_tasks={args.eval_tasks}"]
    if condition == "shared":
        return settings
    settings += [f"agents.{index}.policy=own" for index in range(len(AGENTS))]
    if condition == "own_lora":
        settings += [f"train.lora.r={args.lora_r}", f"train.lr={args.lora_lr}"]
    return settings


def train_condition(condition: str, seed: int, args) -> dict:
    """Train one condition; its held-out success at the start, at the end, and at the end under each swap."""
    from marl.rollout import EpisodePlayer
    from trainers.checkpoint_eval import reseat
    from trainers.run import RunOptions, prepare
    from trainers.team.evaluation import evaluate_team

    scenario, _, eval_tasks, trainer, _ = prepare(RunOptions("relay", condition_settings(condition, seed, args)),
                                               log=lambda message: None)
    eval_tasks = eval_tasks[:args.eval_tasks]
    start = evaluate_team(trainer.player, eval_tasks)["team_success"]
    started = time.perf_counter()
    for _ in range(args.steps):
        trainer.step()
    seconds = time.perf_counter() - started
    final = evaluate_team(trainer.player, eval_tasks)
    swapped = {}
    if condition != "shared":
        for name, played_by in SWAPS.items():
            player = EpisodePlayer(scenario, trainer.actors, reseat(trainer.seats, played_by))
            swapped[name] = evaluate_team(player, eval_tasks)["team_success"]
    return {"start": start, "final": final["team_success"], "swapped": swapped, "seconds": seconds,
            "agents": {agent: final.get(f"agent/{agent}/reward") for agent in AGENTS}, "tasks": len(eval_tasks)}


def print_table(results: dict, conditions: list[str], seeds: list[int], steps: int) -> dict:
    """Per condition and seed: start, final, final under each swap; the means; returns mean finals."""
    header = f"{'condition':<9} {'seed':>4} {'start':>6} {'final':>6} " + " ".join(f"{name:>14}" for name in SWAPS)
    print(f"\nheld-out team success (greedy), after {steps} steps; swaps: each seat played by the other role's policy")
    print(header + f" {'s/step':>7}")
    finals = {}
    for condition in conditions:
        runs = [results[condition, seed] for seed in seeds]
        for seed, run in zip(seeds, runs):
            swaps = " ".join(f"{run['swapped'].get(name, float('nan')):>14.3f}" for name in SWAPS)
            print(f"{condition:<9} {seed:>4} {run['start']:>6.3f} {run['final']:>6.3f} {swaps} "
                  f"{run['seconds'] / max(1, steps):>7.2f}")
        mean = {key: statistics.fmean(run[key] for run in runs) for key in ("start", "final")}
        swaps = " ".join(f"{statistics.fmean(run['swapped'].get(name, float('nan')) for run in runs):>14.3f}"
                         for name in SWAPS)
        print(f"{condition:<9} {'mean':>4} {mean['start']:>6.3f} {mean['final']:>6.3f} {swaps}")
        if condition != "shared":
            drops = {name: mean["final"] - statistics.fmean(run["swapped"][name] for run in runs) for name in SWAPS}
            print(f"  {condition}: team success lost by swapping roles: "
                  + ", ".join(f"{name} {drop:+.3f}" for name, drop in drops.items()))
        finals[condition] = mean["final"]
    return finals


def parse_args(argv=None):
    """Command-line options (see --help)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2, help="seeds per condition (0..N-1; default 2)")
    parser.add_argument("--steps", type=int, default=100, help="training steps per run (default 100)")
    parser.add_argument("--eval-tasks", type=int, default=100, help="held-out tasks evaluated (default 100)")
    parser.add_argument("--conditions", default="shared,own",
                        help=f"conditions, comma-separated, from {','.join(CONDITIONS)} (default shared,own)")
    parser.add_argument("--lora-r", type=int, default=16, help="adapter rank of own_lora (default 16)")
    parser.add_argument("--lora-lr", type=float, default=2e-4, help="lr of own_lora (default 2e-4)")
    parser.add_argument("--quick", action="store_true", help="1 seed x 1 step, 12 held-out tasks")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.eval_tasks = 1, 1, 12
    if args.seeds < 1 or args.steps < 0 or args.eval_tasks < 1:
        parser.error("--seeds and --eval-tasks must be at least 1, --steps at least 0")
    args.conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    if "shared" not in args.conditions or len(args.conditions) < 2 or \
            any(c not in CONDITIONS for c in args.conditions):
        parser.error(f"--conditions: shared (the anchor) and at least one of own, own_lora; from "
                     f"{', '.join(CONDITIONS)}")
    return args


def main(argv=None) -> int:
    """Train every condition on every seed; print the table, the swap drops and the ratio."""
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bench.support.runtime import one_quiet_thread

    one_quiet_thread()
    conditions = args.conditions
    seeds = list(range(args.seeds))
    print(f"relay: {', '.join(conditions)}; {args.seeds} seeds x {args.steps} steps; {args.eval_tasks} held-out "
          "tasks at temperature 0" + (f"; own_lora r={args.lora_r}, lr={args.lora_lr:g}" if "own_lora" in conditions else ""))
    results = {}
    for seed in seeds:
        for condition in conditions:
            run = train_condition(condition, seed, args)
            results[condition, seed] = run
            print(f"  {condition:<9} seed {seed}: {run['start']:.3f} -> {run['final']:.3f} "
                  f"({run['seconds']:.0f} s training)", flush=True)
    finals = print_table(results, conditions, seeds, args.steps)
    floor = 1 / results["shared", 0]["tasks"]
    per_role = "own" if "own" in finals else "own_lora"
    ratio = max(finals[per_role], floor) / max(finals["shared"], floor)
    print(f"ratio: {ratio:.2f} ({per_role}'s final held-out team success / shared's, each floored at {floor:.3f}; "
          "anchor: one shared policy, trained in this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
