"""The step loop of `marl run`: every stage's steps in order, each logged, checkpointed and watched.

    run_steps(trainer, ...)     until the plan's last step: one step of the stage it is in (the main
                                stage: `trainer.step()`, nothing else), the features' hooks, held-out
                                evaluations (train.eval_every), judge counts, the weak-start check,
                                tables every TABLE_EVERY steps, checkpoints (train.checkpoint_every);
                                Ctrl-C writes a checkpoint
    stage_step(trainer, ...)    one step of a stage: warm-up check, main, reflection or safety

A feature plugs in with two methods (trainers.continual.Continual is one): `step_plan(trainer, stage,
within)` returns a `StepPlan` to play instead of the stage's own step, or None; `after_step(trainer,
metrics, log)` returns metrics of its own. A run without features calls neither.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from judges.model.ledger import active
from marl.options import STAGES
from trainers.config import stage_at
from trainers.judging import JudgeCounts, drain_judge_lines
from trainers.records.progress import ProgressPrinter
from trainers.records.report import read_metrics
from trainers.stages.reflection import reflection_step
from trainers.stages.safety import safety_step
from trainers.stages.warmup import warmup_check_step
from trainers.team.evaluation import evaluate_team

TABLE_EVERY = 10  # steps between sample / credit tables
TABLE_ROWS = 24
WEAK_START_STEPS = 5  # the first steps of a run, over which a start too weak for RL is detected
WEAK_SIGNAL = 0.05  # below this mean train/signal_groups, RL has (almost) nothing to learn from


def run_steps(trainer, train_tasks, tracker, out: Path, log, eval_tasks=(), features=()) -> None:
    """The step loop across stages (module docstring)."""
    from trainers.records.checkpoint import checkpoint_on_interrupt, save_checkpoint

    config = trainer.config
    plan, total = config.stages.plan, config.stages.total_steps
    progress = ProgressPrinter(total=total, start=trainer.step_count, log=log)
    judge_counts = JudgeCounts(active())  # judge/<name>/calls, cache_hits, failures, retries of each step
    signals = _signals_so_far(out, trainer.step_count)  # a resumed run judges its start as an unbroken one
    with checkpoint_on_interrupt(trainer, out, log) as stop_requested:
        while trainer.step_count < total:
            stage, within = stage_at(plan, trainer.step_count)
            metrics = _feature_step(trainer, stage, within, features)
            if metrics is None:
                metrics = stage_step(trainer, stage, within, train_tasks, log)
            metrics.update({"train/stage": float(STAGES.index(stage)), "train/stage_name": stage})  # the schema's order
            metrics.update(_evaluation_due(trainer, eval_tasks, log))
            for feature in features:
                metrics.update(feature.after_step(trainer, metrics, log))
            metrics.update(judge_counts.step())
            drain_judge_lines(log)
            if len(signals) < WEAK_START_STEPS:  # judged at step 5 exactly (a shorter run is not judged)
                signals.append(metrics.get("train/signal_groups", math.nan))
                if len(signals) == WEAK_START_STEPS:
                    metrics.update(_weak_start(signals, trainer.grpo.group_size, log))
            tracker.log(metrics)
            progress.update(metrics)
            if trainer.step_count % TABLE_EVERY == 0 or trainer.step_count == total:
                _log_tables(trainer, tracker)
            if trainer.step_count % config.loop.checkpoint_every == 0:
                save_checkpoint(trainer, out)
            if stop_requested():
                raise KeyboardInterrupt


def _feature_step(trainer, stage: str, within: int, features) -> dict | None:
    """The metrics of the step a feature asks for in place of the stage's own (a continual run's replay),
    or None when none does."""
    for feature in features:
        plan = feature.step_plan(trainer, stage, within)
        if plan is not None:
            return trainer.step(plan)
    return None


def stage_step(trainer, stage: str, within: int, train_tasks: list, log=print) -> dict:
    """One RL step of `stage`: the main stage's is the trainer's own step; the others ask theirs of it."""
    stages = trainer.config.stages
    if stage == "main":
        return trainer.step()
    if stage == "warmup":
        return warmup_check_step(trainer, stages.warmup, within, log)
    if stage == "reflection":
        return reflection_step(trainer, stages.reflection, train_tasks)

    return safety_step(trainer, stages.safety, train_tasks)


def evaluate_held_out(trainer, eval_tasks) -> dict:
    """The held-out figures of the trainer's served team at temperature 0 (with its self-play evaluation
    opponents); with train.selfplay.converge: average the served policy is the mixture of the iterates."""
    with trainer.serving() as player:
        return evaluate_team(player, eval_tasks, opponent_actors=trainer.eval_opponents)


def _signals_so_far(out: Path, step: int) -> list[float]:
    """train/signal_groups of the steps already in metrics.jsonl (a resume), so the weak-start check
    sees the run's first steps whether or not it was interrupted among them."""
    if step == 0:
        return []

    rows = read_metrics(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else []
    return [row.get("train/signal_groups", math.nan) for row in rows if row.get("train/step", 0) <= WEAK_START_STEPS]


def _weak_start(signals: list[float], group_size: int, log) -> dict:
    """`guard/weak_start` (1 or 0) after the run's first steps, and one plain line when the start is too
    weak for RL: almost no group of G plays of a task scored differently for any agent (all right or,
    far more often, all wrong), so group-relative advantages are ~0 and nothing is learnt."""
    finite = [value for value in signals if math.isfinite(value)]
    share = statistics.fmean(finite) if finite else math.nan
    if not finite or share >= WEAK_SIGNAL:
        return {"guard/weak_start": 0.0}
    log(f"weak start: in the first {len(signals)} steps only {share:.0%} of the agents' groups "
        f"of {group_size} plays of a task scored differently (train/signal_groups), so RL has almost nothing to "
        "learn from; warm the model up further (train.warmup.sft_max_steps, with 'warmup' in train.stages), add "
        "partial credit (a process or format reward layer), raise train.group_size or train.temperature, or use "
        "a stronger train.model")
    return {"guard/weak_start": 1.0}


def _evaluation_due(trainer, eval_tasks, log) -> dict:
    """The held-out figures at temperature 0 as `eval/*` (with `eval/step`) when train.eval_every says this
    step is due, else {}. The fixed evaluation set and seeds of before.json and after.json, so the curve
    joins them. Greedy decoding draws nothing from the models' sampling generators, so the training
    steps are those of a run without it (a scripted `random` agent's own generator does advance)."""
    every = trainer.config.loop.eval_every
    if not every or not eval_tasks or trainer.step_count % every:
        return {}
    figures = evaluate_held_out(trainer, eval_tasks)
    games = "".join(f"; {key} {value:.3f}" for key, value in figures.items()
                    if key.startswith("game/") or (key.startswith("vs/") and key.count("/") == 2))
    log(f"held-out at step {trainer.step_count}: team success {figures.get('team_success', math.nan):.3f}{games} "
        f"({len(eval_tasks)} tasks, temperature 0)")
    return {"eval/step": trainer.step_count, **{f"eval/{key}": value for key, value in figures.items()}}


def _log_tables(trainer, tracker) -> None:
    """Samples (observation, message, agent, reward, advantage, credit) and per-episode credit."""
    last = trainer.last_step
    if last is None:
        return
    batch, rewards, advantages, credits = last.batch, last.rewards, last.advantages, last.credits
    samples, credit_rows = [], []
    for index, episode in enumerate(batch.episodes[:TABLE_ROWS]):
        estimate = credits[index] if credits is not None else None
        for turn in episode.turns:
            credit = estimate.values[turn.agent] if estimate is not None else None
            samples.append([trainer.step_count, index, episode.job.task.id, turn.agent, turn.observation, turn.text,
                            episode.rewards.get(turn.agent), rewards[index][turn.agent],
                            advantages[turn.agent][index], credit])
        if estimate is not None:
            for agent in trainer.agents:
                credit_rows.append([trainer.step_count, index, episode.job.task.id, agent, estimate.values[agent],
                                    estimate.stderr.get(agent), episode.team_reward(), estimate.method])
    tracker.log_table("samples", ["step", "episode", "task", "agent", "observation", "message", "env_reward",
                                  "reward", "advantage", "credit"], samples)
    tracker.log_table("judgments", ["step", "episode", "task", "candidate", "layer", "kind", "status", "score",
                                    "rationale"], _judgment_rows(trainer.step_count, batch.episodes[:TABLE_ROWS]))
    if credit_rows:
        tracker.log_table("credit", ["step", "episode", "task", "agent", "credit", "stderr", "team_reward",
                                     "method"], credit_rows)


def _judgment_rows(step: int, episodes) -> list[list]:
    """Every scorer's verdict (rule verifiers and judges) on the logged episodes."""
    rows = []
    for index, episode in enumerate(episodes):
        for candidate, breakdown in episode.breakdown.items():
            for component in breakdown.components:
                rows.append([step, index, episode.job.task.id, candidate, component["layer"], component["kind"],
                             component["status"], component["score"], (component["rationale"] or "")[:200]])
    return rows
