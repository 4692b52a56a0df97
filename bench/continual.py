"""Benchmark continual RL on two task families in sequence: incremental RL with replay and KL, plain
incremental RL, and retraining from scratch on both.

Run from a checkout: `python bench/continual.py` (3 seeds; about 20 minutes on a 2-core CPU once the tiny
model is cached), or `--quick` (1 seed, 1 step per stage, 8 held-out tasks, for
tests/integration/test_benchmarks.py).

The families (bench/support/continual_tasks.py) are relay's tasks (`old`: (a+b)+(c+d), every number in
[10, 49]) and `relay_high` (`new`: each pair sums to 60-99, one number of it in [50, 89], so final always
carries into the hundreds). Per seed, every condition a `marl run` of its own (tracker none):

    first      relay from the tiny model, --steps-old steps: the earlier run the incremental ones start from
    replay_kl  relay_high --init-from first, --steps-new steps, train.continual.replay and .kl as given
    plain      relay_high --init-from first, --steps-new steps, no replay, no KL
    scratch    relay_both (both families' training tasks) from the tiny model, --steps-old + --steps-new
               steps: periodic full retraining, with the same total number of steps as first + incremental

Each final policy is measured greedy on both held-out sets (100 tasks each by default): `old` (relay's)
and `new` (relay_high's). Retention is old after / old after `first`; forgetting is old before - old after.
Compute is training seconds and episodes played (replayed ones included); an incremental condition's
total adds `first`'s.

The last line, `ratio: ...`, is replay_kl's mean held-out team success over both families divided by
scratch's (the anchor, trained in this run), each floored at one task of the evaluation set.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SUPPORT = ROOT / "bench" / "support"
OLD, NEW, BOTH = "relay", str(SUPPORT / "relay_high.yaml"), str(SUPPORT / "relay_both.yaml")
CONDITIONS = ("first", "replay_kl", "plain", "scratch")


def common(seed: int, args) -> list[str]:
    """--set values every run of a seed shares."""
    settings = [f"train.seed={seed}", "train.threads=1", f"train.eval_tasks={args.eval_tasks}"]
    if args.quick:
        settings += ["train.prompts_per_step=2", "train.group_size=4", "train.warmup.rl_steps=0"]
    return settings


def run(scenario: str, settings: list[str], out: Path, init_from: Path | None = None) -> dict:
    """One `marl run` (quiet); its summary."""
    from trainers.run import RunOptions, run_scenario

    return run_scenario(RunOptions(scenario, settings, out=str(out), tracker="none",
                                   init_from=str(init_from) if init_from else None), log=lambda message: None)


def held_out(scenario_name: str, settings: list[str], checkpoint: Path, eval_tasks: int) -> float:
    """Greedy team success of a checkpoint's team on a scenario's held-out set (as `marl run` measures it)."""
    from marl.rollout import EpisodePlayer
    from marl.scenario.load import load_scenario
    from trainers.checkpoint_eval import load_actors
    from trainers.team.evaluation import evaluate_team

    scenario = load_scenario(scenario_name, settings)
    actors, seats = load_actors(scenario, checkpoint, None, log=lambda message: None)
    return evaluate_team(EpisodePlayer(scenario, actors, seats), scenario.split()[1][:eval_tasks])["team_success"]


def _cost(summary: dict) -> dict:
    return {"seconds": summary["train_seconds"], "episodes": summary["totals"]["episodes"], "steps": summary["steps"]}


def one_seed(seed: int, args, root: Path) -> dict:
    """Every condition on one seed: {condition: {old, new, seconds, episodes, steps}}."""
    from trainers.records.checkpoint import latest_checkpoint

    base = common(seed, args)
    first = run(OLD, base + [f"train.steps={args.steps_old}"], root / "first")
    results = {}
    for name, replay, kl in (("replay_kl", args.replay, args.kl), ("plain", 0.0, 0.0)):
        settings = base + [f"train.steps={args.steps_new}", f"train.continual.replay={replay}",
                           f"train.continual.kl={kl}"]
        summary = run(NEW, settings, root / name, init_from=root / "first")
        figures = summary["continual"]
        results[name] = {"old": figures["old"]["after"], "new": figures["new"]["after"], **_cost(summary)}
        results.setdefault("first", {"old": first["after"]["team_success"], "new": figures["new"]["before"],
                                     "old_start": first["before"]["team_success"], **_cost(first)})
    scratch = run(BOTH, base + [f"train.steps={args.steps_old + args.steps_new}"], root / "scratch")
    checkpoint = latest_checkpoint(root / "scratch")
    results["scratch"] = {"old": held_out(OLD, base, checkpoint, args.eval_tasks),
                          "new": held_out(NEW, base, checkpoint, args.eval_tasks), **_cost(scratch)}
    return results


def mean(results: dict, seeds: list[int], condition: str, key: str) -> float:
    """The mean of one figure over the seeds."""
    return statistics.fmean(results[seed][condition][key] for seed in seeds)


def print_table(results: dict, seeds: list[int], args) -> None:
    """Per condition and seed: old and new held-out success, retention, forgetting, compute; then the means."""
    print(f"\nheld-out team success (greedy, {args.eval_tasks} tasks per family); old = relay, new = relay_high; "
          "retention = old / first's old; seconds and episodes: this condition's training "
          "(total = with first's, for the incremental ones)")
    print(f"{'condition':<10} {'seed':>4} {'old':>6} {'new':>6} {'mean':>6} {'retain':>7} {'forget':>7} "
          f"{'seconds':>8} {'total s':>8} {'episodes':>9}")
    for condition in CONDITIONS:
        for seed in seeds + ["mean"]:
            rows = seeds if seed == "mean" else [seed]
            figure = {key: mean(results, rows, condition, key) for key in ("old", "new", "seconds", "episodes")}
            first_old = mean(results, rows, "first", "old")
            incremental = condition in ("replay_kl", "plain")
            total = figure["seconds"] + (mean(results, rows, "first", "seconds") if incremental else 0.0)
            forget = first_old - figure["old"] if incremental else float("nan")
            print(f"{condition:<10} {seed:>4} {figure['old']:>6.3f} {figure['new']:>6.3f} "
                  f"{(figure['old'] + figure['new']) / 2:>6.3f} {figure['old'] / max(first_old, 1e-9):>7.3f} "
                  f"{forget:>+7.3f} {figure['seconds']:>8.1f} {total:>8.1f} {figure['episodes']:>9.0f}")


def parse_args(argv=None):
    """Command-line options (see --help)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds (0..N-1; default 3)")
    parser.add_argument("--steps-old", type=int, default=100, help="steps of the first run on relay (default 100)")
    parser.add_argument("--steps-new", type=int, default=60, help="steps of each incremental run (default 60)")
    parser.add_argument("--replay", type=float, default=0.25, help="replay_kl's train.continual.replay (0.25)")
    parser.add_argument("--kl", type=float, default=0.1, help="replay_kl's train.continual.kl (0.1)")
    parser.add_argument("--eval-tasks", type=int, default=100, help="held-out tasks per family (default 100)")
    parser.add_argument("--quick", action="store_true", help="1 seed, 1 step per stage, 8 held-out tasks")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps_old, args.steps_new, args.eval_tasks = 1, 1, 1, 8
    if args.seeds < 1 or args.steps_old < 1 or args.steps_new < 1 or not 1 <= args.eval_tasks <= 100:
        parser.error("--seeds and the steps must be at least 1, --eval-tasks in [1, 100]")
    return args


def main(argv=None) -> int:
    """Every condition on every seed; the table, the gain over retraining from scratch, and the ratio."""
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bench.support.runtime import one_quiet_thread

    one_quiet_thread()
    seeds = list(range(args.seeds))
    print(f"continual RL, relay then relay_high: {args.seeds} seeds; first {args.steps_old} steps, incremental "
          f"{args.steps_new} steps (replay_kl: replay {args.replay:g}, KL {args.kl:g}), scratch "
          f"{args.steps_old + args.steps_new} steps on both; {args.eval_tasks} held-out tasks per family, temperature 0")
    results = {}
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="marl-continual-") as root:
            results[seed] = one_seed(seed, args, Path(root))
        line = ", ".join(f"{c} {results[seed][c]['old']:.3f}/{results[seed][c]['new']:.3f}" for c in CONDITIONS)
        print(f"  seed {seed} (old/new): {line}", flush=True)
    print_table(results, seeds, args)
    floor = 1 / args.eval_tasks
    both = {c: max((mean(results, seeds, c, "old") + mean(results, seeds, c, "new")) / 2, floor) for c in CONDITIONS}
    for condition in ("replay_kl", "plain"):
        print(f"{condition} vs scratch: mean success {both[condition] / both['scratch'] - 1:+.1%}, training seconds "
              f"{mean(results, seeds, condition, 'seconds') / mean(results, seeds, 'scratch', 'seconds'):.2f}x "
              "(incremental stage only)")
    print(f"ratio: {both['replay_kl'] / both['scratch']:.2f} (replay_kl's mean held-out team success over both "
          f"families / scratch's, each floored at {floor:.3f}; anchor: retraining from scratch on both, trained in "
          "this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
