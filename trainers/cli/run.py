"""`marl run SCENARIO`: the main job on the command line (the work is in trainers/run.py)."""

from __future__ import annotations

from marl.options import TRACKERS
from trainers.cli.common import add_scenario_arguments, quiet_libraries, training_errors, usage_errors


def add_parser(commands) -> None:
    """Register `marl run SCENARIO`."""
    run_parser = commands.add_parser("run", help="train a team of agents on a scenario (stages, credit, report)")
    add_scenario_arguments(run_parser)
    run_parser.add_argument("--out", help="run directory (default runs/<scenario name>-<date>-<time>)")
    run_parser.add_argument("--resume", action="store_true",
                            help="continue the run in --out from its last checkpoint (same scenario and --set)")
    run_parser.add_argument("--tracker", choices=TRACKERS,
                            help="default: the scenario's train.tracking.tracker (wandb, offline unless "
                                 "WANDB_API_KEY is set); metrics.jsonl is always written")
    run_parser.set_defaults(handler=run)


def run(args) -> int:
    """Validate, then train; a bad scenario prints its problems and exits 2 before any model is built."""
    from trainers.run import RunOptions, run_scenario

    quiet_libraries()
    options = RunOptions(scenario=args.scenario, overrides=args.set, out=args.out, resume=args.resume,
                         tracker=args.tracker, cache_dir=args.cache_dir)
    with usage_errors(*training_errors()):
        run_scenario(options)
    return 0
