"""Benchmark credit methods (Shapley, leave-one-out) against the team reward copied to every agent, on
relay with a free rider, in steps, seconds and CPU seconds to a target fixed before training.

Run from a checkout: `python bench/credit_vs_equal.py` (3 seeds x 60 steps per condition and p), or
`--quick` (seconds, for tests/integration/test_benchmarks.py: 1 seed x 2 steps, 24 held-out tasks),
which measures the same ratio on a run too short for any condition to reach its target. The last line,
`ratio: ...`, is the CPU seconds to target of the cheapest credit method over those of the team reward
(the anchor), at the worse p, all trained in this run.

Set-up. The relay scenario (`left` adds the first pair, `right` the second, `final` adds their two
sums) with `right` played by a frozen, noisy scripted policy (`noisy_right`, below): it gives the
correct sum with probability `--p` and a wrong number otherwise. It never learns and is right or
wrong whatever its teammates do: a free rider on the team reward. `left` and `final` share the
trainable tiny model, as in the built-in scenario. The conditions use the scenario's own training
settings (8 prompts x 8 candidates per step, lr 5e-5, DAPO loss, group-scaled advantages) and
differ only in `credit.method` (`--methods`):

    team        the team reward copied to every agent (the anchor)
    shapley     exact Shapley values over the 3 agents from counterfactual replays of each episode
                (2^3 - 1 coalitions, 6 replayed), with `credit.absent=default_policy` and the
                scenario's expert as the stand-in (default; `--absent resample` or
                `--absent null_message` for the other choices)
    difference  leave-one-out (difference rewards): v(everyone) - v(everyone without the agent),
                n = 3 replays per episode instead of 6, against the same stand-in

A method may name how its replays share samples, `METHOD@SHARING` (`credit.samples_shared_by`; plain
METHOD takes `--samples-shared-by`): `shapley@group` and `difference@group` reuse the messages the
step's own G episodes of a task already sampled as the replays' draws (a replay whose agent sees what
one of those episodes showed it repeats that message instead of generating), the same credit in
distribution for fewer generations.

What "absent" means decides what Shapley can see (measured with 5 seeds x 80 steps, docs/benchmarks.md):

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
Training seconds and CPU seconds (this process's, so other work on the box does not count) are the
steps' own. Goal: some credit method reaches the target in at most 0.7x the team reward's seconds at
both p (ratio of the means over seeds; a seed that never reaches it counts as its whole run and is
marked '>').
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
sys.path.insert(0, str(ROOT))
from marl.options import CREDIT_METHODS, SAMPLE_SHARING  # noqa: E402  (torch-free)

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
    and every `eval_every` steps, each point (step, training seconds so far, success). Training seconds
    are the steps' own (play, replays, update); the evaluations are not counted: they cost both
    conditions the same."""
    from trainers.run import RunOptions, prepare

    scenario, _, eval_tasks, trainer, _ = prepare(RunOptions(str(scenario_path), settings), log=lambda m: None)
    eval_tasks = eval_tasks[:eval_tasks_max]
    scenario.resolve(f"{MODULE}:reset_noise")(p, seed)
    phase = scenario.resolve(f"{MODULE}:set_phase")
    curve, seconds, cpu = [(0, 0.0, 0.0, held_out_success(trainer, eval_tasks, phase))], 0.0, 0.0
    for step in range(1, steps + 1):
        started, cpu_started = time.perf_counter(), time.process_time()
        trainer.step()
        seconds += time.perf_counter() - started
        cpu += time.process_time() - cpu_started  # this process's CPU: the box's other work does not count
        if step % eval_every == 0 or step == steps:
            curve.append((step, seconds, cpu, held_out_success(trainer, eval_tasks, phase)))
    return {"curve": curve, "seconds": seconds, "cpu": cpu}


def held_out_success(trainer, eval_tasks, phase) -> float:
    """Greedy held-out team success with the free rider on its fixed evaluation stream."""
    from trainers.team.evaluation import evaluate_team

    phase("eval")
    try:
        return evaluate_team(trainer.player, eval_tasks)["team_success"]
    finally:
        phase("train")


# -- summary -------------------------------------------------------------------------------------------


def reached(curve: list[tuple], target: float, smooth: int) -> tuple | None:
    """The first evaluated point (step, seconds, CPU seconds, success) whose success, averaged with the
    `smooth` - 1 evaluations before it, reaches `target` (None: never within the run). The average keeps
    one lucky evaluation (held-out noise is a few points) from deciding the race."""
    for index in range(1, len(curve)):
        window = [point[-1] for point in curve[max(1, index - smooth + 1):index + 1]]
        if len(window) == min(smooth, index) and statistics.fmean(window) >= target - 1e-9:
            return curve[index]
    return None


def to_target(run: dict, target: float, smooth: int, steps: int) -> tuple[float, float, float, bool]:
    """(steps, training seconds, CPU seconds, reached) to the target; a run that never reaches it counts
    as its whole length (censored: the ratio is then a bound)."""
    point = reached(run["curve"], target, smooth)
    if point is None:
        return float(steps), run["seconds"], run["cpu"], False
    return float(point[0]), point[1], point[2], True


def summarise(results: dict, seeds: list[int], target_of: dict, args) -> dict:
    """Per method: mean steps, seconds and CPU seconds to target, seeds that missed it, final success,
    s/step; and each method's ratios to the team reward (the anchor)."""
    means = {}
    for method in args.methods:
        reach = [to_target(results[method, seed], target_of[seed], args.smooth, args.steps) for seed in seeds]
        means[method] = {"steps": statistics.fmean(r[0] for r in reach),
                         "seconds": statistics.fmean(r[1] for r in reach),
                         "cpu": statistics.fmean(r[2] for r in reach),
                         "missed": sum(not r[3] for r in reach),
                         "final": statistics.fmean(results[method, seed]["curve"][-1][-1] for seed in seeds),
                         "per_step": statistics.fmean(results[method, seed]["seconds"] / args.steps for seed in seeds),
                         "cpu_per_step": statistics.fmean(results[method, seed]["cpu"] / args.steps for seed in seeds)}
    team = means["team"]
    for method in args.methods[1:]:
        means[method].update({f"{kind}_ratio": means[method][kind] / team[kind] for kind in ("steps", "seconds", "cpu")})
    return means


def print_table(results: dict, seeds: list[int], target_of: dict, args, p: float) -> dict:
    """Per seed and mean: initial and final success, steps, seconds and CPU seconds to target per method;
    returns the summary."""
    print(f"\nfree rider right with p={p}; target = initial + {args.gain} (mean of {args.smooth} evaluations), "
          "fixed from the initial evaluation before any training step")
    print(f"{'seed':>4} {'target':>6} {'initial':>7} | " + " | ".join(
        f"{method:>16} final {'steps':>6} {'s':>6} {'cpu s':>6}" for method in args.methods))
    for seed in seeds:
        row = [f"{seed:>4} {target_of[seed]:>6.2f} {results['team', seed]['curve'][0][-1]:>7.2f} |"]
        for method in args.methods:
            run = results[method, seed]
            steps, seconds, cpu, hit = to_target(run, target_of[seed], args.smooth, args.steps)
            mark = "" if hit else ">"
            row.append(f"{run['curve'][-1][-1]:>22.2f} {mark + str(int(steps)):>6} {mark + f'{seconds:.0f}':>6} "
                       f"{mark + f'{cpu:.0f}':>6} |")
        print(" ".join(row).rstrip(" |"))
    means = summarise(results, seeds, target_of, args)
    print(f"{'mean':>4} {'':>6} {'':>7} | " + " | ".join(
        f"{means[m]['final']:>22.2f} {means[m]['steps']:>6.1f} {means[m]['seconds']:>6.1f} {means[m]['cpu']:>6.1f}"
        for m in args.methods))
    for method in args.methods:
        print(f"  {method}: target missed by {means[method]['missed']} of {len(seeds)} seeds (counted as the whole "
              f"run); {means[method]['per_step']:.3f} s and {means[method]['cpu_per_step']:.3f} CPU s per step")
    for method in args.methods[1:]:
        m = means[method]
        print(f"  {method} / team: steps to target {m['steps_ratio']:.2f}, seconds {m['seconds_ratio']:.2f}, "
              f"CPU seconds {m['cpu_ratio']:.2f} (goal <= {GOAL_RATIO})")
    return means


def print_curves(results: dict, seeds: list[int]) -> None:
    """Held-out success at every evaluated step, per condition and seed."""
    print("\nheld-out team success by step (step:success):")
    for (method, seed), run in sorted(results.items(), key=lambda item: (item[0][1], item[0][0])):
        points = " ".join(f"{point[0]}:{point[-1]:.2f}" for point in run["curve"])
        print(f"  seed {seed} {method:<16} {points}")


def parse_args(argv=None):
    """Command-line options (see --help)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per condition (0..N-1; default 3)")
    parser.add_argument("--steps", type=int, default=60, help="training steps per run (default 60)")
    parser.add_argument("--eval-every", type=int, default=5, help="steps between held-out evaluations (default 5)")
    parser.add_argument("--target", type=float, help="held-out team success to reach (default: initial + --gain)")
    parser.add_argument("--gain", type=float, default=0.10, help="target over the initial success (default 0.10)")
    parser.add_argument("--smooth", type=int, default=2,
                        help="evaluations averaged when checking the target (default 2: this one and the one before)")
    parser.add_argument("--p", default="0.5,0.7",
                        help="probabilities the free rider is right, comma-separated (default 0.5,0.7)")
    parser.add_argument("--absent", default="default_policy",
                        help="credit.absent of the Shapley condition (default_policy uses relay's expert)")
    parser.add_argument("--rollouts", type=int, default=1, help="credit.rollouts: replays per coalition (default 1)")
    parser.add_argument("--samples-shared-by", default="task", choices=SAMPLE_SHARING,
                        help="credit.samples_shared_by of a method that names none (default task)")
    parser.add_argument("--eval-tasks", type=int, default=300, help="held-out tasks evaluated (default 300)")
    parser.add_argument("--methods", default="team,shapley,shapley@group,difference@group",
                        help="credit.method of each condition, comma-separated, each optionally @task, @group or "
                             "@episode (credit.samples_shared_by); team (the anchor) comes first (default "
                             "team,shapley,shapley@group,difference@group: difference is leave-one-out, n replays "
                             "per episode; @group reuses the step's own samples in the replays)")
    parser.add_argument("--quick", action="store_true", help="seconds: 1 seed x 2 steps, 24 held-out tasks")
    args = parser.parse_args(argv)
    args.methods = [method.strip() for method in args.methods.split(",") if method.strip()]
    if not args.methods or args.methods[0] != "team" or len(args.methods) < 2:
        parser.error(f"--methods {','.join(args.methods)!r}: start with team (the anchor), then the methods compared")
    for label in args.methods:
        method, _, sharing = label.partition("@")
        if method not in CREDIT_METHODS or (sharing and sharing not in SAMPLE_SHARING):
            parser.error(f"--methods: {label!r} is not METHOD[@SHARING] with METHOD one of {', '.join(CREDIT_METHODS)} "
                         f"and SHARING one of {', '.join(SAMPLE_SHARING)}")
    if args.quick:
        args.seeds, args.steps, args.eval_every, args.eval_tasks = 1, 2, 2, 24
    try:
        args.p = [float(value) for value in args.p.split(",")]
    except ValueError:
        parser.error(f"--p {args.p!r}: expected probabilities separated by commas, e.g. 0.5,0.7")
    if not all(0 <= value <= 1 for value in args.p) or args.smooth < 1:
        parser.error("--p values must lie in [0, 1] and --smooth must be at least 1")
    return args


def held_out_settings(scenario_path: Path, eval_tasks: int) -> list[str]:
    """--set overrides for `eval_tasks` held-out tasks with the scenario's own training tasks: the
    generator's first count - eval_count tasks train, the next `eval_tasks` are held out."""
    from marl.scenario.load import load_scenario

    tasks = load_scenario(scenario_path).spec.tasks
    return [f"tasks.count={tasks.count - tasks.eval_count + eval_tasks}", f"tasks.eval_count={eval_tasks}"]


def run_setting(scenario_path: Path, p: float, seeds: list[int], args) -> dict:
    """Both conditions on every seed at one free-rider accuracy; prints the curves and the table."""
    results = {}
    held_out = held_out_settings(scenario_path, args.eval_tasks)
    for seed in seeds:
        for method in args.methods:
            base, _, sharing = method.partition("@")
            settings = overrides(base, args.absent, seed, args.rollouts) + held_out + \
                [f"credit.samples_shared_by={sharing or args.samples_shared_by}"]
            run = train_condition(scenario_path, settings, args.steps, args.eval_every, p, seed)
            results[method, seed] = run
            print(f"  p={p} seed {seed} {method:<16} initial {run['curve'][0][-1]:.2f} final {run['curve'][-1][-1]:.2f} "
                  f"({run['seconds']:.0f} s training, {run['cpu']:.0f} CPU s)", flush=True)
    target_of = {seed: args.target if args.target is not None else results["team", seed]["curve"][0][-1] + args.gain
                 for seed in seeds}
    print_curves(results, seeds)
    return print_table(results, seeds, target_of, args, p)


def main(argv=None) -> int:
    """Train both conditions on every seed and free-rider accuracy, print the curves, tables and verdict."""
    args = parse_args(argv)
    from bench.support.runtime import one_quiet_thread

    one_quiet_thread()
    seeds = list(range(args.seeds))
    print(f"relay with a free rider (right correct with p in {args.p}); {args.seeds} seeds x {args.steps} steps; "
          f"shapley absent={args.absent}, rollouts={args.rollouts}, samples shared by {args.samples_shared_by}; "
          f"evaluation every {args.eval_every} steps on {args.eval_tasks} held-out tasks")
    summaries = {}
    with tempfile.TemporaryDirectory(prefix="credit_vs_equal-") as tmp:
        scenario_path = relay_with_free_rider(Path(tmp))
        for p in args.p:
            summaries[p] = run_setting(scenario_path, p, seeds, args)
    print(f"\nsummary (method / team, mean over seeds; goal <= {GOAL_RATIO} in seconds at every p):")
    for p, means in summaries.items():
        for method in args.methods[1:]:
            m = means[method]
            verdict = "met" if m["cpu_ratio"] <= GOAL_RATIO else "NOT met"
            print(f"  p={p} {method}: steps {m['steps_ratio']:.2f}, seconds {m['seconds_ratio']:.2f}, CPU seconds "
                  f"{m['cpu_ratio']:.2f} ({verdict}); final {means['team']['final']:.2f} -> {m['final']:.2f}")
    worst = {method: max(means[method]["cpu_ratio"] for means in summaries.values()) for method in args.methods[1:]}
    best = min(worst, key=worst.get)
    print(f"ratio: {worst[best]:.2f} ({best} CPU seconds to target / team CPU seconds to target, the worse p, "
          f"the best of {', '.join(args.methods[1:])}; anchor: the team reward, trained in this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
