"""`marl run SCENARIO`: the main job on the command line (the work is in trainers/run.py)."""

from __future__ import annotations

import argparse

from marl.options import TRACKERS
from trainers.cli.common import add_scenario_arguments, quiet_libraries, training_errors, usage_errors

MODEL_HELP = """\
the model: train.model is 'tiny' (the embedded default: a ~1.6M-parameter Qwen2 chat model with a
BPE tokenizer, built for the scenario on first use, one to six minutes, then cached under --cache-dir)
or a local Hugging Face model directory (--set train.model=DIR); a relative DIR is read from the working directory, not the scenario's
folder. Each turn is rendered with the model's chat template when it has one (the agent's role as
the system message, its observation as the user message); chat_template: none (scenario or agent)
gives the plain observation.

hardware and memory (each a --set train.KEY=VALUE):
  train.device     auto (cuda, else mps, else cpu), cpu, cuda or mps
  train.dtype      auto (bfloat16 on a GPU that has it, else float32), float32, bfloat16 or float16
  train.lora.r     LoRA adapters via peft (also train.lora.alpha, .dropout, .target_modules);
                   absent = full fine-tuning
  train.gradient_checkpointing, train.max_tokens_per_microbatch   bounded memory, same loss

beyond one process (--backend ray, or --set train.backend=ray; pip install -e '.[ray]'):
  train.ray.address          absent: a local cluster; auto or ray://HOST:PORT: an existing one
  train.ray.rollout_workers  Ray actors playing episodes and replays (default 2), each
                             train.ray.num_cpus / num_gpus
  train.ray.max_staleness    0 (default): on-policy, a stale sample is an error; k: weights go out
                             every k+1 versions and off-policy samples are logged (ray/*)"""


def add_parser(commands) -> None:
    """Register `marl run SCENARIO`."""
    run_parser = commands.add_parser(
        "run", help="train a team of agents on a scenario (stages, credit, report)",
        epilog=MODEL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scenario_arguments(run_parser)
    run_parser.add_argument("--out", help="run directory (default runs/<scenario name>-<date>-<time>)")
    run_parser.add_argument("--resume", action="store_true",
                            help="continue the run in --out from its last checkpoint (same scenario and --set)")
    run_parser.add_argument("--init-from", metavar="RUN_DIR",
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
    from trainers.run import RunOptions, run_scenario

    quiet_libraries()
    overrides = args.set + ([f"train.backend={args.backend}"] if args.backend else [])
    options = RunOptions(scenario=args.scenario, overrides=overrides, out=args.out, resume=args.resume,
                         tracker=args.tracker, cache_dir=args.cache_dir, init_from=args.init_from)
    with usage_errors(*training_errors()):
        run_scenario(options)
    return 0
