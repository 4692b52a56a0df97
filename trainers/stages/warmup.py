"""Training stages of `marl run`, and stage 1 (warm-up); the plan is trainers.config.StageConfig.

Stages run in the order the scenario's `train.stages` lists them; each owns a number of RL steps:

    warmup      SFT on the expert's demonstrations until the format is right and each agent succeeds
                often enough among expert teammates (before any RL step, within a time budget), then
                `warmup.rl_steps` low-lr RL steps that print samples with their scores: a check of
                the reward function before the real run
    main        `train.steps` RL steps
    reflection  `reflection.steps` steps on tasks whose pass rate stayed low, retried with the
                failure reason (trainers/stages/reflection.py)
    safety      `safety.steps` steps on an adversarial set (trainers/stages/safety.py)

The global step counter runs across stages, so a checkpoint at any step resumes in the right stage.
"""

from __future__ import annotations

import math
import statistics

from marl.rollout import EpisodeJob, PolicyActor
from marl.types import Task
from trainers.policy.actors import actor_key
from trainers.policy.adapters import AdapterPolicy

SAMPLE_WIDTH = 48  # characters of each observation and message shown by the warm-up check
SAMPLE_CUT = " ... "  # stands for the middle of a longer one, cut out


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
    # the turns are all that is wanted: the episodes are not scored, so no judge is asked about the expert
    env, expert = ScenarioEnv(scenario, tasks=tasks, scorer=_Unscored()), get_policy("expert", scenario)
    pairs = []
    for index, task in enumerate(tasks[:limit]):
        result = rollout(env, expert, task=task, seed=index)
        pairs += [(turn["agent"], turn["observation"] or " ", turn["action"]) for turn in result.observations]
    return pairs


class _Unscored:
    """A scorer that scores nothing (NaN rewards, no breakdown): for episodes played only for their turns."""

    def score_episode(self, task, transcript, tool_calls, agents) -> tuple[dict[str, float], dict]:
        return {agent: float("nan") for agent in agents}, {}


def format_compliance(player, tasks: list[Task], seed: int = 0) -> float:
    """Share of sampled episodes whose answer passes the format layer (NaN without format scorers)."""
    return learner_compliance(player, tasks, {}, seed)[0]


def learner_compliance(player, tasks: list[Task], agents_of: dict[str, list[str]],
                       seed: int = 0) -> tuple[float, dict[str, float]]:
    """(the team's, {learner: its own agents'}) format compliance, from one play of `tasks`.

    A learner is scored on the answers the reward scores that its agents give (a cooperative team's
    answer belongs to its answerer); a learner none of whose agents gives a scored answer (a helper
    in a cooperative team) is scored on its agents' own last messages, by the same format scorers.
    NaN where nothing is scored (no format scorers).
    """
    if not player.scenario.spec.rewards.format:
        return math.nan, {name: math.nan for name in agents_of}
    episodes = player.play([EpisodeJob(task, seed + i) for i, task in enumerate(tasks)]).episodes
    scored = [(agent, layer) for episode in episodes for agent, layer in _scored_answers(player, episode)]
    team = _mean([layer for _, layer in scored])
    own = {name: _mean([layer for agent, layer in scored if agent in agents]) for name, agents in agents_of.items()}
    for name, value in own.items():
        if math.isnan(value):
            own[name] = _mean([layer for episode in episodes for layer in _own_messages(player, episode,
                                                                                        agents_of[name])])
    return team, own


PROBE_EXPERT = "probe:expert"  # the actor the accuracy probe seats opposite (or beside) each agent


def agent_accuracy(player, tasks: list[Task], agents: list[str], seed: int = 0) -> dict[str, float]:
    """agent -> the share of `tasks` on which its own sampled play succeeds with the scenario's expert in
    every other seat: the team's success in a cooperative scenario (its teammates playing their parts
    perfectly), a game not lost against the expert in a competitive one. What RL can build on: an agent
    whose every group fails gives GRPO nothing to compare. NaN without an expert or in a mixed scenario.
    All agents' episodes are played in one batch."""
    from marl.policies import get_policy
    from trainers.team.metrics import success

    scenario = player.scenario
    if scenario.spec.expert is None or scenario.spec.mode == "mixed" or not tasks:
        return {agent: math.nan for agent in agents}
    player.actors[PROBE_EXPERT] = PolicyActor(get_policy("expert", scenario, seed), order=scenario.agent_names)
    try:
        jobs = [EpisodeJob(task, seed + index, seats={a: PROBE_EXPERT for a in scenario.agent_names if a != agent})
                for agent in agents for index, task in enumerate(tasks)]
        episodes = player.play(jobs).episodes
    finally:
        del player.actors[PROBE_EXPERT]
    shares = {}
    for position, agent in enumerate(agents):
        played = episodes[position * len(tasks):(position + 1) * len(tasks)]
        if scenario.spec.mode == "cooperative":
            values = [success(e, "cooperative") for e in played]
        else:
            values = [float(e.rewards[agent] >= -1e-9) for e in played if not math.isnan(e.rewards.get(agent, math.nan))]
        shares[agent] = _mean([v for v in values if not math.isnan(v)])
    return shares


def _scored_answers(player, episode) -> list[tuple[str, float]]:
    """(agent whose answer it is, format layer) of each breakdown of an episode that has one."""
    pairs = []
    for key, breakdown in episode.breakdown.items():
        layer = breakdown.layers.get("format")
        if layer is not None:
            pairs.append((player.scorer.team_answerer(episode.transcript) if key == "team" else key, layer))
    return pairs


def _own_messages(player, episode, agents: list[str]) -> list[float]:
    """The format layer of each of `agents`' last messages in an episode (those who spoke)."""
    task = episode.task or episode.job.task
    return list(player.scorer.own_format_scores(task, episode.transcript, episode.tool_log, agents).values())


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def is_pretrained(scenario, name: str, base_model: str) -> bool:
    """Whether learner `name` starts from pretrained weights: any `base_model` (train.model) directory, or
    an agent's own model directory; only the embedded tiny base ('tiny') is not."""
    on_base = any(agent.policy in ("shared", "own") for agent in scenario.spec.agents if actor_key(agent) == name)
    return base_model != "tiny" or not on_base


def learner_settings(scenario, name: str, model, settings, base_model: str):
    """`settings` (a WarmupSpec) with sft_lr and sft_max_steps resolved for learner `name`: the scenario's
    values, else the defaults of the tiny model or of pretrained weights (LoRA when `model` is an adapter)."""
    return settings.resolved(pretrained=is_pretrained(scenario, name, base_model),
                             lora=isinstance(model, AdapterPolicy))


def sft_recipe(settings, pretrained: bool):
    """The TinyLMRecipe of a resolved WarmupSpec. The tiny model's schedule is exactly what it always was
    (compliance checked every 25 steps, lr ramped over min(50, steps)); pretrained weights are checked
    every 10 steps, since their budget is short, and ramp their lr over its first tenth."""
    from trainers.policy.tinylm import TinyLMRecipe

    steps = settings.sft_max_steps
    every, ramp = (10, max(1, steps // 10)) if pretrained else (25, min(50, steps))
    return TinyLMRecipe(sft_lr=settings.sft_lr, sft_batch_size=settings.sft_batch_size, sft_max_steps=steps,
                        sft_eval_every=every, sft_warmup_steps=ramp, sft_target_accuracy=settings.format_target)


def sft_warmup_stage(trainer, scenario, tasks: list[Task], settings, log=print) -> dict:
    """SFT each learner (trainable model actor) on its agents' expert demonstrations until its own
    agents' format compliance reaches `format_target` and, with an expert, each of its agents succeeds
    at least `accuracy_target` of the time among expert teammates (`agent_accuracy`), within
    `sft_time_budget_s`; a learner that meets both already does not train.

    A learner's lr and step budget come from `learner_settings` (the tiny model's, or gentler ones for
    pretrained weights); with LoRA its model is an AdapterPolicy, so SFT trains its adapter alone.
    Each demonstration's prompt is rendered for the learner exactly as its actor renders the turn when
    acting (trainers/policy/prompts.py: the chat template with the agent's role, or the plain
    observation), and the expert's message is followed by the token the model stops at.
    """
    probe, agents_of = tasks[:settings.probe_tasks], _agents_of(trainer, scenario)
    base_model = trainer.config.model
    plans = {name: learner_settings(scenario, name, trainer.actors[name].model, settings, base_model)
             for name in trainer.learners}
    before, start = learner_compliance(trainer.player, probe, agents_of)
    accuracy = _learner_accuracy(trainer.player, probe, agents_of, settings)
    report = {"format_before": before, "sft_steps": 0, "learners": {
        name: {"format_before": start[name], "accuracy_before": accuracy[name], "sft_steps": 0,
               "sft_lr": plan.sft_lr, "sft_max_steps": plan.sft_max_steps}
        for name, plan in plans.items()}}
    needs = [name for name, plan in plans.items()
             if plan.sft_max_steps > 0 and not _ready(start[name], accuracy[name], settings)]
    # one tiny-model learner prints what it always printed; several learners or pretrained ones add a line each
    each = len(plans) > 1 or any(is_pretrained(scenario, name, base_model) for name in plans)
    shown = _accuracy_text(accuracy, settings)
    if not needs and math.isnan(before):  # nothing scores the format (e.g. negotiation)
        log("warm-up: the scenario has no format scorers (rewards.format), so format compliance is not measured"
            f"{shown}; no SFT")
        _log_learners(report["learners"], settings, each, log)
        return report
    if not needs:
        log(f"warm-up: format compliance {before:.2f} (target {settings.format_target}){shown}; no SFT needed")
        _log_learners(report["learners"], settings, each, log)
        return report
    turns = expert_turns(scenario, tasks)
    log(f"warm-up: format compliance {before:.2f}{shown}; SFT on {len(turns)} expert demonstrations")
    for name in needs:
        result = _train_learner(trainer, name, plans[name], is_pretrained(scenario, name, base_model), turns, probe,
                                agents_of, settings, log)
        report["learners"][name].update(sft_steps=result["steps"], out_of_time=bool(result.get("out_of_time")))
        report["sft_steps"] += result["steps"]
    report["format_after"], end = learner_compliance(trainer.player, probe, agents_of)
    after = _learner_accuracy(trainer.player, probe, agents_of, settings)
    for name in plans:
        report["learners"][name].update(format_after=end[name], accuracy_after=after[name])
    over = f" in all, over {len(needs)} learners" if len(needs) > 1 else ""  # each learner's own line follows
    log(f"warm-up: format compliance {report['format_after']:.2f}{_accuracy_text(after, settings)} after "
        f"{report['sft_steps']} SFT steps{over}")
    _log_learners(report["learners"], settings, each, log)
    return report


def _learner_accuracy(player, probe, agents_of: dict, settings) -> dict[str, dict[str, float]]:
    """learner -> {agent: accuracy among experts} (empty when accuracy_target is 0: not measured)."""
    if settings.accuracy_target <= 0:
        return {name: {} for name in agents_of}
    shares = agent_accuracy(player, probe, [agent for agents in agents_of.values() for agent in agents])
    return {name: {agent: shares[agent] for agent in agents} for name, agents in agents_of.items()}


def _ready(compliance: float, accuracy: dict[str, float], settings) -> bool:
    """Whether a learner may skip (or stop) SFT: its format meets the target (or is not measured) and every
    one of its agents' measured accuracy meets accuracy_target."""
    format_ok = math.isnan(compliance) or compliance >= settings.format_target
    return format_ok and all(math.isnan(v) or v >= settings.accuracy_target for v in accuracy.values())


def _accuracy_text(accuracy: dict[str, dict[str, float]], settings) -> str:
    """', accuracy among experts left 0.31, final 0.25 (target 0.2)', or '' when nothing was measured."""
    shares = {agent: value for agents in accuracy.values() for agent, value in agents.items() if not math.isnan(value)}
    if not shares:
        return ""
    listed = ", ".join(f"{agent} {value:.2f}" for agent, value in shares.items())
    return f", accuracy among experts {listed} (target {settings.accuracy_target})"


def _agents_of(trainer, scenario) -> dict[str, list[str]]:
    """learner -> the agents it speaks for (in the scenario's order)."""
    return {name: [agent.name for agent in scenario.spec.agents if actor_key(agent) == name]
            for name in trainer.learners}


def _train_learner(trainer, name: str, plan, pretrained: bool, turns, probe, agents_of, settings, log) -> dict:
    """SFT one learner on its agents' demonstrations (every agent's when its own have none) until its
    agents' compliance and accuracy reach their targets or its time budget is spent; sft_warmup's report."""
    from trainers.policy.prompts import DEFAULT_STYLE, demonstration
    from trainers.policy.tinylm import ProbeResult, sft_warmup

    actor, agents = trainer.actors[name], agents_of[name]
    own = [turn for turn in turns if turn[0] in agents] or turns
    demonstrations = [demonstration(actor.tokenizer, observation, message, actor.styles.get(agent, DEFAULT_STYLE))
                      for agent, observation, message in own]

    def probe_learner(model) -> ProbeResult:
        compliance = learner_compliance(trainer.player, probe, {name: agents})[1][name]
        accuracy = _learner_accuracy(trainer.player, probe, {name: agents}, settings)
        text = f"format compliance {compliance:.2f}{_accuracy_text(accuracy, settings)}"
        return ProbeResult(compliance, _ready(compliance, accuracy[name], settings), text)

    result = sft_warmup(actor.model, actor.tokenizer, demonstrations, sft_recipe(plan, pretrained), probe_learner, log,
                        time_budget_s=settings.sft_time_budget_s)
    if result.get("out_of_time"):
        log(f"  learner {name}: the warm-up's time budget ({settings.sft_time_budget_s:g} s, "
            "train.warmup.sft_time_budget_s) ran out before its targets were met; RL starts from here")
    return result


def _log_learners(learners: dict, settings, each: bool, log) -> None:
    """One line per learner: compliance before, SFT steps (and lr), compliance after."""
    if not each:
        return
    for name, row in learners.items():
        if not row["sft_steps"]:
            ready = _ready(row["format_before"], row["accuracy_before"], settings)
            why = "meets the targets" if ready else "no SFT steps allowed"
            if math.isnan(row["format_before"]) and not row["accuracy_before"]:
                why = "not measured"
            log(f"  learner {name}: format compliance {row['format_before']:.2f} ({why}); no SFT")
        else:
            log(f"  learner {name}: format compliance {row['format_before']:.2f} -> {row['format_after']:.2f} "
                f"after {row['sft_steps']} SFT steps (lr {row['sft_lr']:g}, at most {row['sft_max_steps']})")


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
    """A long observation or message cut in the middle: its first and its last `width` // 2 characters.

    The front says what the text is (an error observation names the error there: `SyntaxError in the
    tests: ...`) and the end is what was said most recently; the middle is the least telling part.
    """
    if len(text) <= width + len(SAMPLE_CUT):
        return text
    head = width // 2
    return text[:head] + SAMPLE_CUT + text[len(text) - (width - head):]


def warmup_check_step(trainer, settings, within: int, log=print) -> dict:
    """One low-lr RL step of the warm-up check (`settings`: the warm-up section), then samples with their scores."""
    from trainers.team.trainer import StepPlan

    metrics = trainer.step(StepPlan(lr_scale=settings.rl_lr_scale))
    log(f"warm-up check, step {within + 1}/{settings.rl_steps}: samples with their scores")
    show_samples(trainer, settings.samples_shown, log)
    return metrics
