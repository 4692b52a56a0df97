"""Stage 3 of `marl run`, reflection: tasks whose pass rate stayed low are retried with the failure reason.

One `reflection_step(trainer, settings, train_tasks)`:

1. select up to `prompts_per_step` training tasks whose pass rate is below `settings.threshold`
   (`select_low_rate_tasks`). The pass rate of a task is the bucket sampler's per-task EMA of its
   groups' team success. A task never played has no rate: it is *unknown*, not failing, so it is
   never taken as "below the threshold". When no task is below it, the lowest-rate observed tasks
   are taken; when no task was observed at all (reflection before any main step), the first
   training tasks are;
2. play every selected task once at temperature 0 (the first try, as held-out evaluation plays it);
3. a first try that failed (the trainer's `success` is 0: in competitive scenarios, an undecided
   episode) gets a short failure reason (`failure_reason`): which scorers failed and
   the answer given. The reference answer is never put in the reason: a retry that is told the
   answer teaches copying, not correcting;
4. one ordinary trainer step on the selected tasks, each observation prefixed with its task's reason
   (tasks whose first try passed train with no prefix). The reward transform multiplies the positive
   rewards of retried episodes by `settings.retry_discount`, so a corrected answer earns close to a
   first-try one, not more.

The reason is text in front of every observation of the retried episode (`REASON_TEMPLATE`), plain
printable text that any model with a subword tokenizer reads: the embedded tiny model (a BPE chat
model, trainers/policy/tinylm.py) as well as a local Hugging Face model or an endpoint policy. The
tiny relay model was warmed up on addition problems alone, so what it makes of the reason is for RL to
teach it.

The step's results update the pass-rate EMAs like any step's, retries included.
"""

from __future__ import annotations

import string

from marl.rollout import EpisodeJob
from marl.types import Task

REASON_TEMPLATE = "retry: last answer {answer} was wrong ({failed}).\n"
"""The failure reason put before every observation of a retried episode; {answer} is the answer given
(clipped, printable), {failed} the kinds of the scorers and penalties that failed, comma separated."""

NO_ANSWER = "(none)"
ANSWER_MAX_CHARS = 24
FIRST_TRY_SEED = 7_777_777  # offset of the first tries' seeds, away from the training steps' seeds


def reflection_step(trainer, settings, train_tasks: list[Task]) -> dict[str, float]:
    """One reflection step (see the module docstring); the trainer step's metrics plus `reflection/*`."""
    from trainers.team.metrics import nanmean, success
    from trainers.team.trainer import StepPlan

    mode = trainer.spec.mode
    tasks = select_low_rate_tasks(task_pass_rates(trainer.buckets), train_tasks, settings.threshold,
                                  trainer.grpo.prompts_per_step)
    first_tries = play_first_tries(trainer, tasks)
    reasons = {}
    for task, episode in zip(tasks, first_tries):
        if success(episode, mode) == 0.0:
            answerer = trainer.player.scorer.team_answerer(episode.transcript)
            reasons[task.id] = failure_reason(episode, answerer)
    metrics = trainer.step(StepPlan(tasks=tasks, prefix=reasons,
                                    reward_transform=retry_discount(settings.retry_discount)))
    retried = [e for e in trainer.last_step.episodes if e.job.prefix]
    return {**metrics, "reflection/tasks": float(len(tasks)),
            "reflection/retried": float(sum(bool(reason) for reason in reasons.values())),
            "reflection/first_try_success": nanmean(success(e, mode) for e in first_tries),
            "reflection/retry_success": nanmean(success(e, mode) for e in retried)}


def task_pass_rates(buckets) -> dict[str, float | None]:
    """Each task's pass-rate EMA in a `DifficultyBuckets` sampler (None: never observed)."""
    state = buckets.state_dict()
    return dict(zip(state["task_ids"], state["pass_ema"]))


def select_low_rate_tasks(rates: dict[str, float | None], tasks: list[Task], threshold: float,
                          limit: int) -> list[Task]:
    """Up to `limit` tasks whose rate is below `threshold`, lowest first (ties in task order).

    Without any: the `limit` lowest-rate observed tasks; without any observed task: the first `limit`
    tasks. Tasks missing from `rates` or with rate None are unknown and never count as below.
    """
    observed = [(rates[task.id], index, task) for index, task in enumerate(tasks) if rates.get(task.id) is not None]
    observed.sort(key=lambda item: (item[0], item[1]))
    below = [task for rate, _, task in observed if rate < threshold]
    if below:
        return below[:limit]
    if observed:
        return [task for _, _, task in observed[:limit]]
    return list(tasks[:limit])


def play_first_tries(trainer, tasks: list[Task]) -> list:
    """One greedy episode per task (the model's most likely attempt), in one lockstep batch."""
    if not tasks:
        return []
    base = trainer.grpo.seed * 1_000_003 + trainer.step_count * 10_007 + FIRST_TRY_SEED
    jobs = [EpisodeJob(task, base + index) for index, task in enumerate(tasks)]
    return trainer.player.play(jobs, greedy=True).episodes


def failure_reason(episode, answer_from: str | None = None) -> str:
    """`REASON_TEMPLATE` filled from a played episode; '' when no scorer or penalty failed.

    The answer is the last message of `answer_from` (default: the last agent to speak), the failed
    kinds are those of scorers that scored below 1 or could not decide, and of applied penalties.
    """
    failed = failed_kinds(episode.breakdown)
    if not failed:
        return ""
    return REASON_TEMPLATE.format(answer=_given_answer(episode.transcript, answer_from), failed=", ".join(failed))


def failed_kinds(breakdown: dict) -> list[str]:
    """Kinds (in order, once each) of the scorers that failed and penalties that applied in a breakdown."""
    kinds = []
    for part in breakdown.values():
        for component in part.components:
            if component["status"] != "ok" or component["score"] < 1.0:
                kinds.append(component["kind"])
        kinds += [penalty["kind"] for penalty in part.penalties if penalty["applied"]]
    return list(dict.fromkeys(kinds))


def retry_discount(discount: float):
    """The reward transform of a reflection step: positive rewards of retried episodes times `discount`."""

    def transform(episode, agent: str, reward: float) -> float:
        if episode.job.prefix and reward > 0:
            return reward * discount
        return reward

    return transform


def _given_answer(transcript: list[dict], answer_from: str | None) -> str:
    """The answer's last message, made one printable line and clipped; `NO_ANSWER` when empty."""
    if answer_from is None and transcript:
        answer_from = transcript[-1]["agent"]
    said = [turn["text"] for turn in transcript if turn["agent"] == answer_from]
    text = " ".join((said[-1] if said else "").split())
    text = "".join(ch if ch in string.printable else "?" for ch in text)
    if len(text) > ANSWER_MAX_CHARS:
        text = text[:ANSWER_MAX_CHARS - 3] + "..."
    return text or NO_ANSWER
