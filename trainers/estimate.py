"""`marl estimate SCENARIO`: what a `marl run` would cost, from the plan and a short measured run.

1. build the run exactly as `marl run` would (`trainers.run.prepare`: the scenario with its --set
   overrides, the base model, the actors and the trainer), but write no run directory: the models
   live in memory only, so the probe never touches the user's runs or checkpoints;
2. time the held-out evaluation `marl run` does before training (and again after);
3. run `probe_steps` main-stage trainer steps and record each step's seconds (play, counterfactual
   credit replays, update) and each episode's trajectory length in generated tokens (the summed
   completion mask of every sampled turn of the episode: the tokens the update trains on);
4. project: the stages and their steps (`trainers.config.StageConfig`), episodes per step
   (prompts_per_step x group_size), total episodes, training tokens
   (total steps x prompts_per_step x group_size x mean trajectory tokens x mu), how often each
   distinct training task is drawn, and wall time = total steps x measured seconds per step, plus
   the before/after evaluation.

With `probe_steps >= 2` the first step is left out of the seconds per step: it pays one-off costs
(optimizer state, first allocations) that later steps do not. Every stage is projected at the
main stage's measured seconds per step; the warm-up stage's SFT (before its RL steps) is not
measured and is named in the result instead.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

from trainers.run import prepare
from trainers.team.evaluation import evaluate_team

EVAL_PROBE_TASKS = 128  # evaluation tasks timed; a larger set is projected linearly from these


@dataclass
class Probe:
    """What the short measured run saw."""

    step_seconds: list[float]  # time/step of every probe step, in order
    credit_seconds: list[float]  # time/credit (counterfactual replays) of every probe step
    play_seconds: list[float]
    update_seconds: list[float]
    trajectory_tokens: list[int]  # generated tokens per episode, over every probe step
    eval_seconds: float  # one held-out evaluation pass, projected to the run's evaluation set
    eval_tasks_timed: int
    warmup_excluded: bool = field(init=False)

    def __post_init__(self):
        self.warmup_excluded = len(self.step_seconds) >= 2

    def timed(self, values: list[float]) -> list[float]:
        """The per-step figures that count: every step but the first when there are two or more."""
        return values[1:] if self.warmup_excluded else values


def estimate_run(options, probe_steps: int = 2, log=print) -> dict:
    """Build the run of `options` (a trainers.run.RunOptions), probe it and project the whole run."""
    if probe_steps < 1:
        raise ValueError(f"--probe-steps {probe_steps}: measure at least 1 step (2 or more to leave out warm-up)")
    if probe_steps > 1000:  # a probe is a few steps; the run it projects is the long one
        raise ValueError(f"--probe-steps {str(probe_steps)[:40]}: at most 1,000 (a probe times a few steps to "
                         "project the whole run; use `marl run` to train)")
    scenario, train_tasks, eval_tasks, trainer, _ = prepare(options, log)
    cap = trainer.config.loop.eval_tasks  # the held-out tasks marl run evaluates before and after
    eval_tasks = eval_tasks[:cap] if cap else eval_tasks
    probe = measure_probe(trainer, eval_tasks, probe_steps)
    return project_estimate(scenario.spec.name, trainer.config, len(train_tasks), len(eval_tasks), probe)


def measure_probe(trainer, eval_tasks: list, probe_steps: int) -> Probe:
    """Time one held-out evaluation and `probe_steps` trainer steps; collect trajectory lengths."""
    eval_seconds, timed_tasks = time_evaluation(trainer.player, eval_tasks)
    steps, credit, play, update, tokens = [], [], [], [], []
    for _ in range(probe_steps):
        metrics = trainer.step()
        steps.append(metrics["time/step"])
        credit.append(metrics["time/credit"])
        play.append(metrics["time/play"])
        update.append(metrics["time/update"])
        tokens += trajectory_tokens(trainer.last_step.batch)
    return Probe(steps, credit, play, update, tokens, eval_seconds, timed_tasks)


def time_evaluation(player, eval_tasks: list) -> tuple[float, int]:
    """Seconds of one greedy evaluation pass over `eval_tasks` (timed on at most EVAL_PROBE_TASKS)."""
    if not eval_tasks:
        return 0.0, 0
    sample = eval_tasks[:EVAL_PROBE_TASKS]
    started = time.perf_counter()
    evaluate_team(player, sample)
    return (time.perf_counter() - started) * len(eval_tasks) / len(sample), len(sample)


def trajectory_tokens(batch) -> list[int]:
    """Generated tokens of each episode: the completion mask summed over its sampled turns."""
    counts = []
    for episode in batch.episodes:
        total = 0
        for turn in episode.turns:
            if turn.actor is not None:
                rows = batch.generations[turn.actor][turn.batch]
                total += int(rows.completion_mask[turn.row].sum().item())
        counts.append(total)
    return counts


def project_estimate(name: str, config, n_train_tasks: int, n_eval_tasks: int, probe: Probe) -> dict:
    """The whole run's size, tokens and time from its TrainConfig's plan and a probe's measurements."""
    train, plan = config.grpo, list(config.stages.plan)
    total_steps = config.stages.total_steps
    episodes_per_step = train.prompts_per_step * train.group_size
    mean_tokens = statistics.fmean(probe.trajectory_tokens) if probe.trajectory_tokens else 0.0
    timing = _timing(probe)
    train_seconds = total_steps * timing["seconds_per_step"]
    eval_seconds = 2 * probe.eval_seconds if n_eval_tasks else 0.0
    return {
        "scenario": name, "stages": plan, "total_steps": total_steps,
        "prompts_per_step": train.prompts_per_step, "group_size": train.group_size,
        "episodes_per_step": episodes_per_step, "total_episodes": total_steps * episodes_per_step,
        "mu": train.mu, "mean_trajectory_tokens": mean_tokens,
        "trajectory_tokens_sd": _sd(probe.trajectory_tokens), "episodes_measured": len(probe.trajectory_tokens),
        "training_tokens": total_steps * train.prompts_per_step * train.group_size * mean_tokens * train.mu,
        "train_tasks": n_train_tasks,
        "draws_per_task": total_steps * train.prompts_per_step / n_train_tasks if n_train_tasks else math.nan,
        **timing,
        "train_seconds": train_seconds,
        "train_seconds_range": (total_steps * timing["seconds_per_step_min"],
                                total_steps * timing["seconds_per_step_max"]),
        "eval_tasks": n_eval_tasks, "eval_tasks_timed": probe.eval_tasks_timed, "eval_seconds": eval_seconds,
        "total_seconds": train_seconds + eval_seconds,
        "not_measured": _not_measured(config),
    }


def _timing(probe: Probe) -> dict:
    """Mean, spread and parts of the seconds per step over the timed probe steps."""
    steps = probe.timed(probe.step_seconds)
    mean = statistics.fmean(steps)
    credit = statistics.fmean(probe.timed(probe.credit_seconds))
    return {"probe_steps": len(probe.step_seconds), "timed_steps": len(steps),
            "warmup_excluded": probe.warmup_excluded, "step_seconds": list(probe.step_seconds),
            "seconds_per_step": mean, "seconds_per_step_sd": _sd(steps),
            "seconds_per_step_min": min(steps), "seconds_per_step_max": max(steps),
            "play_seconds_per_step": statistics.fmean(probe.timed(probe.play_seconds)),
            "credit_seconds_per_step": credit, "credit_share": credit / mean if mean > 0 else math.nan,
            "update_seconds_per_step": statistics.fmean(probe.timed(probe.update_seconds))}


def _not_measured(config) -> list[str]:
    """Parts of a run the estimate leaves out or only approximates, in words."""
    notes, stages = [], config.stages.names
    warmup = config.stages.warmup.resolved(pretrained=config.model != "tiny", lora=config.lora is not None)
    if "warmup" in stages and warmup.sft_max_steps > 0:
        notes.append(f"warm-up SFT before the first RL step (runs only while format compliance is below "
                     f"{warmup.format_target}; at most {warmup.sft_max_steps} SFT steps per learner)")
    others = [stage for stage in stages if stage in ("reflection", "safety")]
    if others:
        notes.append(f"{' and '.join(others)} steps are projected at the main stage's seconds per step")
    return notes


def _sd(values) -> float:
    """Sample standard deviation; NaN with fewer than two values (no spread to report)."""
    values = list(values)
    return statistics.stdev(values) if len(values) >= 2 else math.nan
