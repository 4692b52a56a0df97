"""The addition demo end to end: build (or load) the tiny model, measure, train with GRPO, measure.

This is what `make run` runs until the multi-agent main job exists. Held-out accuracy is measured on
a fixed evaluation set, greedy (temperature 0) and sampled (temperature 1, fixed seed), before and
after training. The run directory gets metrics.jsonl, summary.json, checkpoints, report.md with
plots, and (with the default tracker) an offline Weights & Biases run under wandb/.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

from marl.addition import AdditionSplits, addition_progress, addition_reward, addition_splits
from marl.options import TRACKERS, one_of
from marl.scenario.overrides import SettingsError, apply_typed_overrides
from trainers.grpo.config import GRPOConfig, KnobError
from trainers.grpo.trainer import GRPOTrainer
from trainers.runs.rundir import RunDirectoryError  # noqa: F401  (raised by run_demo; re-exported for callers)
from trainers.policy.tinylm import TinyLMRecipe, build_or_load_tiny_model, load_policy

PROBE_SIZE = 256  # tasks of the RL split used to decide when SFT has warmed the model up enough


@dataclass
class DemoConfig:
    """Settings of the addition demo run (the GRPO knobs live in `grpo`)."""

    out: str = "runs/demo"
    """run directory: metrics.jsonl, summary.json and checkpoints go here"""
    cache_dir: str | None = None
    """where the tiny model is cached (default $MARL_CACHE or ~/.cache/marl)"""
    model: str | None = None
    """a local Hugging Face model directory to train instead of the tiny model"""
    eval_samples: int = 8
    """sampled completions per held-out prompt for the sampled accuracy"""
    checkpoint_every: int = 10
    resume: bool = False
    tracker: str = "wandb"
    """wandb (offline unless WANDB_API_KEY is set) | jsonl | none; metrics.jsonl is always written"""
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(steps=200))


GRPO_FLAGS = ("steps", "threads", "seed")  # GRPO knobs with a flag of their own (--steps, --threads, --seed)


def demo_config(overrides: list[str] = (), *, steps: int | None = None, threads: int | None = None,
                seed: int | None = None, **settings) -> DemoConfig:
    """The demo's config from its flags and `--set KEY=VALUE` overrides, checked before anything is built.

    `settings` are DemoConfig fields (out, resume, cache_dir, model, tracker, ...); `steps`, `threads` and
    `seed` set those GRPO knobs. `--set` keys are DemoConfig's fields and `grpo.<knob>` (every GRPOConfig
    field), applied after the flags by `marl.scenario.overrides.apply_typed_overrides` and checked by the
    one GRPO knob schema. Raises SettingsError (one line) for any bad flag or setting.
    """
    if steps is not None and steps < 1:  # checked before the run directory or the tiny model is made
        raise SettingsError(f"--steps {steps}: expected 1 or more GRPO steps")
    data = plain_config(DemoConfig(**settings))
    flags = {name: value for name, value in zip(GRPO_FLAGS, (steps, threads, seed)) if value is not None}
    data["grpo"].update(flags)
    data = apply_typed_overrides(data, _settings_schema(DemoConfig), list(overrides))
    return _checked_demo_config(data, list(overrides), set(flags))


def _settings_schema(cls) -> dict:
    """{field: type} of the settings dataclass, a nested mapping for its GRPOConfig (a pydantic model)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: ({name: info.annotation for name, info in GRPOConfig.model_fields.items()}
                     if hints[f.name] is GRPOConfig else hints[f.name]) for f in dataclasses.fields(cls)}


def plain_config(config: DemoConfig) -> dict:
    """The demo's settings as plain data (its GRPO knobs a nested dict): what the tracker and summary record."""
    return {**asdict(config), "grpo": config.grpo.model_dump()}


def _checked_demo_config(data: dict, overrides: list[str], flags: set[str]) -> DemoConfig:
    """DemoConfig from checked data; a bad value is named by the --set or flag that gave it."""
    knobs = data.pop("grpo")
    try:
        grpo = GRPOConfig(**knobs)
    except KnobError as error:
        raise SettingsError(f"{_given_by(f'grpo.{error.knob}', overrides, error.knob in flags)}{error}") from None
    bad = [(name, f"{name}={data[name]!r}: expected 1 or more") for name in ("eval_samples", "checkpoint_every")
           if data[name] < 1]
    if data["tracker"] not in TRACKERS:
        bad.append(("tracker", f"tracker={data['tracker']!r}: expected {one_of(TRACKERS)}"))
    if bad:
        name, message = bad[0]
        raise SettingsError(f"{_given_by(name, overrides, False)}{message}")
    return DemoConfig(**data, grpo=grpo)


def _given_by(key: str, overrides: list[str], flag: bool) -> str:
    """'--set KEY: ' when an override set the key (the last one wins), '--FLAG: ' for a flag, else ''."""
    if any(item.partition("=")[0].strip() == key for item in overrides):
        return f"--set {key}: "
    return f"--{key.rpartition('.')[2]}: " if flag else ""


def demo_policy(splits: AdditionSplits, cache_dir: str | None = None, log=print) -> Path:
    """The tiny addition model, built on the SFT split (each problem a chat turn with no role, as
    relay's agents see theirs) and warmed up until its sampled accuracy on a probe of the RL split
    reaches the recipe's target."""
    from trainers.grpo.evaluate import accuracy
    from trainers.policy.prompts import DEFAULT_STYLE

    demonstrations = [(task.prompt, task.answer, DEFAULT_STYLE) for task in splits.sft]
    probe = splits.train[:PROBE_SIZE]

    def probe_accuracy(model, tokenizer):
        return accuracy(model, tokenizer, chat_tasks(probe, tokenizer), addition_reward, greedy=False, samples=2, seed=1)

    return build_or_load_tiny_model(TinyLMRecipe(), demonstrations, probe_accuracy, cache_dir, log)


def chat_tasks(tasks, tokenizer) -> list:
    """The tasks with each prompt rendered as the model's turn (trainers/policy/prompts.py: the chat
    template when the tokenizer has one, else the problem itself), as every marl command renders it."""
    from trainers.policy.prompts import turn_prompt

    return [dataclasses.replace(task, prompt=turn_prompt(tokenizer, task.prompt)) for task in tasks]


def chat_splits(splits: AdditionSplits, tokenizer) -> AdditionSplits:
    """`chat_tasks` of every split."""
    return AdditionSplits(*(chat_tasks(part, tokenizer) for part in (splits.sft, splits.train, splits.eval)))


def held_out_accuracy(model, tokenizer, splits: AdditionSplits, samples: int, max_new_tokens: int) -> dict:
    """Greedy and sampled accuracy on the fixed evaluation split."""
    from trainers.grpo.evaluate import accuracy

    greedy = accuracy(model, tokenizer, splits.eval, addition_reward, max_new_tokens=max_new_tokens)
    sampled = accuracy(model, tokenizer, splits.eval, addition_reward, greedy=False, samples=samples,
                       max_new_tokens=max_new_tokens, seed=1234)
    return {"greedy": greedy, "sampled": sampled}


def run_demo(config: DemoConfig, log=print) -> dict:
    """Run the whole demo and return its summary (also written to OUT/summary.json).

    A write that fails mid-run (a full disk, `ulimit -f`) raises RunDirectoryError naming the file
    and the intact checkpoint; nothing already written is lost.
    """
    import torch

    from trainers.runs.rundir import ensure_writable, failed_writes_stop_the_run

    from trainers.policy.loading import placement, set_attention

    torch.set_num_threads(config.grpo.threads)
    device, dtype = placement(config.grpo.device, config.grpo.dtype, section="grpo")  # checked before anything is built
    if config.model:  # a directory that does not load is refused before the run directory is made
        from common.chat import check_model_dir
        from trainers.policy.loading import ModelLoadError

        problem = check_model_dir(Path(config.model))
        if problem is not None:
            raise ModelLoadError(f"--model: {problem}")
    out = Path(config.out)
    made = not out.exists()
    ensure_writable(out)
    splits = addition_splits(seed=0)
    try:
        path = Path(config.model) if config.model else demo_policy(splits, config.cache_dir, log)
        model, tokenizer = load_policy(path, device=device, dtype=dtype)
        set_attention(model, config.grpo.attention, "grpo")
    except BaseException:
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # nothing was written: a refused demo leaves no empty run directory behind
        raise
    splits = chat_splits(splits, tokenizer)
    trainer = GRPOTrainer(model, tokenizer, splits.train, addition_reward, config.grpo,
                          progress_fn=addition_progress)
    with failed_writes_stop_the_run(out, lambda: trainer.step_count, RunDirectoryError):
        return _run(config, out, splits, model, tokenizer, trainer, log)


def _run(config: DemoConfig, out: Path, splits, model, tokenizer, trainer, log) -> dict:
    from common.files import write_text_atomically
    from trainers.runs.checkpoint import final_checkpoint, load_checkpoint
    from trainers.runs.progress import ProgressPrinter
    from trainers.runs.report import truncate_metrics, write_report
    from trainers.runs.rundir import open_run_directory

    resumed = open_run_directory(out, config.resume, log)
    if resumed is not None:
        load_checkpoint(trainer, resumed)
        truncate_metrics(out / "metrics.jsonl", trainer.step_count)
        log(f"resumed from {resumed} at step {trainer.step_count}")
    before = _read_before(out) if resumed is not None else None
    if before is None:
        before = held_out_accuracy(model, tokenizer, splits, config.eval_samples, config.grpo.max_new_tokens)
        write_text_atomically(out / "before.json", json.dumps(before))
    log(f"held-out accuracy before: greedy {before['greedy']:.3f}, sampled {before['sampled']:.3f} "
        f"({len(splits.eval)} prompts)")

    progress = ProgressPrinter(total=config.grpo.steps, start=trainer.step_count, log=log)
    started = time.perf_counter()
    tracker = _tracker(config, out, trainer.step_count)
    with tracker:  # an exception or Ctrl-C finishes the W&B run as failed
        _train(trainer, tracker, progress, config, out, log)
        checkpoint = final_checkpoint(trainer, out)
        after = held_out_accuracy(model, tokenizer, splits, config.eval_samples, config.grpo.max_new_tokens)
        summary = _summary(config, before, after, out, time.perf_counter() - started)
        tracker.summary(summary)
        tracker.log_artifact(checkpoint / "model", name="policy", type="model",
                             metadata={"train/step": trainer.step_count}, aliases=["latest", f"step-{trainer.step_count}"])
    report = write_report(out, title="marl demo: GRPO on two-number addition", before=before, after=after)
    log(f"held-out accuracy after:  greedy {after['greedy']:.3f}, sampled {after['sampled']:.3f}")
    log(f"gain: greedy {after['greedy'] - before['greedy']:+.3f}, sampled {after['sampled'] - before['sampled']:+.3f}"
        f"  |  report: {report}")
    return summary


def _tracker(config: DemoConfig, out: Path, step: int):
    """The experiment tracker (`none` still keeps metrics.jsonl); a resume continues the same W&B run."""
    from trainers.runs.tracking import run_tracker

    return run_tracker(config.tracker, out, step, config=plain_config(config), group="demo")


def _train(trainer, tracker, progress, config: DemoConfig, out: Path, log) -> None:
    """The step loop: log every step, checkpoint every `checkpoint_every`, and on Ctrl-C."""
    from trainers.runs.checkpoint import checkpoint_on_interrupt, save_checkpoint

    with checkpoint_on_interrupt(trainer, out, log) as stop_requested:
        while trainer.step_count < config.grpo.steps:
            metrics = trainer.step()
            tracker.log(metrics)
            progress.update(metrics)
            if trainer.step_count % config.checkpoint_every == 0:
                save_checkpoint(trainer, out)
            if stop_requested():
                raise KeyboardInterrupt


def _read_before(out: Path) -> dict | None:
    path = out / "before.json"
    return json.loads(path.read_text()) if path.exists() else None


def _summary(config: DemoConfig, before: dict, after: dict, out: Path, seconds: float) -> dict:
    from trainers.runs.report import read_metrics

    rows = read_metrics(out / "metrics.jsonl")
    step_times = [row["time/step"] for row in rows]
    return {"before": before, "after": after, "steps": len(rows), "train_seconds": seconds,
            "median_step_seconds": statistics.median(step_times) if step_times else None,
            "config": plain_config(config)}
