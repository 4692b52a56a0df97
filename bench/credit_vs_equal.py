"""Benchmark Shapley credit against the team reward copied to every agent, on relay with a free rider.

Run from a checkout: `python bench/credit_vs_equal.py` (3 seeds x 60 steps per condition, about
4 minutes on a 2-core CPU once the tiny model is cached), or `--quick` (seconds, for
tests/integration/test_benchmarks.py: 1 seed x 2 steps, 24 held-out tasks), which measures the same ratio on a run
too short for either condition to reach its target. The last line, `ratio: ...`, is the steps to target
of Shapley credit over those of the team reward (the anchor), both trained in this run.

Set-up. The relay scenario (`left` adds the first pair, `right` the second, `final` adds their two
sums) with `right` played by a frozen, noisy scripted policy (`noisy_right`, below): it gives the
correct sum with probability `--p` and a wrong number otherwise. It never learns and is right or
wrong whatever its teammates do: a free rider on the team reward. `left` and `final` share the
trainable tiny model, as in the built-in scenario. Both conditions use the scenario's own training
settings (8 prompts x 8 candidates per step, lr 5e-5, DAPO loss, group-scaled advantages) and
differ only in `credit.method`:

    team      the team reward copied to every agent
    shapley   exact Shapley values over the 3 agents from counterfactual replays of each episode,
              with `credit.absent=default_policy` and the scenario's expert as the stand-in
              (default; `--absent resample` or `--absent null_message` for the other choices)

What "absent" means decides what Shapley can see (measured with 5 seeds x 80 steps, README):

    null_message    a coalition missing any agent keeps only the format layer, which `final` earns
                    alone; the outcome is split in equal thirds. For `left` that is the team outcome
                    times a constant, and group-scaled advantages are invariant to the scale: no
                    better than the team reward.
    resample        an absent agent is replaced by a fresh sample of its own policy (a marginalising
                    baseline); one rollout per coalition makes the values noisy, and slower than the
                    team reward here.
    default_policy  the expert stands in for absent agents: each agent is credited against a
                    reference teammate, so `left`'s credit follows whether its own sum was right,
                    whatever the free rider did. It needs an expert, which relay has.

Present agents keep their recorded messages while what they see is unchanged (common random
numbers) and are sampled afresh once it differs; the replays cost about 2x the seconds per step.

The noise is deterministic: each draw is seeded by (seed, observation, how many times that
observation was answered before). Evaluation uses a separate stream keyed by the observation alone,
so the free rider is right on the same held-out tasks at every evaluation and in both conditions:
held-out differences come from `left` and `final` only.

Measured per (condition, seed): held-out team success (100 tasks, temperature 0 for the model, via
`trainers.team.evaluation.evaluate_team`) every `--eval-every` steps, the first evaluated step at which
it reaches the target (`--target`, default: the initial success + `--gain`), and the final success.
Runs use `prepare` and `trainer.step()` directly: no run directory, nothing written but a temp dir.
Goal: Shapley credit reaches the target in at most 0.7x the steps of the team reward (ratio of the
mean steps over seeds; a seed that never reaches it counts as `--steps` and is marked '>').
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOAL_RATIO = 0.7
MODULE = "credit_vs_equal"  # this file, copied next to the scenario so 'module:function' resolves to it
ADDITION = re.compile(r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*$")
WRONG_BY = (-10, -2, -1, 1, 2, 10)

NOISE = {"p": 0.7, "seed": 0, "phase": "train", "calls": Counter()}


# -- the free rider (resolved from the scenario as credit_vs_equal:noisy_right) ------------------------


def noisy_right(agent: str, observation: str, task) -> str:
    """The correct sum with probability NOISE['p'], else a wrong number; deterministic (see module doc)."""
    match = ADDITION.match(observation)
    if not match:
        return ""
    if NOISE["phase"] == "eval":
        key = f"eval|{observation}"
    else:
        key = f"{NOISE['seed']}|{observation}|{NOISE['calls'][observation]}"
        NOISE["calls"][observation] += 1
    rng = random.Random(key)
    truth = int(match.group(1)) + int(match.group(2))
    return str(truth if rng.random() < NOISE["p"] else truth + rng.choice(WRONG_BY))


def reset_noise(p: float, seed: int) -> None:
    """Start a fresh, seeded noise stream (one per condition and seed)."""
    NOISE.update(p=p, seed=seed, phase="train", calls=Counter())


def set_phase(phase: str) -> None:
    """'train' (counter-seeded draws) or 'eval' (one fixed draw per observation)."""
    NOISE["phase"] = phase


# -- one training run --------------------------------------------------------------------------------


def relay_with_free_rider(workdir: Path) -> Path:
    """relay.yaml, relay_lib.py and this file copied into `workdir`; returns the scenario path."""
    for name in ("relay.yaml", "relay_lib.py"):
        shutil.copy(ROOT / "scenarios" / name, workdir / name)
    shutil.copy(Path(__file__), workdir / f"{MODULE}.py")
    return workdir / "relay.yaml"


def overrides(method: str, absent: str, seed: int, rollouts: int = 1) -> list[str]:
    """--set overrides of one condition: right is the free rider, the credit method, the seed."""
    right = 1  # agents: left, right, final
    settings = [f"agents.{right}.policy={MODULE}:noisy_right", f"agents.{right}.trainable=false",
                f"credit.method={method}", f"credit.absent={absent}", f"train.seed={seed}", "train.threads=1"]
    if absent == "default_policy":  # the expert stands in for absent agents: credit against a reference teammate
        settings.append("credit.default_policy=relay_lib:expert")
    return settings + [f"credit.rollouts={rollouts}"]


def train_condition(scenario_path: Path, settings: list[str], steps: int, eval_every: int, p: float,
                    seed: int, eval_tasks_max: int | None = None) -> dict:
    """Train `steps` steps; held-out team success (on the first `eval_tasks_max` held-out tasks) at step 0
    and every `eval_every` steps."""
    from trainers.run import RunOptions, prepare

    scenario, _, eval_tasks, trainer = prepare(RunOptions(str(scenario_path), settings), log=lambda m: None)
    eval_tasks = eval_tasks[:eval_tasks_max]
    scenario.resolve(f"{MODULE}:reset_noise")(p, seed)
    phase = scenario.resolve(f"{MODULE}:set_phase")
    curve = [(0, held_out_success(trainer, eval_tasks, phase))]
    started = time.perf_counter()
    for step in range(1, steps + 1):
        trainer.step()
        if step % eval_every == 0 or step == steps:
            curve.append((step, held_out_success(trainer, eval_tasks, phase)))
    return {"curve": curve, "seconds": time.perf_counter() - started}


def held_out_success(trainer, eval_tasks, phase) -> float:
    """Greedy held-out team success with the free rider on its fixed evaluation stream."""
    from trainers.team.evaluation import evaluate_team

    phase("eval")
    try:
        return evaluate_team(trainer.player, eval_tasks)["team_success"]
    finally:
        phase("train")


# -- summary -------------------------------------------------------------------------------------------


def steps_to(curve: list[tuple[int, float]], target: float) -> int | None:
    """First evaluated step whose success reaches `target` (None: never within the run)."""
    return next((step for step, success in curve if step > 0 and success >= target - 1e-9), None)


def censored(steps: int | None, limit: int) -> float:
    """Steps to target for averaging: an unreached target counts as the run's length."""
    return float(limit if steps is None else steps)


def show_steps(steps: int | None, limit: int) -> str:
    """Steps to target as printed: the step, or '>N' when the run never reached it."""
    return f">{limit}" if steps is None else str(steps)


def print_table(results: dict, seeds: list[int], target_of: dict, limit: int) -> float:
    """Per seed and mean: initial, final success and steps to target per condition; returns the ratio."""
    print(f"\n{'seed':>4} {'target':>6} | {'initial':>7} | {'team final':>10} {'team steps':>10} | "
          f"{'shapley final':>13} {'shapley steps':>13} | {'ratio':>5}")
    for seed in seeds:
        team, shap = results["team", seed], results["shapley", seed]
        t, s = steps_to(team["curve"], target_of[seed]), steps_to(shap["curve"], target_of[seed])
        ratio = censored(s, limit) / censored(t, limit)
        print(f"{seed:>4} {target_of[seed]:>6.2f} | {team['curve'][0][1]:>7.2f} | {team['curve'][-1][1]:>10.2f} "
              f"{show_steps(t, limit):>10} | {shap['curve'][-1][1]:>13.2f} {show_steps(s, limit):>13} | {ratio:>5.2f}")
    means = {}
    for method in ("team", "shapley"):
        runs = [results[method, seed] for seed in seeds]
        means[method] = (statistics.fmean(censored(steps_to(r["curve"], target_of[seed]), limit)
                                          for r, seed in zip(runs, seeds)),
                         statistics.fmean(r["curve"][-1][1] for r in runs),
                         sum(steps_to(r["curve"], target_of[seed]) is None for r, seed in zip(runs, seeds)),
                         statistics.fmean(r["seconds"] / limit for r in runs))
    ratio = means["shapley"][0] / means["team"][0]
    print(f"{'mean':>4} {'':>6} | {'':>7} | {means['team'][1]:>10.2f} {means['team'][0]:>10.1f} | "
          f"{means['shapley'][1]:>13.2f} {means['shapley'][0]:>13.1f} | {ratio:>5.2f}")
    for method, (_, _, missed, per_step) in means.items():
        print(f"  {method}: target not reached by {missed} of {len(seeds)} seeds (counted as {limit} steps); "
              f"{per_step:.2f} s/step incl. evaluation")
    return ratio


def print_curves(results: dict, seeds: list[int]) -> None:
    """Held-out success at every evaluated step, per condition and seed."""
    print("\nheld-out team success by step:")
    for (method, seed), run in sorted(results.items(), key=lambda item: (item[0][1], item[0][0])):
        points = " ".join(f"{step}:{success:.2f}" for step, success in run["curve"])
        print(f"  seed {seed} {method:<7} {points}")


def parse_args(argv=None):
    """Command-line options (see --help)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per condition (0..N-1; default 3)")
    parser.add_argument("--steps", type=int, default=60, help="training steps per run (default 60)")
    parser.add_argument("--eval-every", type=int, default=5, help="steps between held-out evaluations (default 5)")
    parser.add_argument("--target", type=float, help="held-out team success to reach (default: initial + --gain)")
    parser.add_argument("--gain", type=float, default=0.10, help="target over the initial success (default 0.10)")
    parser.add_argument("--p", type=float, default=0.7, help="probability the free rider is right (default 0.7)")
    parser.add_argument("--absent", default="default_policy",
                        help="credit.absent of the Shapley condition (default_policy uses relay's expert)")
    parser.add_argument("--rollouts", type=int, default=1, help="credit.rollouts: replays per coalition (default 1)")
    parser.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks evaluated (default: all 100)")
    parser.add_argument("--quick", action="store_true", help="seconds: 1 seed x 2 steps, 24 held-out tasks")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.eval_every, args.eval_tasks = 1, 2, 2, 24
    return args


def main(argv=None) -> int:
    """Train both conditions on every seed, print the curves, the table and the verdict."""
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch

    from trainers.cli.common import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(1)
    seeds = list(range(args.seeds))
    print(f"relay with a free rider (right correct with p={args.p}); {args.seeds} seeds x {args.steps} steps; "
          f"shapley absent={args.absent}, rollouts={args.rollouts}; evaluation every {args.eval_every} steps on "
          f"{args.eval_tasks or 100} held-out tasks")
    results = {}
    with tempfile.TemporaryDirectory(prefix="credit_vs_equal-") as tmp:
        scenario_path = relay_with_free_rider(Path(tmp))
        for seed in seeds:
            for method in ("team", "shapley"):
                run = train_condition(scenario_path, overrides(method, args.absent, seed, args.rollouts), args.steps,
                                      args.eval_every, args.p, seed, args.eval_tasks)
                results[method, seed] = run
                print(f"  seed {seed} {method:<7} initial {run['curve'][0][1]:.2f} final {run['curve'][-1][1]:.2f} "
                      f"({run['seconds']:.0f} s)", flush=True)
    target_of = {seed: args.target if args.target is not None else results["team", seed]["curve"][0][1] + args.gain
                 for seed in seeds}
    print_curves(results, seeds)
    ratio = print_table(results, seeds, target_of, args.steps)
    verdict = "met" if ratio <= GOAL_RATIO else "NOT met"
    print(f"\nsteps to target, shapley / team = {ratio:.2f} (goal <= {GOAL_RATIO}): {verdict}")
    print(f"ratio: {ratio:.2f} (shapley steps to target / team steps to target; anchor: the team reward, "
          f"trained in this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
