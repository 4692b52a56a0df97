"""`marl run`: the main job on the command line (the work is in trainers/run.py)."""

from __future__ import annotations

import sys


def add_scenario_arguments(parser) -> None:
    """SCENARIO, --set and --cache-dir: the arguments of every command that builds a scenario's team."""
    parser.add_argument("scenario", metavar="SCENARIO", help="scenario file or built-in name (relay, debate, ...)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. --set train.steps=50 (repeatable)")
    parser.add_argument("--cache-dir", help="tiny-model cache (default $MARL_CACHE or ~/.cache/marl)")


def report_problems(work) -> int:
    """Call `work()`; scenario problems print as FILE:LINE:COL lines (exit 2), other bad input is a
    UsageError (one line, exit 2); returns work's exit code."""
    from marl.scenario.load import ScenarioError
    from trainers.runs.checkpoint import CheckpointError
    from trainers.cli.main import UsageError
    from trainers.run import RunError
    from trainers.runs.rundir import RunDirectoryError

    try:
        return work()
    except ScenarioError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return 2
    except (RunError, RunDirectoryError, CheckpointError, FileNotFoundError, ValueError) as error:
        raise UsageError(str(error)) from None


def add_run_parser(commands) -> None:
    """Register `marl run SCENARIO`."""
    run = commands.add_parser("run", help="train a team of agents on a scenario (stages, credit, report)")
    add_scenario_arguments(run)
    run.add_argument("--out", help="run directory (default runs/<scenario name>-<date>-<time>)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in --out from its last checkpoint (same scenario and --set)")
    run.add_argument("--tracker", choices=("wandb", "jsonl", "none"),
                     help="default: the scenario's train.tracking.tracker (wandb, offline unless WANDB_API_KEY "
                          "is set); metrics.jsonl is always written")
    run.set_defaults(handler=run_command)


def run_command(args) -> int:
    """Validate, then train; a bad scenario prints its problems and exits 2 before any model is built."""
    from trainers.cli.main import _quiet_libraries
    from trainers.run import RunOptions, run_scenario

    _quiet_libraries()
    options = RunOptions(scenario=args.scenario, overrides=args.set, out=args.out, resume=args.resume,
                         tracker=args.tracker, cache_dir=args.cache_dir)

    def work() -> int:
        run_scenario(options)
        return 0

    return report_problems(work)
