"""`marl validate FILE...`: check scenario files, every problem as FILE:LINE:COL (needs no torch); the model
folders a scenario names are checked from their files' headers too (marl/scenario/model_dirs.py)."""

from __future__ import annotations

import sys

from marl.scenario.model_dirs import model_dir_problems
from trainers.cli.common import path_value, print_problems


def add_parser(commands) -> None:
    """Register `marl validate FILE...`."""
    validate = commands.add_parser("validate", help="check scenario files; print every problem as FILE:LINE:COL")
    validate.add_argument("files", nargs="+", metavar="FILE", type=path_value)
    validate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                          help="override a key before validation, e.g. --set train.lr=1e-4")
    validate.set_defaults(handler=run)


def run(args) -> int:
    """Print every problem of every file on stderr (FILE:LINE:COL: key.path: message); exit 2 if any."""
    from marl.scenario.load import ScenarioError, load_scenario

    failures = 0
    for file in args.files:  # every file is checked, a bad one does not hide the problems of the next
        try:
            scenario = load_scenario(file, args.set)
            tasks = scenario.tasks()
            if problems := model_dir_problems(scenario):  # pickle or truncated weights, no tokenizer: unread
                raise ScenarioError(problems)
        except ScenarioError as error:
            failures += 1
            print_problems(error)
            continue
        except FileNotFoundError as error:
            failures += 1
            print(f"{file}:0:0: (file): {error}", file=sys.stderr)
            continue
        spec = scenario.spec
        print(f"{file}: ok ({spec.mode}, {len(spec.agents)} agents, {len(tasks)} tasks, "
              f"{len(spec.tools)} tools)")
    return 2 if failures else 0
