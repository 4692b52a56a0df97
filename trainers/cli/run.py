"""`marl run SCENARIO`: the main job on the command line (the work is in trainers/run.py)."""

from __future__ import annotations

import argparse
import textwrap

from marl.options import TRACKERS
from trainers.cli.common import add_scenario_arguments, path_value, quiet_libraries, training_errors, usage_errors
from trainers.config import settings_help
from trainers.run import RunOptions, run_scenario

MODEL_HELP = """\
the model: train.model is 'tiny' (the embedded default, built for the scenario on first use and cached
under --cache-dir), a local Hugging Face model directory, a .gguf file or 'smollm2-135m-instruct';
a relative DIR is read from the working directory. Each turn is rendered with the model's chat
template when it has one; chat_template: none (scenario or agent) gives the plain observation.

settings: every key of a scenario's train section, set with --set train.KEY=VALUE (from the schema,
marl.scenario.spec.TrainSpec; `marl validate SCENARIO --set ...` checks them without training)"""


def settings_epilog(width: int = 100) -> str:
    """MODEL_HELP and one entry per train setting (key, help, default), generated from the schema."""
    lines = [MODEL_HELP, ""]
    for key, text in settings_help():
        lines.append(f"  {key}")
        lines += textwrap.wrap(text, width, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def add_parser(commands) -> None:
    """Register `marl run SCENARIO`."""
    run_parser = commands.add_parser(
        "run", help="train a team of agents on a scenario (stages, credit, report)",
        epilog=settings_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scenario_arguments(run_parser)
    run_parser.add_argument("--out", type=path_value, help="run directory (default runs/<scenario name>-<date>-<time>)")
    run_parser.add_argument("--resume", action="store_true",
                            help="continue the run in --out from its last checkpoint (same scenario and --set)")
    run_parser.add_argument("--init-from", metavar="RUN_DIR", type=path_value,
                            help="continual RL: start from a finished run's policies (its tokenizer and adapters "
                                 "too), with train.continual.replay (a share of steps replaying its scenario's "
                                 "tasks) and train.continual.kl (a KL to its policy); both held-out sets are "
                                 "measured before and after")
    run_parser.add_argument("--tracker", choices=TRACKERS,
                            help="default: the scenario's train.tracking.tracker (wandb, offline unless "
                                 "WANDB_API_KEY is set); metrics.jsonl is always written")
    run_parser.add_argument("--backend", choices=("local", "ray"),
                            help="where episodes are played: this process (local) or Ray rollout workers (ray; "
                                 "see train.ray); the same as --set train.backend=...")
    run_parser.set_defaults(handler=run)


def run(args) -> int:
    """Validate, then train; a bad scenario prints its problems and exits 2 before any model is built."""
    quiet_libraries()
    overrides = args.set + ([f"train.backend={args.backend}"] if args.backend else [])
    options = RunOptions(scenario=args.scenario, overrides=overrides, out=args.out, resume=args.resume,
                         tracker=args.tracker, cache_dir=args.cache_dir, init_from=args.init_from)
    with usage_errors(*training_errors()):
        run_scenario(options)
    return 0
