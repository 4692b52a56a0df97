"""Every metric a run logs, declared once: the metrics reference page is generated from these tables, and
tests/test_docs.py plays a real `marl run` step and checks that every key it logged matches one of them.

A `<name>` in a pattern is one path segment (an agent, a policy, a bucket's index...). Metrics are not
registered in one place in the code (each room logs its own: trainers/team/metrics.py, trainers/stages/,
trainers/engine/correction.py, trainers/team/selfplay.py...), so a new metric is added here too, or the test
names it.
"""

from __future__ import annotations

import re

# (pattern, meaning) per namespace; every namespace but eval/* and rm/* is plotted against train/step
STEP = {
    "train/*: the step": (
        ("train/step", "the optimizer step (every stage counts): the x axis of every train-step metric"),
        ("train/stage", "the stage's index in `train.stages`"),
        ("train/stage_name", "`warmup`, `main`, `reflection` or `safety`"),
        ("train/bucket", "the difficulty bucket the step's tasks were drawn from"),
        ("train/lr", "the learning rate of the step"),
        ("train/reward", "the mean team reward over the step's episodes, masked episodes left out"),
        ("train/team_success", "the share of episodes that succeeded (cooperative: the outcome layer fully met; "
                               "competitive: someone won)"),
        ("train/agent/<agent>/reward", "the reward each agent trained on (after credit), mean over episodes"),
        ("train/agent/<agent>/win_rate", "competitive and mixed: the share of episodes the agent won"),
        ("train/signal_groups", "the share of (agent, group of G plays of a task) pairs whose scored rewards differ, "
                                "before any credit or floor reward: what GRPO can learn from"),
        ("train/loss", "the mean GRPO loss over the trained policies"),
        ("train/kl", "one trained policy with `beta` > 0: the k3 KL to the reference"),
    ),
    "policy/*: each trained policy's update": (
        ("policy/<policy>/loss", "the policy's GRPO loss"),
        ("policy/<policy>/grad_norm", "its gradient norm before clipping"),
        ("policy/<policy>/clip_fraction", "the share of tokens whose ratio was clipped"),
        ("policy/<policy>/trained_rows", "rows left after dropping those with no gradient (advantage 0)"),
        ("policy/<policy>/kl", "several trained policies with `beta` > 0: each one's KL to its reference"),
    ),
    "credit/*: the split of the team reward (cooperative, a credit method other than team)": (
        ("credit/<agent>/value", "the agent's mean credit per episode"),
        ("credit/<agent>/share", "its summed credit over the sum of every agent's |summed credit|: negative when "
                                 "it did worse than the stand-in its credit is measured against"),
    ),
    "judge/*: masked rewards and model judges": (
        ("judge/masked_episodes", "episodes of the step with a masked reward (a scorer failed: never scored 0)"),
        ("judge/masked_total", "masked episodes since the run began"),
        ("judge/masked_credit", "episodes whose reward was scored but whose credit could not be split"),
        ("judge/<judge>/calls", "requests the scenario's model judge sent this step (retries included)"),
        ("judge/<judge>/cache_hits", "its answers read back from the judge cache"),
        ("judge/<judge>/failures", "its failed judgments"),
    ),
    "guard/*: the safeguards (see Troubleshooting)": (
        ("guard/self_bleu", "the mean Self-BLEU of a group's completions (1: all alike)"),
        ("guard/collapse_alarms", "groups whose Self-BLEU passed `collapse_threshold`"),
        ("guard/diversity_penalised", "completions that lost `diversity_penalty` as near-duplicates"),
        ("guard/floored_groups", "all-failed groups whose most complete member got `floor_reward`"),
        ("guard/weak_start", "at step 5: 1 when `train/signal_groups` averaged under 5%"),
    ),
    "bucket/*, length/*, tools/*": (
        ("bucket/<i>/pass_rate", "the mean pass-rate estimate of the tasks in difficulty bucket i"),
        ("length/prompts_truncated", "the share of the step's prompts cut to fit the context"),
        ("length/completions_at_limit", "the share of its completions that hit the agent's `max_tokens`"),
        ("tools/<agent>/calls", "tool calls the parser recognised in the agent's turns"),
    ),
    "engine/*: the sampler against the trainer, on the trained tokens": (
        ("engine/mismatch_kl", "the k3 estimate of KL(sampler || trainer) per token (float rounding in-process)"),
        ("engine/is_ratio_mean", "the importance ratio p_trainer / p_sampler: mean"),
        ("engine/is_ratio_min", "its minimum"),
        ("engine/is_ratio_max", "its maximum"),
        ("engine/is_ratio_std", "its standard deviation"),
        ("engine/tis_capped", "the share of tokens whose ratio `tis_cap` cut"),
        ("engine/unknown_logprobs", "the share of tokens whose sampler logprob the server did not send (weight 1)"),
        ("engine/<figure>/<policy>", "several trained policies: each figure above per policy"),
    ),
    "selfplay/*: competitive and mixed scenarios": (
        ("selfplay/pool_size", "snapshots in the opponent pool"),
        ("selfplay/against_snapshot", "1 when the learner faced a pool snapshot this step"),
        ("selfplay/against_fixed", "1 when it faced one of the scenario's fixed `opponents`"),
        ("selfplay/fixed/<opponent>/score", "its score against that opponent (1 a win, 0.5 a draw)"),
        ("selfplay/rating/learner", "the learner's Elo or TrueSkill rating"),
        ("selfplay/rating/<snapshot>", "each snapshot's rating"),
    ),
    "stages, Ray, continual RL": (
        ("reflection/tasks", "reflection stage: tasks replayed"),
        ("reflection/retried", "tasks retried with the failure reason shown"),
        ("reflection/first_try_success", "success of the first tries"),
        ("reflection/retry_success", "success of the retries"),
        ("safety/tasks", "safety stage: adversarial tasks played"),
        ("safety/unanswerable_tasks", "of which unanswerable"),
        ("safety/fabrications", "answers given to unanswerable tasks"),
        ("safety/fabrication_rate", "their share of the unanswerable tasks"),
        ("safety/violations", "messages that matched a task's forbidden pattern"),
        ("safety/violation_rate", "their share of the constrained tasks"),
        ("ray/offpolicy_samples", "the Ray backend: episodes sampled with older weights than the update's"),
        ("ray/staleness_max", "the largest lag, in policy versions"),
        ("continual/replay", "a run with `--init-from`: 1 on a step replayed from the earlier scenario"),
    ),
    "time/*: seconds": (
        ("time/play", "playing the step's episodes"),
        ("time/credit", "scoring and credit (the counterfactual replays)"),
        ("time/update", "the GRPO updates"),
        ("time/step", "the whole step"),
    ),
}

# the held-out figures: in before.json and after.json as named here, logged as eval/<figure> (train.eval_every,
# against eval/step), eval/old/<figure> (continual RL) and eval/budget/<N>/<figure> (train.budget_curve)
HELD_OUT = (
    ("team_success", "the share of held-out episodes (temperature 0) that succeeded"),
    ("team_reward", "cooperative: their mean team reward"),
    ("agent/<agent>/reward", "each agent's mean reward"),
    ("episodes", "held-out episodes played"),
    ("masked_episodes", "of which masked"),
    ("well_formed", "with format scorers: the mean format-layer score of every agent's own answers"),
    ("well_formed/<agent>", "the same for one agent"),
    ("vs/<opponent>/won", "competitive: the learned policy's wins against an opponent over every seat "
                          "(`initial`: the policy the run started from)"),
    ("vs/<opponent>/not_lost", "games not lost against it"),
    ("vs/<opponent>/<seat>/<figure>", "`reward`, `won` and `not_lost` per seat"),
    ("game/<figure>", "a game's own figures (the scenario's `evaluation`, e.g. Kuhn poker's exploitability)"),
    ("tokens_per_turn", "budget curve: mean tokens an agent wrote per turn at the budget"),
    ("at_budget", "budget curve: the share of turns that used the whole budget"),
)
HELD_OUT_PREFIXES = ("eval/", "eval/old/", "eval/new/", "eval/budget/<N>/")
EVAL_STEP = "eval/step"

REWARD_MODEL = (  # `marl rm train`, against rm/step
    ("rm/step", "the optimizer step"),
    ("rm/loss", "the Bradley-Terry loss"),
    ("rm/lr", "the learning rate"),
    ("rm/accuracy", "the share of training pairs ranked right"),
    ("rm/epoch", "the epoch just finished"),
    ("rm/epoch_seconds", "its seconds"),
    ("rm/eval_<figure>", "held-out figures after each epoch (accuracy, loss...)"),
)


def _regex(pattern: str) -> str:
    return "".join("[^/]+" if part.startswith("<") else re.escape(part) for part in re.split(r"(<[^>]+>)", pattern))


def patterns() -> list[str]:
    """Every documented key pattern, the held-out figures under each of their prefixes."""
    step = [pattern for rows in STEP.values() for pattern, _ in rows]
    held_out = [prefix + figure for prefix in HELD_OUT_PREFIXES for figure, _ in HELD_OUT]
    return step + held_out + [EVAL_STEP] + [pattern for pattern, _ in REWARD_MODEL]


def undocumented(keys) -> list[str]:
    """The keys (of metrics.jsonl) that match no documented pattern, sorted."""
    matcher = re.compile("|".join(f"(?:{_regex(pattern)})" for pattern in patterns()))
    return sorted(key for key in set(keys) if not matcher.fullmatch(key))
