"""`marl estimate`: training tokens and wall time of a run, before starting it (work in trainers/estimate.py)."""

from __future__ import annotations

import math

from trainers.cli.common import add_scenario_arguments, quiet_libraries, training_errors, usage_errors
from trainers.estimate import estimate_run
from trainers.run import RunOptions


def add_parser(commands) -> None:
    """Register `marl estimate SCENARIO`."""
    estimate = commands.add_parser(
        "estimate", help="training tokens and a time estimate of `marl run`, from a short measured run")
    add_scenario_arguments(estimate)
    estimate.add_argument("--probe-steps", type=int, default=2,
                          help="trainer steps to measure (default 2; with 2 or more the first is left out as "
                               "warm-up); nothing is written to disk")
    estimate.set_defaults(handler=run)


def run(args) -> int:
    """Validate, probe and print the estimate; a bad scenario prints its problems and exits 2."""
    quiet_libraries()
    options = RunOptions(scenario=args.scenario, overrides=args.set, cache_dir=args.cache_dir)
    with usage_errors(*training_errors()):
        print(format_estimate(estimate_run(options, args.probe_steps, log=lambda message: None)))
    return 0


def format_estimate(f: dict) -> str:
    """The estimate as a two-column table: each figure with how it was obtained."""
    rows = [("stages", " + ".join(f"{stage} {steps}" for stage, steps in f["stages"]) + f" = {f['total_steps']} steps"),
            ("episodes per step", f"{f['prompts_per_step']} prompts x {f['group_size']} candidates = "
                                  f"{f['episodes_per_step']}"),
            ("total episodes", f"{f['total_episodes']:,}"),
            ("training tasks", f"{f['train_tasks']:,} distinct; each drawn {f['draws_per_task']:.2f} times on "
                               f"average ({f['group_size']} episodes per draw)"),
            ("trajectory length", f"{f['mean_trajectory_tokens']:.2f} generated tokens per episode "
                                  f"({_spread(f['trajectory_tokens_sd'])}, {f['episodes_measured']} episodes)"),
            ("epochs (mu)", str(f["mu"])),
            ("training tokens", f"{f['total_steps']} x {f['prompts_per_step']} x {f['group_size']} x "
                                f"{f['mean_trajectory_tokens']:.2f} x {f['mu']} = {f['training_tokens']:,.0f}"),
            ("seconds per step", _step_line(f)),
            ("  play / credit / update", f"{f['play_seconds_per_step']:.3f} / {f['credit_seconds_per_step']:.3f} / "
                                         f"{f['update_seconds_per_step']:.3f} s (counterfactual replays: "
                                         f"{_percent(f['credit_share'])} of a step)"),
            ("training time", f"{f['total_steps']} x {f['seconds_per_step']:.3f} s = "
                              f"{duration(f['train_seconds'])} (range {duration(f['train_seconds_range'][0])} to "
                              f"{duration(f['train_seconds_range'][1])})"),
            ("evaluation", _eval_line(f)),
            ("estimated wall time", duration(f["total_seconds"]))]
    width = max(len(name) for name, _ in rows)
    probe = (f"{f['probe_steps']} measured steps, the first left out as warm-up" if f["warmup_excluded"]
             else f"{f['probe_steps']} measured step, warm-up included (use --probe-steps 2 or more to leave it out)")
    lines = [f"marl estimate: {f['scenario']} ({probe})"]
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    lines += [f"  not included: {note}" for note in f["not_measured"]]
    return "\n".join(lines)


def _step_line(f: dict) -> str:
    if f["timed_steps"] < 2:
        return f"{f['seconds_per_step']:.3f} s (1 timed step: no spread; raise --probe-steps for one)"
    return (f"{f['seconds_per_step']:.3f} s (sd {f['seconds_per_step_sd']:.3f}, min {f['seconds_per_step_min']:.3f}, "
            f"max {f['seconds_per_step_max']:.3f}; {f['timed_steps']} timed steps)")


def _eval_line(f: dict) -> str:
    if not f["eval_tasks"]:
        return "none (the scenario holds out no tasks)"
    timed = "" if f["eval_tasks_timed"] == f["eval_tasks"] else f", projected from {f['eval_tasks_timed']} timed"
    return f"before + after on {f['eval_tasks']} held-out tasks = {duration(f['eval_seconds'])}{timed}"


def _spread(sd: float) -> str:
    return "no spread: one episode" if math.isnan(sd) else f"sd {sd:.2f}"


def _percent(share: float) -> str:
    return "n/a" if math.isnan(share) else f"{100 * share:.0f}%"


def duration(seconds: float) -> str:
    """Seconds as a short human duration: 42.0 s, 3.5 min, 2.1 h."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
