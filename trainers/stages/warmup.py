"""Training stages of `marl run`: the plan, and stage 1 (warm-up).

Stages run in the order the scenario's `train.stages` lists them; each owns a number of RL steps:

    warmup      SFT on the expert's demonstrations until the format is right (before any RL step),
                then `warmup.rl_steps` low-lr RL steps that print samples with their scores: a check
                of the reward function before the real run
    main        `train.steps` RL steps
    reflection  `reflection.steps` steps on tasks whose pass rate stayed low, retried with the
                failure reason (trainers/stages/reflection.py)
    safety      `safety.steps` steps on an adversarial set (trainers/stages/safety.py)

The global step counter runs across stages, so a checkpoint at any step resumes in the right stage.
"""

from __future__ import annotations

import math
import statistics

from marl.types import Task

SAMPLE_WIDTH = 48  # characters of each observation and message shown by the warm-up check


def stage_plan(train) -> list[tuple[str, int]]:
    """[(stage, RL steps)] in the order of `train.stages` (stages with 0 steps are kept, and skipped)."""
    steps = {"warmup": train.warmup.rl_steps, "main": train.steps, "reflection": train.reflection.steps,
             "safety": train.safety.steps}
    return [(stage, steps[stage]) for stage in train.stages]


def stage_at(plan: list[tuple[str, int]], step: int) -> tuple[str, int]:
    """(stage, step within it) of global step `step` (0-based)."""
    start = 0
    for stage, steps in plan:
        if step < start + steps:
            return stage, step - start
        start += steps
    raise ValueError(f"step {step} is past the plan's {start} steps")


def expert_demonstrations(scenario, tasks: list[Task], limit: int = 512) -> list[tuple[str, str]]:
    """(observation, message) pairs of the scenario's expert on up to `limit` training tasks."""
    return [(observation, message) for _, observation, message in expert_turns(scenario, tasks, limit)]


def expert_turns(scenario, tasks: list[Task], limit: int = 512) -> list[tuple[str, str, str]]:
    """(agent, observation, message) of every turn the scenario's expert plays on up to `limit` tasks."""
    from marl.env import ScenarioEnv
    from marl.policies import get_policy, rollout

    if scenario.spec.expert is None:
        raise ValueError(f"scenario {scenario.spec.name!r} has no expert, so the warm-up has no demonstrations: "
                         "add `expert: module:function`, or drop 'warmup' from train.stages")
    env, expert = ScenarioEnv(scenario, tasks=tasks), get_policy("expert", scenario)
    pairs = []
    for index, task in enumerate(tasks[:limit]):
        result = rollout(env, expert, task=task, seed=index)
        pairs += [(turn["agent"], turn["observation"] or " ", turn["action"]) for turn in result.observations]
    return pairs


def format_compliance(player, tasks: list[Task], seed: int = 0) -> float:
    """Share of sampled episodes whose answer passes the format layer (NaN without format scorers)."""
    from marl.rollout import EpisodeJob

    if not player.scenario.spec.rewards.format:
        return math.nan
    episodes = player.play([EpisodeJob(task, seed + i) for i, task in enumerate(tasks)]).episodes
    scores = []
    for episode in episodes:
        for breakdown in episode.breakdown.values():
            layer = breakdown.layers.get("format")
            if layer is not None:
                scores.append(layer)
    return statistics.fmean(scores) if scores else math.nan


def sft_warmup_stage(trainer, scenario, tasks: list[Task], settings, log=print) -> dict:
    """SFT every trainable model actor on expert demonstrations until format compliance reaches the target.

    Each demonstration's prompt is rendered for the learner exactly as its actor renders the turn
    when acting (trainers/policy/prompts.py: the chat template with the agent's role, or the plain
    observation), and the expert's message is followed by the token the model stops at.
    """
    from trainers.policy.prompts import DEFAULT_STYLE, demonstration
    from trainers.policy.tinylm import TinyLMRecipe, sft_warmup

    probe = tasks[:64]
    before = format_compliance(trainer.player, probe)
    report = {"format_before": before, "sft_steps": 0}
    if settings.sft_max_steps == 0 or math.isnan(before) or before >= settings.format_target:
        log(f"warm-up: format compliance {before:.2f} (target {settings.format_target}); no SFT needed")
        return report
    turns = expert_turns(scenario, tasks)
    recipe = TinyLMRecipe(sft_lr=settings.sft_lr, sft_batch_size=settings.sft_batch_size,
                          sft_max_steps=settings.sft_max_steps, sft_eval_every=25,
                          sft_warmup_steps=min(50, settings.sft_max_steps),
                          sft_target_accuracy=settings.format_target)
    log(f"warm-up: format compliance {before:.2f}; SFT on {len(turns)} expert demonstrations")
    for name in trainer.learners:
        actor = trainer.actors[name]
        demonstrations = [demonstration(actor.tokenizer, observation, message, actor.styles.get(agent, DEFAULT_STYLE))
                          for agent, observation, message in turns]
        result = sft_warmup(actor.model, actor.tokenizer, demonstrations, recipe,
                            lambda model: format_compliance(trainer.player, probe), log)
        report["sft_steps"] += result["steps"]
    report["format_after"] = format_compliance(trainer.player, probe)
    log(f"warm-up: format compliance {report['format_after']:.2f} after {report['sft_steps']} SFT steps")
    return report


def show_samples(trainer, count: int, log=print) -> None:
    """Print the last step's first episodes: every message with the agent's reward and advantage."""
    last = trainer.last_step
    if last is None or count == 0:
        return
    rewards, advantages = last.rewards, last.advantages
    for index, episode in enumerate(last.episodes[:count]):
        said = "  ".join(f"{t.agent}: {_clip(t.observation)!r} -> {_clip(t.text)!r}" for t in episode.turns)
        scores = ", ".join(f"{a} {rewards[index][a]:+.2f} (adv {advantages[a][index]:+.2f})" for a in rewards[index])
        log(f"  sample {index}: {said}\n            reward {scores}")


def _clip(text: str, width: int = SAMPLE_WIDTH) -> str:
    """The last `width` characters of a long observation or message (what was said most recently)."""
    return text if len(text) <= width else "..." + text[-width:]


def run_stage_step(trainer, stage: str, within: int, train_tasks: list[Task], log=print) -> dict:
    """One RL step of `stage`; the metrics say which stage it was."""
    settings = trainer.spec.train
    if stage == "warmup":
        metrics = trainer.step(lr_scale=settings.warmup.rl_lr_scale)
        log(f"warm-up check, step {within + 1}/{settings.warmup.rl_steps}: samples with their scores")
        show_samples(trainer, settings.warmup.samples_shown, log)
    elif stage == "reflection":
        from trainers.stages.reflection import reflection_step

        metrics = reflection_step(trainer, settings.reflection, train_tasks)
    elif stage == "safety":
        from trainers.stages.safety import safety_step

        metrics = safety_step(trainer, settings.safety, train_tasks)
    else:
        metrics = trainer.step()
    names = ("warmup", "main", "reflection", "safety")
    return {**metrics, "train/stage": float(names.index(stage)), "train/stage_name": stage}
