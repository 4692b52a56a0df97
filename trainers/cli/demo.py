"""`marl demo`: GRPO on the tiny addition model, held-out accuracy before and after (work in trainers/demo.py)."""

from __future__ import annotations

from marl.options import TRACKERS
from trainers.cli.common import UsageError, quiet_libraries, usage_errors


def add_parser(commands) -> None:
    """Register `marl demo`."""
    demo = commands.add_parser("demo", help="GRPO on the tiny addition model: accuracy before and after")
    demo.add_argument("--steps", type=int, help="GRPO steps (default 200)")
    demo.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    demo.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    demo.add_argument("--threads", type=int, help="torch threads (default 1)")
    demo.add_argument("--seed", type=int, help="seed of the RL run (default 0)")
    demo.add_argument("--model", help="a local Hugging Face model directory to train instead of the tiny model")
    demo.add_argument("--cache-dir", help="tiny-model cache (default $MARL_CACHE or ~/.cache/marl)")
    demo.add_argument("--tracker", choices=TRACKERS, default="wandb",
                      help="wandb (offline unless WANDB_API_KEY is set), jsonl or none; metrics.jsonl is always written")
    demo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a setting, e.g. --set grpo.lr=1e-4 (repeatable)")
    demo.set_defaults(handler=run)


def run(args) -> int:
    """Build the demo's config from the flags and --set, check it, and run the demo."""
    from marl.scenario.overrides import SettingsError
    from trainers.demo import demo_config, run_demo

    with usage_errors(SettingsError):  # checked before the run directory or the tiny model is made
        config = demo_config(args.set, steps=args.steps, threads=args.threads, seed=args.seed, out=args.out,
                             resume=args.resume, cache_dir=args.cache_dir, model=args.model, tracker=args.tracker)
    quiet_libraries()
    try:
        run_demo(config)
    except (FileNotFoundError, RuntimeError) as error:  # RunDirectoryError, or a tracker that cannot start
        raise UsageError(str(error)) from None
    return 0
