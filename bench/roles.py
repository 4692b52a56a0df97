"""Benchmark per-role policies against one shared policy, with the role-swap test for every pair of roles.

Run from a checkout: `python bench/roles.py` (specialists: 3 seeds x 200 steps of shared, own_lora and
own, about 20 minutes on a 2-core CPU shared with other runs, one thread each, once the scenario's
tiny model is built and cached, about 3 minutes more the first time), `python bench/roles.py
--scenario relay` (relay's earlier question: 2 seeds x 100 steps of shared and own), or `--quick` (1
seed x 1 step, 12 held-out tasks, a tiny model of 4 SFT steps, for tests/integration/test_benchmarks.py).

Figures: docs/benchmarks.md, "Roles that specialise" (specialists) and docs/training.md (relay).

Conditions, differing only in who plays each agent; everything else is the scenario's own settings
(prompts_per_step x group_size episodes per step, its lr and credit), the same number of steps and
of episodes for every condition, one torch thread each:

    shared     one model plays every agent, its role in its prompt (the scenario's default)
    own        each agent its own copy of the same start model (`policy: own`), trained on its
               own turns only
    own_lora   each agent its own LoRA adapter (`train.lora.r`, default 16) on the one frozen start
               model, at `--lora-lr` (adapters move less per step than full weights)

Scenarios (`--scenario`):

    specialists   (default) the roles really differ: on the same surface ("37 25") the adder adds,
                  the subtractor and final subtract, and only the role in the prompt says which
    relay         every role adds two numbers: near-identical roles, where sharing won before

Each condition is evaluated greedy on the held-out tasks (`trainers.team.evaluation.evaluate_team`)
as trained, and, for the per-role conditions, with each pair of roles' policies swapped
(`trainers.checkpoint_eval.reseat`, what `marl eval --seat a=b --seat b=a` does): each seat keeps its
own observation and role prompt but is played by the other role's policy. If the policies
specialised, a swap costs team success; under the shared policy a swap changes nothing by
construction (the same model plays every seat), so the shared row is the control.

The last line, `ratio: ...`, is the per-role condition's final held-out team success (own_lora, else
own) over shared's (the anchor, trained in this run), each floored at one task of the evaluation set.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import itertools  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONDITIONS = ("shared", "own", "own_lora")
# scenario -> its defaults: seeds, steps, conditions (each keeps the figures of its earlier runs comparable)
DEFAULTS = {
    "specialists": {"seeds": 3, "steps": 200, "conditions": "shared,own_lora,own"},
    "relay": {"seeds": 2, "steps": 100, "conditions": "shared,own"},
}
# --quick: a tiny model of 4 SFT steps for a scenario built from scratch (relay's is the test session's
# cached demo model), so that the check of the bench's wiring spends seconds, not a build's minutes
QUICK_BUILD = {"specialists": ["train.warmup.sft_max_steps=4", "train.warmup.sft_batch_size=8"]}


def swaps_of(agents: list[str]) -> dict[str, dict[str, str]]:
    """Every pair of roles: name -> played_by (agent -> the agent whose policy plays its seat)."""
    return {f"{a}<->{b}": {a: b, b: a} for a, b in itertools.combinations(agents, 2)}


def condition_settings(condition: str, seed: int, args) -> list[str]:
    """--set overrides of one condition (see the module doc): --set's own after the condition's policies,
    own_lora's rank and lr last (`--set train.lr=X` sets the full-weight conditions' lr, `--lora-lr` the adapters')."""
    settings = [f"train.seed={seed}", "train.threads=1", f"train.eval_tasks={args.eval_tasks}"]
    settings += QUICK_BUILD.get(args.scenario, []) if args.quick else []
    if condition != "shared":
        settings += [f"agents.{index}.policy=own" for index in range(len(args.agents))]
    settings += list(args.set)
    if condition == "own_lora":
        settings += [f"train.lora.r={args.lora_r}", f"train.lr={args.lora_lr}"]
    return settings


def train_condition(condition: str, seed: int, args) -> dict:
    """Train one condition; its held-out success at the start, at the end, and at the end under each swap."""
    from marl.rollout import EpisodePlayer
    from trainers.checkpoint_eval import reseat
    from trainers.run import RunOptions, prepare
    from trainers.team.evaluation import evaluate_team

    scenario, _, eval_tasks, trainer, _ = prepare(RunOptions(args.scenario, condition_settings(condition, seed, args)),
                                               log=lambda message: None)
    eval_tasks = eval_tasks[:args.eval_tasks]
    start = evaluate_team(trainer.player, eval_tasks)["team_success"]
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        trainer.step()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    final = evaluate_team(trainer.player, eval_tasks)
    swapped = {}
    if condition != "shared":
        for name, played_by in swaps_of(args.agents).items():
            player = EpisodePlayer(scenario, trainer.actors, reseat(trainer.seats, played_by))
            swapped[name] = evaluate_team(player, eval_tasks)["team_success"]
    train = scenario.spec.train
    return {"start": start, "final": final["team_success"], "swapped": swapped, "seconds": seconds, "cpu": cpu,
            "agents": {agent: final.get(f"agent/{agent}/reward") for agent in args.agents}, "tasks": len(eval_tasks),
            "episodes": args.steps * train.prompts_per_step * train.group_size, "lr": train.lr}


def _mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else float("nan")


def _cell(value: float | None, width: int) -> str:
    """A swap's figure; '=' for the shared policy, which plays every seat, so a swap changes nothing."""
    return f"{'=':>{width}}" if value is None else f"{value:>{width}.3f}"


def print_table(results: dict, args) -> dict:
    """Per condition and seed: start, final, final under each swap; the means and swap costs; returns mean finals."""
    swaps, seeds = list(swaps_of(args.agents)), list(range(args.seeds))
    width = max(12, *(len(name) for name in swaps))
    print(f"\nheld-out team success (greedy, {args.eval_tasks} tasks), after {args.steps} steps; swaps: each seat of "
          "the pair played by the other role's policy")
    print(f"{'condition':<9} {'seed':>4} {'start':>6} {'final':>6} " + " ".join(f"{name:>{width}}" for name in swaps)
          + f" {'s/step':>7} {'cpu s':>7}")
    finals = {}
    for condition in args.conditions:
        runs = [results[condition, seed] for seed in seeds]
        for seed, run in zip(seeds, runs):
            row = " ".join(_cell(run["swapped"].get(name), width) for name in swaps)
            print(f"{condition:<9} {seed:>4} {run['start']:>6.3f} {run['final']:>6.3f} {row} "
                  f"{run['seconds'] / max(1, args.steps):>7.2f} {run['cpu']:>7.0f}")
        mean = {key: _mean(run[key] for run in runs) for key in ("start", "final")}
        row = " ".join(_cell(_mean(run["swapped"][name] for run in runs) if condition != "shared" else None, width)
                       for name in swaps)
        sd = statistics.stdev(run["final"] for run in runs) if len(runs) > 1 else 0.0
        print(f"{condition:<9} {'mean':>4} {mean['start']:>6.3f} {mean['final']:>6.3f} {row}   (final sd {sd:.3f})")
        if condition != "shared":
            drops = {name: mean["final"] - _mean(run["swapped"][name] for run in runs) for name in swaps}
            print(f"  {condition}: team success lost by swapping roles: "
                  + ", ".join(f"{name} {drop:+.3f}" for name, drop in drops.items()))
        finals[condition] = mean["final"]
    return finals


def parse_args(argv=None):
    """Command-line options (see --help); a scenario's defaults fill what is not given."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="specialists", choices=sorted(DEFAULTS),
                        help="the scenario (default specialists)")
    parser.add_argument("--seeds", type=int, help="seeds per condition (0..N-1; default 3 on specialists, 2 on relay)")
    parser.add_argument("--steps", type=int, help="training steps per run (default 150 on specialists, 100 on relay)")
    parser.add_argument("--eval-tasks", type=int, default=100, help="held-out tasks evaluated (default 100)")
    parser.add_argument("--conditions", help=f"conditions, comma-separated, from {','.join(CONDITIONS)} "
                        "(default shared,own_lora on specialists, shared,own on relay)")
    parser.add_argument("--lora-r", type=int, default=16, help="adapter rank of own_lora (default 16)")
    parser.add_argument("--lora-lr", type=float, default=2e-4, help="lr of own_lora (default 2e-4)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a scenario setting for every condition (as marl run --set; repeatable)")
    parser.add_argument("--quick", action="store_true", help="1 seed x 1 step, 12 held-out tasks")
    args = parser.parse_args(argv)
    defaults = DEFAULTS[args.scenario]
    args.seeds = defaults["seeds"] if args.seeds is None else args.seeds
    args.steps = defaults["steps"] if args.steps is None else args.steps
    if args.quick:
        args.seeds, args.steps, args.eval_tasks = 1, 1, 12
    if args.seeds < 1 or args.steps < 0 or args.eval_tasks < 1:
        parser.error("--seeds and --eval-tasks must be at least 1, --steps at least 0")
    args.conditions = [c.strip() for c in (args.conditions or defaults["conditions"]).split(",") if c.strip()]
    if "shared" not in args.conditions or len(args.conditions) < 2 or \
            any(c not in CONDITIONS for c in args.conditions):
        parser.error(f"--conditions: shared (the anchor) and at least one of own, own_lora; from "
                     f"{', '.join(CONDITIONS)}")
    return args


def print_settings(args) -> None:
    """The run's settings, in one paragraph, before any model is built."""
    from marl.scenario.load import load_scenario

    train = load_scenario(args.scenario, list(args.set)).spec.train
    print(f"{args.scenario}: agents {', '.join(args.agents)}; conditions {', '.join(args.conditions)}; seeds "
          f"{list(range(args.seeds))} x {args.steps} steps, each step {train.prompts_per_step} prompts x "
          f"{train.group_size} samples (the same episodes for every condition); {args.eval_tasks} held-out tasks "
          f"at temperature 0; lr {train.lr:g}" + (f"; own_lora r={args.lora_r}, lr={args.lora_lr:g}"
                                                  if "own_lora" in args.conditions else "")
          + f"; train.threads=1{'; --set ' + ' '.join(args.set) if args.set else ''}", flush=True)


def main(argv=None) -> int:
    """Train every condition on every seed; print the table, the swap drops and the ratio."""
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bench.support.runtime import one_quiet_thread
    from marl.scenario.load import load_scenario

    one_quiet_thread()
    args.agents = [agent.name for agent in load_scenario(args.scenario).spec.agents]
    print_settings(args)
    results, wall = {}, time.perf_counter()
    for seed in range(args.seeds):
        for condition in args.conditions:
            run = train_condition(condition, seed, args)
            results[condition, seed] = run
            print(f"  {condition:<9} seed {seed}: {run['start']:.3f} -> {run['final']:.3f} "
                  f"({run['seconds']:.0f} s training, {run['episodes']} episodes)", flush=True)
    finals = print_table(results, args)
    print(f"wall time {time.perf_counter() - wall:.0f} s (builds, training and evaluations)")
    floor = 1 / results["shared", 0]["tasks"]
    for per_role in [c for c in ("own", "own_lora") if c in finals]:  # own_lora, when run, gives the last line
        ratio = max(finals[per_role], floor) / max(finals["shared"], floor)
        print(f"ratio: {ratio:.2f} ({per_role}'s final held-out team success / shared's, each floored at "
              f"{floor:.3f}; anchor: one shared policy, trained in this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
