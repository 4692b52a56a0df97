"""`marl demo`: `marl run` on the built-in one-agent `addition` scenario (work in trainers/demo.py)."""

from __future__ import annotations

from marl.options import TRACKERS
from trainers.cli.common import path_value, quiet_libraries, training_errors, usage_errors
from trainers.demo import demo_options, run_demo


def add_parser(commands) -> None:
    """Register `marl demo`."""
    demo = commands.add_parser("demo", help="one agent learns two-number addition: marl run on the built-in "
                                            "'addition' scenario (held-out success before and after)")
    demo.add_argument("--steps", type=int, help="GRPO steps (train.steps; default 200)")
    demo.add_argument("--out", default="runs/demo", type=path_value, help="run directory (default runs/demo)")
    demo.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    demo.add_argument("--threads", type=int, help="torch threads (train.threads; default 1)")
    demo.add_argument("--seed", type=int, help="seed of the RL run (train.seed; default 0)")
    demo.add_argument("--model", type=path_value,
                      help="a local Hugging Face model directory or .gguf file to train instead of "
                           "the tiny model (train.model)")
    demo.add_argument("--cache-dir", type=path_value, help="tiny-model cache (default $MARL_CACHE or ~/.cache/marl)")
    demo.add_argument("--tracker", choices=TRACKERS, default="wandb",
                      help="wandb (offline unless WANDB_API_KEY is set), jsonl or none; metrics.jsonl is always written")
    demo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a key of the addition scenario, e.g. --set train.lr=1e-4 (repeatable; "
                           "`marl run --help` lists every train key)")
    demo.set_defaults(handler=run)


def run(args) -> int:
    """The demo's run options from the flags and --set; then `marl run` on the addition scenario."""
    quiet_libraries()
    options = demo_options(args.set, out=args.out, resume=args.resume, tracker=args.tracker,
                           cache_dir=args.cache_dir, steps=args.steps, threads=args.threads, seed=args.seed,
                           model=args.model)
    with usage_errors(*training_errors()):
        run_demo(options)
    return 0
