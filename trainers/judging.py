"""The judge calls of a command (`marl run`, `rollout`, `credit`, `eval`): one ledger, a probe, the counts.

    scenario = resolve_local_judges(scenario, cache_dir, log)   local judges' GGUF models as converted directories
    with command_ledger(scenario, cache_path, log) as ledger:   the ledger every judge of the command uses
        probe_judges(scenario)                                  one probe per endpoint: DeadJudge if one is down
        ...
        JudgeCounts(ledger).step()                              judge/<name>/calls, cache_hits, failures, retries

The ledger (judges.model.ledger) caches every judgment by endpoint, model and the whole request in one
sqlite file, so a resumed run, the counterfactual replays and a second command over the same episodes
never pay for an answer twice; a failure is never cached. Torch-free: `rollout` and `credit` use it.

A `backend: local` judge's model may be a .gguf file (relative to the scenario's folder, as a directory
is) or a packaged model's name (`smollm2-135m-instruct`): judges/ cannot convert it (that needs torch and
the trainers' model cache), so every command that builds the scenario's judges first swaps it for its
converted directory here (trainers/policy/gguf.py). Each local judge's model is also checked to fit the
memory left (float32 on the CPU, as judges/model/local_backend.py loads it), and a tokenizer without a
chat template is a warning line: the judge's rubric and question are then sent as plain text.
"""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from common.model_files import model_folder_problem
from judges.model.backend import run_sync
from judges.model.factory import build_backend
from judges.model.gguf_source import GGUFError, is_gguf_source, local_model_path
from judges.model.ledger import JudgeLedger, active, installed
from judges.model.verdict import logprobs_problem
from trainers.policy.gguf import resolve_model_dir
from trainers.policy.memory import ModelTooLarge, check_model_fits

CACHE_FILE = "judge_cache.sqlite"  # in a run directory (and beside `marl eval`'s reports)


class DeadJudge(ValueError):
    """A judge endpoint did not answer its probe (the message is one line: endpoint, error, fix)."""


class LocalJudgeError(ValueError):
    """A local judge's model that cannot be used (one line: the judge, the problem, the fix)."""


def local_judge_dir(model: str, base_dir, cache_dir=None, log=print) -> Path:
    """The directory a local judge's `model` stands for: a GGUF source converted (once) into the model cache,
    a directory relative to `base_dir` (the scenario's folder, None: the working directory) as it is.
    GGUFError (trainers/policy/gguf.py) when the GGUF source cannot be used."""
    path = local_model_path(model, base_dir)
    if not is_gguf_source(model):
        return path

    return resolve_model_dir(path, cache_dir, log).resolve()


def check_local_judge_dir(label: str, directory: Path, log=print) -> None:
    """LocalJudgeError when the model does not fit the memory left; a warning line when its tokenizer has no
    chat template (reads config, safetensors headers and tokenizer_config.json only: no weights, no torch).
    A folder marl would not load (a FIFO among its files, pickle-only or truncated weights, no tokenizer:
    common/model_files.py) is a LocalJudgeError too; one without weights is left to the memory check and loader."""
    if (problem := model_folder_problem(directory, require_weights=False)) is not None:
        raise LocalJudgeError(f"{label}: {problem}")
    try:
        check_model_fits(label, directory, "float32", "cpu", fix="use a smaller judge model, or free memory")
    except ModelTooLarge as error:
        raise LocalJudgeError(str(error)) from None
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if not (config.get("chat_template") or (directory / "chat_template.jinja").is_file()
            or (directory / "chat_template.json").is_file()):
        log(f"{label}: warning: {directory}'s tokenizer has no chat template, so the judge's messages are sent as "
            "plain text; give it a template (tokenizer.chat_template, then save_pretrained) for a chat model")


def resolve_local_judges(scenario, cache_dir=None, log=print):
    """The scenario with each `backend: local` judge's model as a directory (GGUF sources converted into the
    model cache, module docstring), each checked; LocalJudgeError (one line) for one that cannot be used."""
    judges, changed = list(scenario.spec.judges), False
    for index, judge in enumerate(judges):
        if judge.backend != "local":
            continue
        label = f"judges.{index}.model ({judge.name})"
        try:
            directory = local_judge_dir(judge.model, scenario.base_dir, cache_dir, log)
        except GGUFError as error:
            raise LocalJudgeError(f"{label}: {error}") from None
        if not (directory / "config.json").is_file():
            raise LocalJudgeError(f"{label}: {directory} is not a Hugging Face model directory (no config.json); give "
                                  "a model directory, a .gguf file or smollm2-135m-instruct")
        check_local_judge_dir(label, directory, log)
        if is_gguf_source(judge.model):  # a directory stays as written (a resumed run compares the settings)
            judges[index], changed = judge.model_copy(update={"model": str(directory)}), True
    return replace(scenario, spec=scenario.spec.model_copy(update={"judges": judges})) if changed else scenario


def used_judge_names(spec) -> set[str]:
    """The scorer kinds the scenario's reward layers use (a judge is used when its name is among them)."""
    return {scorer.kind for layer in ("outcome", "process", "format", "penalties")
            for scorer in getattr(spec.rewards, layer)}


def endpoint_judges(spec) -> list:
    """The scenario's OpenAI-compatible judges that its rewards use, one per endpoint and model."""
    used = used_judge_names(spec)
    seen, judges = set(), []
    for judge in spec.judges:
        key = (judge.model, judge.base_url)
        if judge.backend == "openai" and judge.name in used and key not in seen:
            seen.add(key)
            judges.append(judge)
    return judges


def default_cache_path() -> Path:
    """Where `marl rollout` and `marl credit` keep judgments by default: $MARL_CACHE (or ~/.cache/marl)."""
    return Path(os.environ.get("MARL_CACHE", Path.home() / ".cache" / "marl")) / CACHE_FILE


@contextmanager
def command_ledger(scenario, cache_path: str | Path | None, log=print):
    """A ledger installed for the block (its cache at `cache_path`; None: counts only), closed after.

    A scenario without endpoint judges gets a ledger with no cache file (nothing to cache)."""
    ledger = JudgeLedger(log=log)
    if cache_path is not None and endpoint_judges(scenario.spec):
        ledger.open_cache(str(cache_path))
    with installed(ledger):
        yield ledger


def _fix(judge, error: str) -> str:
    """What to do about a probe's error."""
    if error.startswith(("401", "403")):
        return f"set a valid API key in ${judge.api_key_env or 'OPENAI_API_KEY'}"
    if error.startswith("404"):
        return f"check judges[{judge.name}].model and the path of its base_url"
    return f"start the endpoint, or fix judges[{judge.name}].base_url"


def probe_judges(scenario) -> None:
    """One probe per endpoint the scenario's judges use, all at once; DeadJudge naming the first that
    does not answer (its URL, the error and the fix) before anything is played."""
    judges = endpoint_judges(scenario.spec)
    if not judges:
        return
    backends = [build_backend(judge.model_dump(), scenario.base_dir) for judge in judges]

    async def probe_all():
        try:
            return await asyncio.gather(*(backend.probe() for backend in backends))
        finally:
            await asyncio.gather(*(backend.aclose() for backend in backends), return_exceptions=True)

    for judge, backend, error in zip(judges, backends, run_sync(probe_all())):
        if error is not None:
            raise DeadJudge(f"judge {judge.name!r}: the endpoint {backend.base_url} (model {judge.model}) does not "
                            f"answer: {error}; {_fix(judge, error)}")
    _probe_logprobs(scenario)


def _probe_logprobs(scenario) -> None:
    """DeadJudge (one line) naming the first endpoint judge read with `verdict: logprobs` whose reply carries
    no logprobs: one token asked of each, uncached, before anything is played."""
    used = used_judge_names(scenario.spec)
    readers = [judge for judge in scenario.spec.judges
               if judge.backend == "openai" and judge.verdict == "logprobs" and judge.name in used]
    if not readers:
        return
    # no name: no ledger label, so the probe's answer is neither cached nor counted as the judge's
    backends = [build_backend({**judge.model_dump(), "name": None}, scenario.base_dir) for judge in readers]

    async def ask_all():
        try:
            return await asyncio.gather(*(logprobs_problem(backend) for backend in backends))
        finally:
            await asyncio.gather(*(backend.aclose() for backend in backends), return_exceptions=True)

    for judge, backend, problem in zip(readers, backends, run_sync(ask_all())):
        if problem is not None:
            raise DeadJudge(f"judge {judge.name!r}: the endpoint {backend.base_url} (model {judge.model}) cannot give "
                            f"a logprobs verdict: {problem}; set judges[{judge.name}].verdict: text, or serve the "
                            "model where replies carry logprobs (vLLM, SGLang, OpenAI, marl serve)")


class JudgeCounts:
    """Per-step figures from a ledger: judge/<name>/{calls, cache_hits, failures, retries} since the last step."""

    def __init__(self, ledger):
        self.ledger = ledger
        self.seen = ledger.counts() if ledger is not None else {}

    def step(self) -> dict[str, float]:
        """The counts since the last call, as metrics (every judge seen so far, zeros included)."""
        if self.ledger is None:
            return {}
        now = self.ledger.counts()
        metrics = {}
        for judge, counts in now.items():
            before = self.seen.get(judge, {})
            for name, value in counts.items():
                metrics[f"judge/{judge}/{name}"] = float(value - before.get(name, 0))
        self.seen = now
        return metrics


def open_run_judge_cache(scenario, out: Path) -> None:
    """The run's judge cache, OUT/judge_cache.sqlite, opened in the installed ledger (when a judge has an endpoint)."""
    ledger = active()
    if ledger is not None and endpoint_judges(scenario.spec):
        ledger.open_cache(str(out / CACHE_FILE))


def drain_judge_lines(log) -> None:
    """Log the endpoint health lines the ledger kept (the Ray backend's ledger actor cannot print them)."""
    ledger = active()
    for line in ledger.drain() if ledger is not None else ():
        log(line)


def all_masked(figures) -> bool:
    """Whether an evaluation masked every one of its episodes (so it has no team success to report)."""
    return bool(figures) and figures.get("episodes", 0) > 0 and figures.get("masked_episodes") == figures["episodes"]


def all_masked_line(figures: dict, when: str) -> str:
    """Why the held-out evaluation has no figures, and what to do, in one line."""
    ledger = active()
    failing = ledger.failing() if ledger is not None else {}
    why = "; ".join(f"judge endpoint {url} failing: {error}" for url, error in failing.items()) or (
        "a scorer or judge failed on each (marl rollout SCENARIO shows the failing scorer)")
    return (f"the held-out evaluation {when}: every one of its {figures['episodes']:.0f} episodes was masked, so "
            f"there is no team success to report ({why}); fix the judge, then run again (or --resume)")
