"""The `marl` command line: main builds the parser from the command modules and dispatches.

    marl demo [--steps N] [--out DIR] [--resume] [--set grpo.lr=1e-4 ...]
    marl validate FILE... [--set key=value ...]
    marl rollout FILE [--policy expert|null|random|module:function] [--episodes N]
    marl credit FILE [--episodes N] [--policy expert|null|random] [--method shapley] [--absent null_message]
    marl serve MODEL_DIR [--port N]
    marl run SCENARIO [--out DIR] [--resume] [--set train.steps=50 ...]
    marl eval SCENARIO [--checkpoint DIR] [--out DIR]
    marl export PATH --out DIR [--merge]   a checkpoint's models; --merge: LoRA adapters merged into their base
    marl estimate SCENARIO [--probe-steps N]
    marl judges report|calibrate --base-url URL --model NAME --items FILE.jsonl --out FILE
    marl judges report --reward-model RM_DIR --items FILE.jsonl --out FILE   a reward model's biases
    marl rm train --pairs PAIRS.jsonl --base MODEL_DIR --out RM_DIR   a Bradley-Terry reward model

Each command is one module of this folder with `add_parser(commands)` and `run(args)` (see
common.py). Errors are printed as one clear line (what is wrong and how to fix it) with exit status
2, never a traceback. Ctrl-C writes a checkpoint and exits with status 130.
"""

from __future__ import annotations

import argparse
import sys

from marl.scenario.overrides import set_flag_problem
from trainers.cli import credit, demo, estimate, export, judges, rm, rollout, run, serve, validate
from trainers.cli import eval as evaluate  # imported under another name: `eval` is a builtin
from trainers.cli.common import UsageError, print_problems

MAX_ERROR_CHARS = 300  # of an argparse error line
COMMANDS = (demo, validate, rollout, credit, serve, run, evaluate, export, estimate, judges, rm)  # the order `marl --help` lists


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors keep the one-line contract: `marl CMD: error: ...` and where
    --help says more, not the usage block first; a value echoed back (5,000 digits given to an int flag)
    is cut. Every sub-command's parser is one too (argparse makes them of the parent's class)."""

    def error(self, message: str):
        """Print the one line and exit with status 2, as argparse does."""
        message = " ".join(message.split())
        if len(message) > MAX_ERROR_CHARS:
            message = f"{message[:MAX_ERROR_CHARS]}... ({len(message):,} characters)"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `marl` command: every command module registers its sub-command."""
    parser = OneLineParser(prog="marl", description="Train teams of LLM agents with RL.")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `marl` console script: parse, run the command, turn bad input into exit 2."""
    problem = set_flag_problem(sys.argv[1:] if argv is None else argv)
    if problem is not None:  # before argparse, which would call the value a stray argument
        print(f"marl: error: {problem}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    from marl.scenario.load import ScenarioError

    try:
        return args.handler(args)
    except UsageError as error:
        print(f"marl: error: {error}", file=sys.stderr)
        return 2
    except ScenarioError as error:  # any command: a scenario's problems, one located line each
        return print_problems(error)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # python -m trainers.cli.main (the tests' way in; `python -m trainers.cli` too)
    sys.exit(main())
