"""The `marl` command line.

    marl demo [--steps N] [--out DIR] [--resume] [--set grpo.lr=1e-4 ...]
    marl validate FILE... [--set key=value ...]
    marl rollout FILE [--policy expert|null|random|module:function] [--episodes N]
    marl credit FILE [--episodes N] [--policy expert|null|random] [--method shapley] [--absent null_message]
    marl serve MODEL_DIR [--port N]
    marl judges report|calibrate --base-url URL --model NAME --items FILE.jsonl --out FILE

Errors are printed as one clear line (what is wrong and how to fix it) with exit status 2, never a
traceback. Ctrl-C writes a checkpoint and exits with status 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys


class UsageError(Exception):
    """Bad command-line input: printed without a traceback, exit status 2."""


def _quiet_libraries() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _coerce(value: str, current):
    """Parse an override string to the type of the field's current value."""
    if isinstance(current, bool):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {value!r}")
    if isinstance(current, tuple):
        return tuple(type(current[0])(part) for part in value.split(","))
    if current is None:
        return value
    parsed = type(current)(value)
    if isinstance(parsed, float) and not math.isfinite(parsed):
        raise ValueError(f"expected a finite number, got {value!r}")
    return parsed


def apply_overrides(config, overrides: list[str]):
    """Apply `a.b=value` overrides to a (nested) dataclass config; unknown keys are errors."""
    for item in overrides:
        if "=" not in item:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. --set grpo.lr=1e-4")
        key, value = item.split("=", 1)
        *parents, leaf = key.strip().split(".")
        target = config
        for part in parents:
            if not dataclasses.is_dataclass(target) or not hasattr(target, part):
                raise UsageError(f"--set {key}: unknown section {part!r}")
            target = getattr(target, part)
        if not dataclasses.is_dataclass(target):
            raise UsageError(f"--set {key}: {'.'.join(parents)} is a setting, not a section with keys "
                             f"(set {'.'.join(parents)}=VALUE instead)")
        names = {f.name for f in dataclasses.fields(target)}
        if leaf not in names:
            raise UsageError(f"--set {key}: unknown key {leaf!r}; known keys: {', '.join(sorted(names))}")
        try:
            setattr(target, leaf, _coerce(value, getattr(target, leaf)))
        except ValueError as error:
            raise UsageError(f"--set {key}={value}: {error}") from None
    if hasattr(config, "grpo"):
        try:
            config.grpo.__post_init__()
        except ValueError as error:
            raise UsageError(str(error)) from None
    return config


def _demo(args) -> int:
    from trainers.demo import DemoConfig, run_demo

    config = DemoConfig(out=args.out, resume=args.resume, cache_dir=args.cache_dir, model=args.model,
                        tracker=args.tracker)
    if args.steps is not None:
        config.grpo.steps = args.steps
    if args.threads is not None:
        config.grpo.threads = args.threads
    if args.seed is not None:
        config.grpo.seed = args.seed
    apply_overrides(config, args.set)
    if config.grpo.steps < 1:  # checked before the run directory or the tiny model is made
        raise UsageError(f"--steps {config.grpo.steps}: expected 1 or more GRPO steps")
    _quiet_libraries()
    try:
        run_demo(config)
    except (FileNotFoundError, RuntimeError) as error:  # RunDirectoryError, or a tracker that cannot start
        raise UsageError(str(error)) from None
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `marl` command."""
    parser = argparse.ArgumentParser(prog="marl", description="Train teams of LLM agents with RL.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="GRPO on the tiny addition model: accuracy before and after")
    demo.add_argument("--steps", type=int, help="GRPO steps (default 200)")
    demo.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    demo.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    demo.add_argument("--threads", type=int, help="torch threads (default 1)")
    demo.add_argument("--seed", type=int, help="seed of the RL run (default 0)")
    demo.add_argument("--model", help="a local Hugging Face model directory to train instead of the tiny model")
    demo.add_argument("--cache-dir", help="tiny-model cache (default $MARL_CACHE or ~/.cache/marl)")
    demo.add_argument("--tracker", choices=("wandb", "jsonl", "none"), default="wandb",
                      help="wandb (offline unless WANDB_API_KEY is set), jsonl or none; metrics.jsonl is always written")
    demo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a setting, e.g. --set grpo.lr=1e-4 (repeatable)")
    demo.set_defaults(handler=_demo)

    validate = commands.add_parser("validate", help="check scenario files; print every problem as FILE:LINE:COL")
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                          help="override a key before validation, e.g. --set train.lr=1e-4")
    validate.set_defaults(handler=_validate)

    rollout = commands.add_parser("rollout", help="play episodes of a scenario with a fixed policy")
    rollout.add_argument("file", metavar="FILE", help="scenario file or built-in name (relay, weather, ...)")
    _add_play_arguments(rollout, episodes=3)
    rollout.add_argument("--quiet", action="store_true", help="print only the summary line")
    rollout.add_argument("--credit", action="store_true", help="also print each agent's credit (scenario's credit section)")
    rollout.set_defaults(handler=_rollout)

    credit = commands.add_parser("credit", help="per-agent credit of a scenario under a fixed policy")
    credit.add_argument("file", metavar="FILE", help="scenario file or built-in name")
    _add_play_arguments(credit, episodes=10)
    credit.add_argument("--method", help="team, shapley, banzhaf, owen, myerson, difference or least_core")
    credit.add_argument("--estimator", help="auto, exact, permutation, antithetic, tmc, stratified or kernel")
    credit.add_argument("--absent", help="null_message, skip_turn, default_policy, resample, replay or mask")
    credit.add_argument("--budget", type=int, help="coalition evaluations per episode")
    credit.add_argument("--rollouts", type=int, help="seeded rollouts per coalition")
    credit.set_defaults(handler=_credit)

    serve = commands.add_parser("serve", help="serve a local model on an OpenAI-compatible endpoint")
    serve.add_argument("model_dir", metavar="MODEL_DIR", help="a Hugging Face causal-LM directory")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    serve.add_argument("--name", help="model name clients must ask for (default: the directory name)")
    serve.set_defaults(handler=_serve)

    from trainers.cli.eval import add_eval_parser
    from trainers.cli.judges import add_judges_parser
    from trainers.cli.run import add_run_parser
    from trainers.cli.estimate import add_estimate_parser

    add_run_parser(commands)
    add_eval_parser(commands)
    add_estimate_parser(commands)
    add_judges_parser(commands)
    return parser


def _serve(args) -> int:
    _quiet_libraries()
    from trainers.policy.serve import serve

    try:
        serve(args.model_dir, args.host, args.port, args.name)
    except FileNotFoundError as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}") from None
    return 0


def _add_play_arguments(parser, episodes: int) -> None:
    """The options shared by commands that play episodes of a scenario with a fixed policy."""
    parser.add_argument("--policy", default="expert", help="expert, null, random or module:function")
    parser.add_argument("--episodes", type=int, default=episodes, help="episodes to play (held-out tasks first)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. --set credit.method=shapley")


def _credit(args) -> int:
    from trainers.cli.scenarios import credit_command

    return credit_command(args)


def _validate(args) -> int:
    from trainers.cli.scenarios import validate_command

    return validate_command(args)


def _rollout(args) -> int:
    from trainers.cli.scenarios import rollout_command

    return rollout_command(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `marl` console script."""
    args = build_parser().parse_args(argv)
    from marl.scenario.load import ScenarioError

    try:
        return args.handler(args)
    except UsageError as error:
        print(f"marl: error: {error}", file=sys.stderr)
        return 2
    except ScenarioError as error:  # any command: a scenario's problems, one located line each
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # under `python -m trainers.cli.main` this file runs as __main__; the command modules raise
    # trainers.cli.main.UsageError, so call the main of that module (whose except clause catches it)
    from trainers.cli.main import main as cli_main

    sys.exit(cli_main())
