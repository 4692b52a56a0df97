"""`marl judges report` and `marl judges calibrate`: probe a judge endpoint, fit a calibrator.

The workflows are library functions, judges.workflows (read_items, report, calibrate, ...); this module
parses the options, checks them, builds the judge they name, turns the workflows' errors into one line
(exit 2) and prints the summary.

Items file (JSONL), one object per line:
    {"id": "q1", "prompt": "...", "candidates": ["answer 1", "answer 2"], "gold": 0}
`gold` (optional) is the index of the better candidate, or a score in [0, 1] of the first one.
A gold file (`--gold`) may instead give {"id": "q1", "gold": 0} lines.

With `--reward-model RM_DIR` the judge is a trained reward model (`marl rm train`): a pair's verdict is
the sign of the reward difference and P(better) its Bradley-Terry probability, so its length, format and
master-key biases are probed like a prompted judge's. With `--local-model MODEL` the judge is a local
model on the CPU (a Hugging Face directory, a .gguf file or smollm2-135m-instruct, converted once into
the model cache), prompted as an endpoint would be. These commands need no torch (a reward model does). Every bad input is one line on stderr and exit status 2, and every
option is checked before the first call (`--timeout` > 0, `--concurrency` >= 1, `--retries` >= 0, and
each at most its `BOUNDS`, which say why; `--out`/`--markdown`/`--cache` must be file paths: a missing
folder is created, a folder, a file in the way, a FIFO or a device is refused). `--items` and `--gold`
are read as every user file is (common.files: a regular file, bounded, UTF-8, bounded JSON lines). Responses already received stay in the on-disk cache, so a rerun does not pay
for them again. The report is strict JSON (no NaN or Infinity), written atomically; it leads with the
judge's accuracy against gold, its CI, and says so when the judge is at chance.

`--verdict logprobs` asks for one token, A or B, and reads P(A better) from its probabilities
(judges.model.verdict): for small judges. A reply without logprobs is one line (exit 2) after the
first pair; so is a label a local model's tokenizer splits, before any call.
"""

from __future__ import annotations

import math
import os
import sqlite3
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from common.files import user_file_problem
from judges.model.cache import CacheFileError, JudgeCache
from judges.model.gguf_source import GGUFError
from judges.model.local_backend import LocalBackend
from judges.model.openai_backend import OpenAIBackend
from judges.model.prompted import PairwiseJudge
from judges.model.reward_model import RewardModelError, RewardModelJudge, reward_model_problem
from judges.workflows import (SIM_BIASES, CalibrationError, NoLogprobsError, WorkflowError, calibrate,
                              calibration_items, read_items, report, simulated_client, write_report)

from marl.scenario.checks import url_problem
from trainers.cli.common import UsageError, path_value, quiet_libraries
from trainers.judging import LocalJudgeError, check_local_judge_dir, local_judge_dir

ITEMS_HELP = ('JSONL, one item per line: {"id": "q1", "prompt": "...", "candidates": ["answer 1", "answer 2"], '
              '"gold": 0}; gold (optional) is the index of the better candidate, or a score in [0, 1] of the first')


# -- options, checked before any call ------------------------------------------------------------------------
# the most each numeric option may ask for, and why: past it a command runs for days, or holds the machine
BOUNDS = {"--timeout": (86_400, "a day: an answer that has not come by then will not"),
          "--concurrency": (1024, "each request in flight holds a connection"),
          "--retries": (100, "a call that failed a hundred times will not succeed"),
          "--max-tokens": (32_768, "a verdict needs a few hundred tokens"),
          "--per-kind": (100_000, "each probe is a judgment, and a report runs them all"),
          "--seed": (2**32 - 1, "a seed is a 32-bit number")}


def _check_numbers(args) -> None:
    """UsageError for the first numeric option out of range: below its least, or over its bound (BOUNDS)."""
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout {args.timeout:g}: must be a number of seconds > 0, e.g. --timeout 60")
    checks = [("--timeout", args.timeout, 0, "seconds per request, e.g. --timeout 60"),
              ("--concurrency", args.concurrency, 1, "requests in flight at once, e.g. --concurrency 8"),
              ("--retries", args.retries, 0, "retries after a failed call (0 = none), e.g. --retries 4"),
              ("--max-tokens", args.max_tokens, 1, "tokens per judge answer, e.g. --max-tokens 512"),
              ("--seed", args.seed, 0, "the probes' random seed, e.g. --seed 0")]
    if getattr(args, "per_kind", None) is not None:
        checks.append(("--per-kind", args.per_kind, 1, "probes per kind, e.g. --per-kind 100"))
    for flag, value, low, meaning in checks:
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        shown = shown if len(shown) <= 40 else f"{shown[:40]}..."  # a 4,000-digit number is not echoed whole
        if value < low:
            raise UsageError(f"{flag} {shown}: must be >= {low} ({meaning})")
        high, why = BOUNDS[flag]
        if value > high:
            raise UsageError(f"{flag} {shown}: at most {high:,} ({why})")


def _writable_file(flag: str, value: str) -> Path:
    """The path `value` given to `flag`, checked to be writable without writing anything (a reward model or
    an endpoint that then fails leaves no empty folder behind): the path is not a folder, a FIFO or a
    device, and its nearest existing folder is writable (missing folders are created when the file is
    written). An empty value or one with a NUL byte is no path."""
    if not value.strip() or "\0" in value:
        raise UsageError(f"{flag} {value!r}: not a file path; give one, e.g. {flag} out.json")
    path = Path(value).expanduser()
    if path.is_dir():
        raise UsageError(f"{flag} {value}: is a folder; give a file path, e.g. {flag} {path / 'out.json'}")
    if path.exists() and not path.is_file():  # a FIFO or a device: never a cache, nor a report renamed over it
        raise UsageError(f"{flag} {value}: {user_file_problem(path, 'a file path')}")
    blocker = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
    if blocker is not None:
        raise UsageError(f"{flag} {value}: {blocker} is a file, not a folder; choose another path")
    folder = next(parent for parent in path.absolute().parents if parent.exists())
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {value}: not writable (permission denied); choose another path")
    return path


def check_options(args) -> None:
    """Every option that could fail the command after its calls, checked before the first one."""
    _check_numbers(args)
    for text in args.sim_bias:  # named biases: an unknown one is its line here, not a TypeError later
        _bias(text)
    verdict = getattr(args, "verdict", "text")
    if verdict == "logprobs" and args.no_logprobs:
        raise UsageError("--verdict logprobs reads the verdict from logprobs, which --no-logprobs turns off; drop one")
    if verdict == "logprobs" and args.reward_model:
        raise UsageError("--verdict logprobs: a reward model scores without a prompt or tokens to read; drop --verdict")
    if args.base_url and not args.simulated:
        if (problem := url_problem(args.base_url)) is not None:
            raise UsageError(f"--base-url {args.base_url}: {problem}")
    args.out = str(_writable_file("--out", args.out))
    if getattr(args, "markdown", None):
        args.markdown = str(_writable_file("--markdown", args.markdown))
    args.cache = str(_writable_file("--cache", args.cache))


def _open_cache(path: str):
    """The judge cache at `path`, or UsageError when the file is not a usable SQLite database."""
    try:
        return JudgeCache(path)
    except (sqlite3.Error, OSError, CacheFileError) as error:
        reason = error.reason if isinstance(error, CacheFileError) else error
        raise UsageError(f"--cache {path}: cannot be used as the response cache ({reason}); "
                            "give a new file path or delete it") from None


def build_judge(args, items):
    """A both-orders pairwise judge over the endpoint (or the simulated judge) with an on-disk cache, or
    the reward model of --reward-model (pairwise verdicts from reward differences; no cache needed)."""
    if args.reward_model:
        return _reward_model_judge(args.reward_model)
    if getattr(args, "local_model", None):
        return pairwise_judge(_local_backend(args), args)
    if args.simulated:
        client = simulated_client(items, **dict(_bias(kv) for kv in args.sim_bias))
    elif not args.base_url:
        raise UsageError("--base-url is required (or --simulated for the built-in simulated judge)")
    else:
        client = None
    backend = OpenAIBackend(client, model=args.model, base_url=args.base_url, api_key_env=args.api_key_env,
                            max_concurrency=args.concurrency, timeout_s=args.timeout, max_retries=args.retries,
                            cache=_open_cache(args.cache))
    return pairwise_judge(Progress(backend), args)


def pairwise_judge(backend, args):
    """The both-orders pairwise judge over `backend` in the --verdict mode; UsageError (one line) when its
    labels cannot be read (a label a local model's tokenizer splits into several tokens)."""
    verdict = getattr(args, "verdict", "text")
    try:
        return PairwiseJudge(backend, logprobs=not args.no_logprobs, max_tokens=args.max_tokens, verdict=verdict)
    except ValueError as error:
        raise UsageError(f"--verdict {verdict}: {error}") from None


class Progress:
    """A backend that says on stderr, every `every_s` seconds while a long job runs, how many answers it has
    had: from the endpoint (calls), from the cache, failed. Everything else is the wrapped backend's."""

    def __init__(self, backend, every_s: float = 5.0, stream=None):
        self.backend, self.every_s, self.stream = backend, every_s, stream
        self.answers, self._clock = 0, time.monotonic
        self._next = self._clock() + every_s

    def __getattr__(self, name):
        return getattr(self.backend, name)

    async def complete(self, request):
        """The backend's answer; a progress line when one is due."""
        response = await self.backend.complete(request)
        self.answers += 1
        if self._clock() >= self._next:
            self._next = self._clock() + self.every_s
            print(f"judged {self.answers} requests so far: {self.counts()}", file=self.stream or sys.stderr,
                  flush=True)
        return response

    def counts(self) -> str:
        """Calls to the endpoint, answers from the cache and failures, in words."""
        stats = self.backend.stats
        return (f"{stats['calls']} calls to the endpoint ({stats['retries']} retries), {stats['cache_hits']} "
                f"answers from the cache, {stats['failed']} failed")


def _reward_model_judge(directory: str):
    """The reward model of --reward-model as a pairwise judge; UsageError (one line) when it cannot be used."""
    quiet_libraries()
    try:
        return RewardModelJudge.load(directory)
    except (RewardModelError, OSError) as error:
        raise UsageError(f"--reward-model {directory}: {error}") from None


def _local_backend(args):
    """The local model of --local-model (a directory, a .gguf file or a packaged model, converted once) as the
    judge's backend; UsageError (one line) when it cannot be used or does not fit the memory left."""
    flag = f"--local-model {args.local_model}"
    if args.base_url or args.simulated:
        raise UsageError(f"{flag}: the judge is that local model; drop {'--base-url' if args.base_url else '--simulated'}")
    quiet_libraries()

    def stderr(line: str) -> None:  # stdout keeps the command's summary line
        print(line, file=sys.stderr, flush=True)

    try:
        directory = local_judge_dir(args.local_model, None, log=stderr)
        if not (directory / "config.json").is_file():
            raise UsageError(f"{flag}: {directory} is not a Hugging Face model directory (no config.json); give a "
                             "model directory, a .gguf file or smollm2-135m-instruct")
        check_local_judge_dir(flag, directory, stderr)
    except (GGUFError, LocalJudgeError) as error:
        raise UsageError(str(error) if str(error).startswith(flag) else f"{flag}: {error}") from None
    return LocalBackend(directory)


def _bias(text: str) -> tuple[str, float]:
    """(name, value) of one --sim-bias NAME=NUMBER; UsageError (one line, the names) for an unknown name."""
    name, _, value = text.partition("=")
    name = name.strip()
    if name not in SIM_BIASES:
        raise UsageError(f"--sim-bias {text!r}: unknown bias {name!r}; choose one of {', '.join(SIM_BIASES)} "
                         "(e.g. --sim-bias position=0.6)")
    try:
        number = float(value)
    except ValueError:
        raise UsageError(f"--sim-bias {text!r}: expected NAME=NUMBER, e.g. position=0.6") from None
    if not math.isfinite(number):
        raise UsageError(f"--sim-bias {text!r}: expected a finite number, e.g. {name}=0.5")
    return name, number


@contextmanager
def _one_line():
    """A workflow's bad input (judges.workflows.WorkflowError) as the command's one-line error, exit 2."""
    try:
        yield
    except NoLogprobsError as error:
        raise UsageError(f"--verdict logprobs: model {error.identity} answered without logprobs, and this verdict "
                         "reads them; use --verdict text, or an endpoint that returns logprobs (vLLM, SGLang, OpenAI, "
                         "marl serve)") from None
    except WorkflowError as error:
        raise UsageError(str(error)) from None


def report_command(args) -> int:
    """Run the probes (judges.workflows.report) and write the JSON (and markdown) report."""
    try:
        _check_reward_model(args)
        check_options(args)
        with _one_line():
            items = read_items(args.items, args.gold)
            judge = build_judge(args, items)
            result = report(items, judge, per_kind=args.per_kind, seed=args.seed,
                            judge_name=args.judge_name or args.model)
        write_report(result, args.out, args.markdown)
    except OSError as error:
        print(f"marl: error: cannot write the report: {error.strerror or error} ({error.filename or args.out})",
              file=sys.stderr)
        return 2
    failing = [key for key, verdict in result["verdicts"].items() if verdict == "fail"]
    backend = getattr(judge, "backend", None)  # a reward model has none: no endpoint, no cache
    calls = f" ({backend.counts()})" if isinstance(backend, Progress) else ""
    summary = f"wrote {args.out}: {result['n_calls']} judgments{calls}, {result['n_failed']} failed pairs; "
    if not any(verdict != "not estimated" for verdict in result["verdicts"].values()):
        print(summary + "nothing could be graded (every judgment failed or was unparseable; see the report's notes)")
        return 1
    print(summary + (f"FAIL: {', '.join(failing)}" if failing else "no failing threshold"))
    return 1 if failing and args.strict else 0


def calibrate_command(args) -> int:
    """Judge gold-labelled pairs and fit a Platt or isotonic calibrator bound to this judge
    (judges.workflows.calibrate), then save it."""
    _check_reward_model(args)
    check_options(args)  # a UsageError is one line from main, exit 2, before any call
    with _one_line():
        items = read_items(args.items, args.gold)
        try:
            items = calibration_items(items)
        except WorkflowError as error:
            raise UsageError(f"{args.items}: {error}") from None
        judge = build_judge(args, items)
        try:
            result = calibrate(items, judge, method=args.method, pointwise=bool(args.reward_model))
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # checked, not made, before the calls
            result.calibrator.save(args.out)
        except CalibrationError as error:  # too few pairs judged (no cause), or the fit failed
            print(f"marl: error: {error}{'' if error.__cause__ else ', nothing written'}", file=sys.stderr)
            return 1
        except WorkflowError:
            raise
        except ValueError as error:  # a fitted parameter that is not finite: not written
            print(f"marl: error: {error}", file=sys.stderr)
            return 1
        except OSError as error:
            print(f"marl: error: cannot write {args.out}: {error.strerror or error}", file=sys.stderr)
            return 2
    what = f"{result.n_fitted} gold answers, pointwise" if result.pointwise else f"{result.n_fitted} gold pairs"
    print(f"wrote {args.out}: {args.method} on {what} ({result.n_failed} failed); "
          f"ECE {result.ece_raw:.3f} raw -> {result.ece_calibrated:.3f} (in-sample)")
    return 0


def _check_reward_model(args) -> None:
    """--reward-model's directory, checked before anything is created (UsageError: one line)."""
    if getattr(args, "reward_model", None):
        if (problem := reward_model_problem(args.reward_model)) is not None:
            raise UsageError(f"--reward-model {args.reward_model}: {problem}")


def run(args) -> int:
    """`marl judges report` or `marl judges calibrate`, as the sub-command says."""
    return {"report": report_command, "calibrate": calibrate_command}[args.judges_command](args)


def add_parser(commands) -> None:
    """Register `marl judges report` and `marl judges calibrate`."""
    judges = commands.add_parser("judges", help="probe and calibrate model judges")
    judges.set_defaults(handler=run)
    sub = judges.add_subparsers(dest="judges_command", required=True)
    for name, help_text in (("report", "run the bias probes and write a report"),
                            ("calibrate", "fit a calibrator on gold-labelled pairs")):
        parser = sub.add_parser(name, help=help_text)
        parser.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
        parser.add_argument("--reward-model", metavar="RM_DIR", type=path_value,
                            help="judge with a reward model `marl rm train` "
                                 "wrote (pairwise verdicts from reward differences)")
        parser.add_argument("--local-model", metavar="MODEL", type=path_value,
                            help="judge with a local model: a Hugging Face "
                                 "directory, a .gguf file or smollm2-135m-instruct "
                                                                   "(converted once; runs on the CPU, no cache)")
        parser.add_argument("--model", default="sim", help="model name the endpoint serves")
        parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable with the key")
        parser.add_argument("--items", required=True, metavar="FILE.jsonl", type=path_value, help=ITEMS_HELP)
        parser.add_argument("--gold", type=path_value, help="optional JSONL of {id, gold} lines")
        parser.add_argument("--out", required=True, type=path_value, help="report JSON / calibrator JSON to write")
        parser.add_argument("--cache", default="~/.cache/marl/judges.sqlite", type=path_value,
                            help="response cache (SQLite)")
        parser.add_argument("--concurrency", type=int, default=8)
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
        parser.add_argument("--retries", type=int, default=4)
        parser.add_argument("--max-tokens", type=int, default=512)
        parser.add_argument("--no-logprobs", action="store_true", help="for endpoints that reject logprobs")
        parser.add_argument("--verdict", choices=("text", "logprobs"), default="text",
                            help="text: the MT-Bench prompt, an explanation then [[A]] or [[B]] (strong judges); "
                                 "logprobs: one token, A or B, P(A better) read from its probabilities, a failed "
                                 "judgment when A and B hold under half of them (small judges)")
        parser.add_argument("--simulated", action="store_true", help="use the built-in simulated judge")
        parser.add_argument("--sim-bias", action="append", default=[], metavar="NAME=VALUE",
                            help=f"simulated judge bias, one of {', '.join(SIM_BIASES)}; e.g. position=0.6 or "
                                 "master_key=4 (repeatable)")
        parser.add_argument("--seed", type=int, default=0)
        if name == "report":
            parser.add_argument("--markdown", type=path_value, help="also write a markdown summary here")
            parser.add_argument("--per-kind", type=int, default=100, help="probes per kind")
            parser.add_argument("--judge-name", help="name used by the self-attribution probe (default --model)")
            parser.add_argument("--strict", action="store_true", help="exit 1 when a threshold fails")
        else:
            parser.add_argument("--method", choices=("platt", "isotonic"), default="platt")
