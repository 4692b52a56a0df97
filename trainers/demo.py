"""The addition demo end to end: build (or load) the tiny model, measure, train with GRPO, measure.

This is what `make run` runs until the multi-agent main job exists. Held-out accuracy is measured on
a fixed evaluation set, greedy (temperature 0) and sampled (temperature 1, fixed seed), before and
after training. The run directory gets metrics.jsonl, summary.json, checkpoints, report.md with
plots, and (with the default tracker) an offline Weights & Biases run under wandb/.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from marl.addition import AdditionSplits, addition_progress, addition_reward, addition_splits
from trainers.grpo.config import GRPOConfig
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


def demo_policy(splits: AdditionSplits, cache_dir: str | None = None, log=print) -> Path:
    """The tiny addition model, built on the SFT split and warmed up until its sampled accuracy on a
    probe of the RL split reaches the recipe's target."""
    from trainers.grpo.evaluate import accuracy

    demonstrations = [(task.prompt, task.answer) for task in splits.sft]
    probe = splits.train[:PROBE_SIZE]

    def probe_accuracy(model, tokenizer):
        return accuracy(model, tokenizer, probe, addition_reward, greedy=False, samples=2, seed=1)

    return build_or_load_tiny_model(TinyLMRecipe(), demonstrations, probe_accuracy, cache_dir, log)


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

    from trainers.runs.rundir import ensure_writable, write_failure

    torch.set_num_threads(config.grpo.threads)
    out = Path(config.out)
    ensure_writable(out)
    splits = addition_splits(seed=0)
    path = Path(config.model) if config.model else demo_policy(splits, config.cache_dir, log)
    model, tokenizer = load_policy(path)
    trainer = GRPOTrainer(model, tokenizer, splits.train, addition_reward, config.grpo,
                          progress_fn=addition_progress)
    try:
        return _run(config, out, splits, model, tokenizer, trainer, log)
    except OSError as error:
        raise RunDirectoryError(write_failure(out, error, trainer.step_count)) from None


def _run(config: DemoConfig, out: Path, splits, model, tokenizer, trainer, log) -> dict:
    from trainers.runs.atomic import write_text_atomically
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
    """The experiment tracker; `none` still keeps the run directory's own metrics.jsonl. A W&B run
    keeps one id per run directory, so a resume continues it."""
    from trainers.runs.rundir import wandb_run_id
    from trainers.runs.tracking import JsonlTracker, make_tracker

    if config.tracker == "none":
        return JsonlTracker(out)
    run_id = wandb_run_id(out, step) if config.tracker == "wandb" else None
    return make_tracker(config.tracker, out, config=asdict(config), name=out.name, group="demo", run_id=run_id,
                        resumed_at=step)


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
            "config": asdict(config)}
