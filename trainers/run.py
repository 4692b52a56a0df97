"""`marl run SCENARIO`: train a team of agents on a scenario end to end.

1. load and validate the scenario (a bad file stops here, before any model is built);
2. build or load the base model (the embedded tiny model, or train.model) and the actors;
3. measure the held-out team success at temperature 0 (`before.json`);
4. run the stages (`trainers.stages.warmup`): warm-up SFT and low-lr check, main RL, reflection, safety,
   logging every step to the tracker (W&B offline by default, always a metrics.jsonl mirror),
   tables of samples and credit every `TABLE_EVERY` steps, checkpoints every train.checkpoint_every
   steps and on Ctrl-C;
5. measure again (`after.json`), write summary.json and report.md with plots.

`--resume` continues from the newest complete checkpoint of the run directory, with no step lost or
repeated. `--init-from RUN` starts from a finished run's policies instead (continual RL:
trainers/continual.py), and the earlier scenario's held-out set is measured before and after too.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

TABLE_EVERY = 10  # steps between sample / credit tables
TABLE_ROWS = 24
WEAK_START_STEPS = 5  # the first steps of a run, over which a start too weak for RL is detected
WEAK_SIGNAL = 0.05  # below this mean train/signal_groups, RL has (almost) nothing to learn from


@dataclass
class RunOptions:
    """What `marl run` was asked to do (scenario settings come from the YAML and --set)."""

    scenario: str
    overrides: list[str] = field(default_factory=list)
    out: str | None = None
    resume: bool = False
    tracker: str | None = None  # default: the scenario's train.tracking.tracker
    cache_dir: str | None = None
    init_from: str | None = None  # a finished run to start from (continual RL, trainers/continual.py)


class RunError(RuntimeError):
    """The run cannot start as asked (the message says why and what to do)."""


def prepare(options: RunOptions, log=print):
    """Scenario, tasks, actors and trainer of a run (validation first, models after)."""
    from marl.scenario.load import load_scenario
    from trainers.judging import resolve_local_judges
    from trainers.policy.actors import build_actors
    from trainers.policy.loading import place_actors, place_autocast, placement
    from trainers.policy.memory import check_model_fits
    from trainers.policy.prompts import directory_context
    from trainers.team.trainer import MultiAgentTrainer

    scenario = load_scenario(options.scenario, options.overrides)
    earlier = None
    if options.init_from is not None:  # the earlier run is checked before any model is built: one line, exit 2
        from trainers.continual import open_earlier_run, without_warmup

        earlier = open_earlier_run(options.init_from, scenario)
        scenario = without_warmup(scenario, log)
    elif scenario.spec.train.continual.replay or scenario.spec.train.continual.kl:
        log("train.continual is ignored: it applies to a run started with --init-from RUN_DIR")
    train_tasks, eval_tasks = scenario.split()
    # a local judge's GGUF model converted, each checked (LocalJudgeError, a ValueError: one line, exit 2)
    scenario = resolve_local_judges(scenario, options.cache_dir, log)
    _probe_judges(scenario)  # a judge endpoint that is down: one line and exit 2 now, not after minutes of retries
    train = scenario.spec.train
    device, dtype = placement(train.device, train.dtype)  # a device or dtype the machine lacks: exit 2 now
    if train.engine.kind == "http":  # a generation server that does not answer: exit 2 before any model is built
        from trainers.engine.http import served_models

        served_models(train.engine.url, train.engine.timeout_s)
    if train.backend == "ray":  # an unreachable cluster or too few resources: exit 2 before any model is built
        from trainers.ray.cluster import check_resources, connect

        connect(train.ray, log=log)
        check_resources(train.ray)
    if earlier is not None:  # the earlier run's policies, tokenizer and adapters
        actors, seats = _earlier_team(earlier, scenario, options, device, dtype, log)
    else:
        base = base_model_dir(scenario, options.cache_dir, log) if _needs_model(scenario) else None
        if base is not None:  # every model-played agent's prompt and answer fit the base's context: exit 2 now
            check_context(scenario, directory_context(base))
            check_model_fits("train.model", base, str(dtype), device)  # ModelTooLarge: one line, exit 2
        actors, seats = build_actors(scenario, base, temperature=train.temperature, top_p=train.top_p,
                                     seed=train.seed, device=device, dtype=dtype)  # onto train.device in train.dtype
    place_actors(actors, device, dtype, train.attention)  # anything not loaded there; the attention kernels
    place_autocast(actors, train.dtype, device, log)  # dtype auto: bfloat16 autocast where the CPU has it
    config = grpo_config(scenario)
    if earlier is not None:  # the KL is to the earlier policy: the reference is the start weights
        import dataclasses

        from trainers.continual import continual_beta

        config = dataclasses.replace(config, beta=continual_beta(scenario))
    selfplay = train.selfplay.enabled if train.selfplay.enabled is not None else scenario.spec.mode != "cooperative"
    trainer = MultiAgentTrainer(scenario, actors, seats, train_tasks, config, selfplay=selfplay, log=log)
    if earlier is not None:
        from trainers.continual import attach

        attach(earlier, trainer, log)
    return scenario, train_tasks, eval_tasks, trainer


def _probe_judges(scenario) -> None:
    """RunError (one line: the endpoint, its error, the fix) when an endpoint the judges use does not answer."""
    from trainers.judging import DeadJudge, probe_judges

    try:
        probe_judges(scenario)
    except DeadJudge as error:
        raise RunError(str(error)) from None


def _earlier_team(earlier, scenario, options: RunOptions, device, dtype, log):
    """(actors, seats) playing an earlier run's policies (trainers/continual.py), each model's context checked
    as the base's is."""
    from trainers.continual import earlier_actors
    from trainers.policy.prompts import directory_context

    def base() -> Path:  # adapters and frozen agents: the earlier run's base model (the same train.model; the
        path = base_model_dir(earlier.scenario, options.cache_dir, log)  # tiny one is built per scenario, cached)
        check_context(scenario, directory_context(path))
        return path

    for directory in earlier.models.values():  # a full model: its own context
        if (directory / "config.json").is_file():
            check_context(scenario, directory_context(directory))
    return earlier_actors(earlier, scenario, base, device=device, dtype=dtype)


def grpo_config(scenario):
    """The GRPOConfig of a scenario: every knob of its `train` section, by name, plus the two derived
    ones (`DERIVED_KNOBS`): steps = every stage's steps, max_new_tokens = the agents' longest max_tokens."""
    from trainers.grpo.config import DERIVED_KNOBS, GRPOConfig
    from trainers.stages.warmup import stage_plan

    train = scenario.spec.train
    derived = {"steps": sum(steps for _, steps in stage_plan(train)),
               "max_new_tokens": max(agent.max_tokens for agent in scenario.spec.agents)}
    assert set(derived) == set(DERIVED_KNOBS), "every derived GRPO knob is derived here"
    return GRPOConfig(**train.grpo_knobs(), **derived)


def _needs_model(scenario) -> bool:
    return any(agent.policy in ("shared", "own") for agent in scenario.spec.agents)


def check_context(scenario, context: int | None) -> None:
    """RunError (one line, exit 2) when an agent the base plays cannot fit max_prompt_tokens + max_tokens
    in the base's `context` (trainers/policy/prompts.py:context_problem)."""
    from trainers.policy.prompts import context_problem

    problem = context_problem(scenario.spec, context)
    if problem is not None:
        raise RunError(problem)


def base_model_dir(scenario, cache_dir: str | None, log=print) -> Path:
    """train.model as a directory: a local Hugging Face directory, a GGUF file or packaged model's name
    converted into the model cache (trainers/policy/gguf.py), or the embedded tiny model.

    A directory given relative resolves against the working directory (as `marl demo --model`
    does), not the scenario's folder: the path a user types is the path used. It is checked before
    anything loads: no config.json, a config or tokenizer that does not load, a tokenizer with
    neither pad nor eos token are each a one-line RunError.

    'tiny' is the embedded default (trainers/policy/tinylm.py): the addition model of the demo when
    the scenario's expert turns are addition problems rendered as the demo's are (the default relay
    scenario), otherwise a tiny model built for the scenario, its tokenizer trained on the scenario's
    texts, warmed up on its expert's turns rendered as each agent's turn is (cached after the first build).
    """
    from marl.addition import ALPHABET, addition_splits

    name = scenario.spec.train.model
    if name != "tiny":
        from judges.model.chat import check_model_dir
        from trainers.policy.gguf import GGUFError, resolve_model_dir

        try:  # a .gguf file or a packaged model's name: converted once into the model cache
            path = resolve_model_dir(name, cache_dir, log)
        except GGUFError as error:
            raise RunError(f"train.model: {error}") from None
        problem = check_model_dir(path)
        if problem is not None:
            raise RunError(f"train.model: {problem} (or use 'tiny'; a relative path is read from the working "
                           f"directory {Path.cwd()})")
        return path
    from trainers.policy.prompts import DEFAULT_STYLE, agent_styles
    from trainers.policy.tinylm import TinyLMRecipe, build_or_load_tiny_model
    from trainers.stages.warmup import expert_turns

    spec, recipe = scenario.spec, TinyLMRecipe()
    check_context(scenario, recipe.max_positions)  # before the build, not after it
    train_tasks, _ = scenario.split()
    styles = agent_styles(spec)
    if spec.expert is not None:
        demonstrations = [(observation, message, styles[agent])
                          for agent, observation, message in expert_turns(scenario, train_tasks)]
    else:  # no expert: what the tasks show is all we know of the scenario's texts
        demonstrations = [(task.prompt, task.answer or "", DEFAULT_STYLE) for task in train_tasks]
    texts = {ch for observation, message, _ in demonstrations for ch in observation + message}
    if texts <= set(ALPHABET) and all(style == DEFAULT_STYLE for style in styles.values()):
        from trainers.demo import demo_policy

        return demo_policy(addition_splits(seed=0), cache_dir, log)
    if spec.expert is None:
        raise RunError(f"train.model 'tiny': scenario {spec.name!r} has no expert, so a tiny model for it cannot "
                       "be warmed up; add `expert: module:function` or set train.model to a Hugging Face model "
                       "directory")
    warmup = spec.train.warmup.resolved()  # the tiny model's SFT settings: a fixed budget of steps
    recipe = TinyLMRecipe(sft_max_steps=max(1, warmup.sft_max_steps), sft_lr=warmup.sft_lr,
                          sft_batch_size=warmup.sft_batch_size, sft_target_accuracy=2.0)
    return build_or_load_tiny_model(recipe, demonstrations, None, cache_dir, log)


def run_scenario(options: RunOptions, log=print) -> dict:
    """Run everything (see the module docstring); returns the summary written to OUT/summary.json.

    A write that fails (a full disk, `ulimit -f`, a read-only file) raises RunError naming the file
    and the intact checkpoint; nothing already written is lost (every rewrite is atomic).
    """
    from trainers.runs.rundir import ensure_writable, failed_writes_stop_the_run

    if options.out and Path(options.out).is_dir():
        ensure_writable(Path(options.out))  # a read-only run directory is refused before any model is built
    if options.resume and options.init_from is None and options.out:  # a continual run resumes from its record
        from dataclasses import replace

        from trainers.continual import recorded_init_from

        options = replace(options, init_from=recorded_init_from(Path(options.out)))
    from judges.model.ledger import JudgeLedger, installed

    # every judge call of the run goes through one ledger: installed before any judge is built (the Ray
    # backend moves it into an actor), its cache opened in the run directory once that is known (_run)
    with installed(JudgeLedger(log=log)):
        try:
            scenario, train_tasks, eval_tasks, trainer = prepare(options, log)
        except BaseException:  # a run that fails to start leaves no Ray cluster behind
            from trainers.ray.cluster import shutdown

            shutdown(only_if_started_here=True)
            raise
        out = Path(options.out or f"runs/{scenario.spec.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        engine = None
        try:
            from trainers.engine.http import attach_http_engine

            engine = attach_http_engine(trainer.actors, scenario.spec.train.engine, out, log)
            with failed_writes_stop_the_run(out, lambda: trainer.step_count, RunError):
                return _run(options, scenario, train_tasks, eval_tasks, trainer, out, log)
        finally:  # Ctrl-C included: the checkpoint is written first, then the Ray workers stop
            _close_backend(trainer, engine)


def _close_backend(trainer, engine=None) -> None:
    """Unload the HTTP engine's adapters; stop the Ray backend's workers and the cluster this run started."""
    if engine is not None:
        engine.close()
    close = getattr(trainer.player, "close", None)
    if close is not None:
        from trainers.ray.cluster import shutdown

        close()
        shutdown(only_if_started_here=True)


def _run(options, scenario, train_tasks, eval_tasks, trainer, out: Path, log) -> dict:
    from trainers.runs.atomic import write_text_atomically
    from trainers.runs.checkpoint import final_checkpoint, load_checkpoint
    from trainers.runs.report import truncate_metrics, truncate_tables
    from trainers.runs.rundir import open_run_directory
    from trainers.team.budgets import log_budget_curve
    from trainers.team.evaluation import evaluate_team
    from trainers.judging import all_masked, all_masked_line, drain_judge_lines, open_run_judge_cache
    from trainers.stages.warmup import sft_warmup_stage, stage_plan

    from trainers import continual

    spec, train = scenario.spec, scenario.spec.train
    resumed = open_run_directory(out, options.resume, log)
    open_run_judge_cache(scenario, out)  # in the run directory: a resume reads back every judgment already paid for
    continual.mark(out, trainer)  # --init-from: recorded before anything can fail, so a resume stays continual
    if any(scorer.kind == "code_tests" for scorer in spec.rewards.outcome + spec.rewards.process):
        from judges.rules.sandbox import describe
        log(describe())  # which barriers contain the model's code on this machine
    plan = stage_plan(train)
    eval_tasks = eval_tasks[:train.eval_tasks] if train.eval_tasks else eval_tasks
    if resumed is not None:
        load_checkpoint(trainer, resumed)
        truncate_metrics(out / "metrics.jsonl", trainer.step_count)
        truncate_tables(out / "tables", trainer.step_count)
        log(f"resumed from {resumed} at step {trainer.step_count}")
    before = _read_json(out / "before.json") if resumed is not None else None
    if before is None and eval_tasks:  # measured before any stage, the warm-up SFT included
        before = evaluate_team(trainer.player, eval_tasks, opponent_actors=trainer.eval_opponents)
        drain_judge_lines(log)
        if all_masked(before):  # nothing to compare the run against, and the judges fail on every episode
            raise RunError(all_masked_line(before, "before training"))
        write_text_atomically(out / "before.json", json.dumps(before))
    if before and "team_success" in before:
        log(f"held-out team success before: {before['team_success']:.3f}{_formed(before)} ({len(eval_tasks)} tasks, "
            "temperature 0)")
    kept = continual.start(out, trainer, log)  # --init-from: the old held-out set before (None otherwise)
    if resumed is None and "warmup" in train.stages:
        report = sft_warmup_stage(trainer, scenario, train_tasks, train.warmup, log)
        if report["sft_steps"]:
            trainer.restart_frozen_copies()  # the KL reference and the first opponent are the warmed-up model
        write_text_atomically(out / "warmup.json", json.dumps(report))
    tracker = _tracker(options, scenario, out, trainer.step_count)
    started = time.perf_counter()
    with tracker:  # an exception or Ctrl-C finishes the W&B run as failed
        _train(trainer, plan, train_tasks, tracker, out, log, eval_tasks)
        checkpoint = final_checkpoint(trainer, out)
        after = evaluate_team(trainer.player, eval_tasks, opponent_actors=trainer.eval_opponents) if eval_tasks else {}
        drain_judge_lines(log)
        if all_masked(after):
            log(all_masked_line(after, "after training"))
        write_text_atomically(out / "after.json", json.dumps(after))
        kept = continual.finish(out, trainer, kept, log)  # and after: the forgetting
        budget_section = log_budget_curve(trainer, eval_tasks, tracker, out, log)  # train.budget_curve; [] by default
        summary = _summary(trainer, before, after, time.perf_counter() - started, plan)
        if kept is not None:
            summary["continual"] = continual.summary_figures(kept, before, after)
            budget_section += "\n" + continual.report_section(kept, spec.name, before, after, len(eval_tasks))
        tracker.summary(summary)
        tracker.log_artifact(checkpoint, name=f"{spec.name}-checkpoint", type="model",
                             metadata={"train/step": trainer.step_count}, aliases=["latest"])
    continual.record_scenario(out, options.scenario, options.overrides, spec)  # what a later --init-from loads
    write_text_atomically(out / "summary.json", json.dumps(summary, indent=2, default=str))
    report = _write_report(out, spec, before, after, trainer, budget_section)
    if after and "team_success" in after:
        log(f"held-out team success after:  {after['team_success']:.3f} "
            f"(change {after['team_success'] - (before or {}).get('team_success', math.nan):+.3f}){_formed(after)}")
    log(f"report: {report}")
    return summary


def _train(trainer, plan, train_tasks, tracker, out: Path, log, eval_tasks=()) -> None:
    """The step loop across stages: log, tables, held-out evaluations (train.eval_every), checkpoints;
    Ctrl-C writes a checkpoint."""
    from trainers.runs.checkpoint import checkpoint_on_interrupt, save_checkpoint
    from trainers.runs.progress import ProgressPrinter
    from trainers.continual import old_evaluation_due, run_step
    from trainers.stages.warmup import stage_at

    from judges.model.ledger import active
    from trainers.judging import JudgeCounts, drain_judge_lines

    total = sum(steps for _, steps in plan)
    progress = ProgressPrinter(total=total, start=trainer.step_count, log=log)
    judge_counts = JudgeCounts(active())  # judge/<name>/calls, cache_hits, failures, retries of each step
    every = trainer.spec.train.checkpoint_every
    signals = _signals_so_far(out, trainer.step_count)  # a resumed run judges its start as an unbroken one
    with checkpoint_on_interrupt(trainer, out, log) as stop_requested:
        while trainer.step_count < total:
            stage, within = stage_at(plan, trainer.step_count)
            metrics = run_step(trainer, stage, within, train_tasks, log)  # a continual run's replay steps too
            metrics.update(_evaluation_due(trainer, eval_tasks, log))
            metrics.update(old_evaluation_due(trainer, metrics, log))  # and its old held-out set
            metrics.update(judge_counts.step())
            drain_judge_lines(log)
            if len(signals) < WEAK_START_STEPS:  # judged at step 5 exactly (a shorter run is not judged)
                signals.append(metrics.get("train/signal_groups", math.nan))
                if len(signals) == WEAK_START_STEPS:
                    metrics.update(_weak_start(signals, trainer.config.group_size, log))
            tracker.log(metrics)
            progress.update(metrics)
            if trainer.step_count % TABLE_EVERY == 0 or trainer.step_count == total:
                _log_tables(trainer, tracker)
            if trainer.step_count % every == 0:
                save_checkpoint(trainer, out)
            if stop_requested():
                raise KeyboardInterrupt


def _signals_so_far(out: Path, step: int) -> list[float]:
    """train/signal_groups of the steps already in metrics.jsonl (a resume), so the weak-start check
    sees the run's first steps whether or not it was interrupted among them."""
    if step == 0:
        return []
    from trainers.runs.report import read_metrics

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


def _formed(figures: dict) -> str:
    """`; well formed 0.95` when the scenario scores the format (evaluate_team's well_formed), else ''."""
    return f"; well formed {figures['well_formed']:.3f}" if "well_formed" in figures else ""


def _evaluation_due(trainer, eval_tasks, log) -> dict:
    """The held-out figures at temperature 0 as `eval/*` (with `eval/step`) when train.eval_every says this
    step is due, else {}. The fixed evaluation set and seeds of before.json and after.json, so the curve
    joins them. Greedy decoding draws nothing from the models' sampling generators, so the training
    steps are those of a run without it (a scripted `random` agent's own generator does advance)."""
    from trainers.team.evaluation import evaluate_team

    every = trainer.spec.train.eval_every
    if not every or not eval_tasks or trainer.step_count % every:
        return {}
    figures = evaluate_team(trainer.player, eval_tasks, opponent_actors=trainer.eval_opponents)
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


def _tracker(options: RunOptions, scenario, out: Path, step: int):
    """The run's tracker (--tracker, else train.tracking); a resume continues the same W&B run."""
    from trainers.runs.tracking import run_tracker

    tracking = scenario.spec.train.tracking
    return run_tracker(options.tracker or tracking.tracker, out, step, project=tracking.project,
                       config=scenario.spec.model_dump(mode="json"), group=scenario.spec.name)


def _read_json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _summary(trainer, before, after, seconds: float, plan) -> dict:
    from judges.model.ledger import active

    ledger = active()
    return {"scenario": trainer.spec.name, "steps": trainer.step_count, "stages": plan, "before": before,
            "after": after, "train_seconds": seconds, "totals": trainer.totals,
            "masked_episodes": trainer.totals["masked_episodes"],
            "judges": ledger.counts() if ledger is not None else {}}  # this session's calls, hits, failures


def _write_report(out: Path, spec, before, after, trainer, budget_section: str = "") -> Path:
    from trainers.runs.report import write_report

    per_agent = spec.mode != "cooperative"  # a cooperative team shares one reward: per-agent rows repeat it
    figures = lambda d: {k: v for k, v in (d or {}).items() if k in ("team_success", "team_reward") or  # noqa: E731
                         (per_agent and k.startswith("agent/"))}
    totals = trainer.totals
    judges = (f"## Judges\n\n{totals['masked_episodes']} of {totals['episodes']} training episodes had a "
              "masked reward (a judge or reward failure: advantage 0, never scored 0); "
              f"{totals['masked_credit']} more had their credit masked because a counterfactual replay's "
              "judgment failed.\n")
    from judges.model.ledger import active, format_counts

    ledger = active()
    counts = ledger.counts() if ledger is not None else {}
    if counts:  # since this session started (a resume counts its own): calls paid for vs answers read back
        judges += "\nJudge calls in this session (cache: judge_cache.sqlite):\n\n" + "".join(
            f"- {line}\n" for line in format_counts(counts).splitlines())
    return write_report(out, title=f"marl run: {spec.name}", before=figures(before), after=figures(after),
                        extra=judges + (f"\n{budget_section}" if budget_section else ""))
