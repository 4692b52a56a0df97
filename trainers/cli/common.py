"""What the `marl` commands share: the usage error, quiet libraries, the common arguments, and how a
command's errors become one line (`--set` itself is marl.scenario.overrides, for every command).

Every command module in this folder has the same two functions:

    add_parser(commands)   register the command (and its arguments) on the `marl` sub-parsers
    run(args) -> int       do it; the exit status

A command reports bad input by raising `UsageError` (or by letting `usage_errors` turn a library's
error into one); `main` prints it as `marl: error: ...` and exits 2, never with a traceback. A
scenario's problems (`ScenarioError`) are printed by `main` too, one located line each.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from contextlib import contextmanager

from judges.model.ledger import format_counts
from trainers.engine.base import EngineError
from trainers.judging import DeadJudge, command_ledger, default_cache_path, probe_judges, resolve_local_judges
from trainers.records.rundir import RunDirectoryError
from trainers.records.tracking import TrackerError
from trainers.run import RunError


MAX_NAME_BYTES, MAX_PATH_BYTES = 255, 4095  # Linux's NAME_MAX, and PATH_MAX less its NUL


class UsageError(Exception):
    """Bad command-line input: printed without a traceback, exit status 2."""


def quiet_libraries() -> None:
    """Offline Hugging Face hub, no tokenizer fork warnings, no progress bars or info logs from transformers."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    # transformers' own deprecation notices (e.g. is_gradient_checkpointing, called by peft) are not the
    # user's to act on, and they would break the one-line error contract of every command
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers(\.|$)")


def print_problems(error) -> int:
    """Print a ScenarioError's problems on stderr, one FILE:LINE:COL line each; the exit status 2."""
    for problem in error.problems:
        print(problem, file=sys.stderr)
    return 2


@contextmanager
def usage_errors(*kinds: type[BaseException]):
    """Inside the block, an exception of one of `kinds` becomes a UsageError with its message."""
    try:
        yield
    except kinds as error:
        raise UsageError(str(error)) from None


def training_errors() -> tuple[type[BaseException], ...]:
    """The errors of a job that builds a team (bad input, not bugs): each is one line for the user."""
    from trainers.records.checkpoint import CheckpointError

    return RunError, RunDirectoryError, CheckpointError, EngineError, TrackerError, FileNotFoundError, ValueError


# -- arguments shared by several commands ------------------------------------------------------------------
def path_value(text: str) -> str:
    """argparse `type` of every argument that names a file or folder: an empty or blank value (Path('') is the
    working directory, where a report or an export would land unasked) or one holding a NUL byte (no file can
    have that name: os.stat raises) is the argument's one-line usage error, exit 2."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is an empty path; give a file or folder path")
    if "\0" in text:
        raise argparse.ArgumentTypeError("the path holds a NUL byte, which no file name can; give another path")
    encoded = os.fsencode(text)  # pathlib's exists() raises on a name past the limit (ENAMETOOLONG), not answers
    if len(encoded) > MAX_PATH_BYTES or max(len(part) for part in encoded.split(b"/")) > MAX_NAME_BYTES:
        raise argparse.ArgumentTypeError(f"a path of {len(encoded):,} bytes: a file name is at most {MAX_NAME_BYTES} "
                                         f"bytes and a path {MAX_PATH_BYTES:,}; give a shorter path")
    return text


def add_scenario_arguments(parser) -> None:
    """SCENARIO, --set and --cache-dir: the arguments of every command that builds a scenario's team."""
    parser.add_argument("scenario", metavar="SCENARIO", type=path_value,
                        help="scenario file or built-in name (relay, debate, ...)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. --set train.steps=50 (repeatable)")
    parser.add_argument("--cache-dir", type=path_value, help="tiny-model cache (default $MARL_CACHE or ~/.cache/marl)")


def add_play_arguments(parser, episodes: int) -> None:
    """The options shared by commands that play episodes of a scenario with a fixed policy."""
    parser.add_argument("--policy", default="expert", type=path_value, help="expert, null, random or module:function")
    parser.add_argument("--episodes", type=int, default=DefaultCount(episodes),
                        help=f"episodes to play, one per task: held-out tasks first, then training tasks (default "
                             f"{episodes}, or every task if the scenario has fewer; more than it has is refused)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. --set credit.method=shapley")


JUDGE_CACHE_HELP = ("where judgments of the scenario's endpoint judges are cached (sqlite, keyed by endpoint, model and "
                    "the whole request; failures are never cached), or 'off'; default: {default}")


def add_judge_cache_argument(parser, default: str) -> None:
    """--judge-cache PATH|off, its default described in --help."""
    parser.add_argument("--judge-cache", metavar="PATH|off", type=path_value,
                        help=JUDGE_CACHE_HELP.format(default=default))


def judge_cache_path(value: str | None, default=None):
    """The cache file --judge-cache asks for: None for 'off'; when not given, `default`, else the user's
    judge cache shared by rollout and credit (judgments are keyed by the whole request: safe to share)."""
    if value is None:
        if default is None:
            return default_cache_path()
        return default
    return None if value.strip().lower() == "off" else value


@contextmanager
def judged(scenario, cache_path):
    """The command's judge ledger (cache at `cache_path`, health lines on stderr) after one probe per
    endpoint: a judge endpoint that is down is one line and exit 2 (UsageError) before anything plays."""
    with usage_errors(DeadJudge):
        probe_judges(scenario)

    with command_ledger(scenario, cache_path, log=lambda line: print(line, file=sys.stderr)) as ledger:
        yield ledger
        if ledger.counts():  # what the judges cost: calls sent, answers read back, failures
            print(format_counts(ledger.counts()), file=sys.stderr)


class DefaultCount(int):
    """--episodes when it was not given: played as asked, or as many as there are tasks if fewer."""


def setup_play(file, overrides, policy_name: str, seed: int, episodes: int):
    """The scenario, the policy, an env, and the tasks to play, each once (held-out tasks first, then
    training tasks); torch-free. ValueError when `episodes` asks for more tasks than the scenario has."""
    from marl.env import make_env
    from marl.policies import get_policy
    from marl.scenario.load import load_scenario

    if episodes < 1:
        raise ValueError(f"--episodes {episodes}: expected 1 or more")

    scenario = load_scenario(file, overrides)
    # a local judge's GGUF model converted before the env builds its judges (LocalJudgeError: a ValueError)
    scenario = resolve_local_judges(scenario, log=lambda line: print(line, file=sys.stderr, flush=True))
    policy = get_policy(policy_name, scenario, seed=seed)
    train, held_out = scenario.split()
    tasks = held_out + train
    if episodes > len(tasks) and not isinstance(episodes, DefaultCount):  # never a silent cut to fewer
        raise ValueError(f"--episodes {episodes}: scenario {scenario.spec.name!r} has {len(tasks)} tasks "
                         f"({len(held_out)} held out, {len(train)} for training) and plays each once; ask for "
                         f"--episodes {len(tasks)} or fewer, or raise tasks.count (--set tasks.count=N)")
    return scenario, policy, make_env(scenario), tasks[:episodes]
