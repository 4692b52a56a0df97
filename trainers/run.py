"""`marl run SCENARIO`: train a team of agents on a scenario end to end.

1. load and validate the scenario (a bad file stops here, before any model is built);
2. build or load the base model (the embedded tiny model, or train.model) and the actors;
3. measure the held-out team success at temperature 0 (`before.json`);
4. run the stages: warm-up SFT (`trainers.stages.warmup`), then the step loop (`trainers.stages.loop`:
   the warm-up's low-lr check, main RL, reflection, safety, each step the trainer's), logging every step to the tracker (W&B offline by default, always a metrics.jsonl mirror),
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
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from common.chat import check_model_dir
from common.files import write_text_atomically
from judges.model.ledger import JudgeLedger, active, format_counts, installed
from judges.rules.sandbox import describe
from marl.addition import ALPHABET, addition_splits
from trainers.config import resolve_config
from trainers.continual import (attach, earlier_actors, open_earlier_run, record_scenario, recorded_init_from,
                                report_section, summary_figures)
from trainers.engine.http import attach_http_engine, served_models
from trainers.judging import (DeadJudge, all_masked, all_masked_line, drain_judge_lines, open_run_judge_cache,
                              probe_judges, resolve_local_judges)
from trainers.policy.actors import build_actors
from trainers.policy.gguf import GGUFError, resolve_model_dir
from trainers.policy.memory import check_model_fits
from trainers.ray.cluster import check_resources, connect, shutdown
from trainers.records.report import truncate_metrics, truncate_tables, write_report
from trainers.records.rundir import (check_folder_path, ensure_writable, failed_writes_stop_the_run,
                                     open_run_directory)
from trainers.records.runfiles import read_run_figures
from trainers.records.tracking import run_tracker
from trainers.stages.loop import evaluate_held_out, run_steps
from trainers.stages.warmup import expert_turns, sft_warmup_stage
from trainers.team.budgets import log_budget_curve
from trainers.team.evaluation import credit_example, credit_titles


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


class Prepared(NamedTuple):
    """A run ready to train: its scenario, tasks, trainer and the features plugged into its step loop."""

    scenario: object
    train_tasks: list
    eval_tasks: list
    trainer: object
    features: tuple = ()  # e.g. trainers.continual.Continual: a step_plan and an after_step per step


def prepare(options: RunOptions, log=print) -> Prepared:
    """Scenario, settings, tasks, actors and trainer of a run (validation first, models after)."""
    from marl.scenario.load import load_scenario
    from trainers.policy.loading import place_actors, place_autocast, placement
    from trainers.policy.prompts import directory_context
    from trainers.team.trainer import MultiAgentTrainer

    scenario = load_scenario(options.scenario, options.overrides)
    if options.init_from is not None:
        scenario = _without_warmup(scenario, log)
    # the run's settings, resolved once: nothing below reads scenario.spec.train (a KL conflict of
    # --init-from is one line here, before any model is built)
    config = resolve_config(scenario, continual=options.init_from is not None)
    earlier = _open_earlier_run(options, scenario, config, log)
    train_tasks, eval_tasks = scenario.split()
    # a local judge's GGUF model converted, each checked (LocalJudgeError, a ValueError: one line, exit 2)
    scenario = resolve_local_judges(scenario, options.cache_dir, log)
    _probe_judges(scenario)  # a judge endpoint that is down: one line and exit 2 now, not after minutes of retries
    grpo = config.grpo
    device, dtype = placement(grpo.device, grpo.dtype)  # a device or dtype the machine lacks: exit 2 now
    _check_backend(config, log)
    if earlier is not None:  # the earlier run's policies, tokenizer and adapters
        actors, seats = _earlier_team(earlier, scenario, options, config, device, dtype, log)
    else:
        base = base_model_dir(scenario, options.cache_dir, log) if _needs_model(scenario) else None
        if base is not None:  # every model-played agent's prompt and answer fit the base's context: exit 2 now
            check_context(scenario, directory_context(base))
            check_model_fits("train.model", base, str(dtype), device)  # ModelTooLarge: one line, exit 2
        actors, seats = build_actors(scenario, base, temperature=grpo.temperature, top_p=grpo.top_p, seed=grpo.seed,
                                     lora=config.lora, device=device, dtype=dtype)  # on train.device in train.dtype
    place_actors(actors, device, dtype, grpo.attention)  # anything not loaded there; the attention kernels
    place_autocast(actors, grpo.dtype, device, log)  # dtype auto: bfloat16 autocast where the CPU has it
    trainer = MultiAgentTrainer(scenario, actors, seats, train_tasks, config, log=log)
    features = ()
    if earlier is not None:
        features = (attach(earlier, config.continual, trainer, log),)
    return Prepared(scenario, train_tasks, eval_tasks, trainer, features)


def _open_earlier_run(options: RunOptions, scenario, config, log):
    """--init-from's earlier run, checked before any model is built (one line, exit 2), or None."""
    if options.init_from is None:
        if scenario.spec.train.continual.replay or scenario.spec.train.continual.kl:
            log("train.continual is ignored: it applies to a run started with --init-from RUN_DIR")
        return None

    return open_earlier_run(options.init_from, scenario, config)


def _without_warmup(scenario, log):
    """A continual run's scenario: `warmup` left out of train.stages (the policy starts trained, and a
    warm-up would move the KL reference), said in one line when it was there. The scenario itself changes,
    not only the plan, so the run's resume fingerprint and its W&B config say what it runs."""
    train = scenario.spec.train
    if "warmup" not in train.stages:
        return scenario
    log("--init-from: the warm-up stage is skipped (the policy starts trained, and the KL reference is the "
        "earlier policy)")
    train = train.model_copy(update={"stages": [stage for stage in train.stages if stage != "warmup"]})
    return replace(scenario, spec=scenario.spec.model_copy(update={"train": train}))


def _check_backend(config, log) -> None:
    """A generation server that does not answer, an unreachable Ray cluster or one with too few resources:
    one line and exit 2 before any model is built."""
    if config.backend.engine.kind == "http":
        served_models(config.backend.engine.url, config.backend.engine.timeout_s)
    if config.backend.kind == "ray":
        connect(config.backend.ray, log=log)
        check_resources(config.backend.ray)


def _probe_judges(scenario) -> None:
    """RunError (one line: the endpoint, its error, the fix) when an endpoint the judges use does not answer."""
    try:
        probe_judges(scenario)
    except DeadJudge as error:
        raise RunError(str(error)) from None


def _earlier_team(earlier, scenario, options: RunOptions, config, device, dtype, log):
    """(actors, seats) playing an earlier run's policies (trainers/continual.py), each model's context checked
    as the base's is."""
    from trainers.policy.prompts import directory_context

    def base() -> Path:  # adapters and frozen agents: the earlier run's base model (the same train.model; the
        path = base_model_dir(earlier.scenario, options.cache_dir, log)  # tiny one is built per scenario, cached)
        check_context(scenario, directory_context(path))
        return path

    for directory in earlier.models.values():  # a full model: its own context
        if (directory / "config.json").is_file():
            check_context(scenario, directory_context(directory))
    return earlier_actors(earlier, scenario, base, config.grpo, config.lora, device=device, dtype=dtype)


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
    name = scenario.spec.train.model
    if name != "tiny":
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
        from trainers.policy.addition_model import demo_policy

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
    if options.out:  # a file where the folder goes, or a read-only run directory: refused before any model is built
        check_folder_path(Path(options.out))
        if Path(options.out).is_dir():
            ensure_writable(Path(options.out))
    if options.resume and options.init_from is None and options.out:  # a continual run resumes from its record
        options = replace(options, init_from=recorded_init_from(Path(options.out)))

    # every judge call of the run goes through one ledger: installed before any judge is built (the Ray
    # backend moves it into an actor), its cache opened in the run directory once that is known (_run)
    with installed(JudgeLedger(log=log)):
        try:
            prepared = prepare(options, log)
        except BaseException:  # a run that fails to start leaves no Ray cluster behind
            shutdown(only_if_started_here=True)
            raise
        trainer = prepared.trainer
        out = Path(options.out or f"runs/{prepared.scenario.spec.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        engine = None
        try:
            engine = attach_http_engine(trainer.actors, trainer.config.backend.engine, out, log)
            with failed_writes_stop_the_run(out, lambda: trainer.step_count, RunError):
                return _run(options, prepared, out, log)
        finally:  # Ctrl-C included: the checkpoint is written first, then the Ray workers stop
            _close_backend(trainer, engine)


def _close_backend(trainer, engine=None) -> None:
    """Unload the HTTP engine's adapters; stop the Ray backend's workers and the cluster this run started."""
    if engine is not None:
        engine.close()
    close = getattr(trainer.player, "close", None)
    if close is not None:
        close()
        shutdown(only_if_started_here=True)


def _run(options, prepared: Prepared, out: Path, log) -> dict:
    from trainers.records.checkpoint import final_checkpoint, load_checkpoint

    scenario, train_tasks, trainer, features = prepared.scenario, prepared.train_tasks, prepared.trainer, prepared.features
    spec, config = scenario.spec, trainer.config
    continual = next(iter(features), None)  # --init-from: trainers.continual.Continual
    resumed = open_run_directory(out, options.resume, log)
    open_run_judge_cache(scenario, out)  # in the run directory: a resume reads back every judgment already paid for
    if continual is not None:
        continual.mark(out)  # recorded before anything can fail, so a resume stays continual
    if any(scorer.kind == "code_tests" for scorer in spec.rewards.outcome + spec.rewards.process):
        log(describe())  # which barriers contain the model's code on this machine
    eval_tasks = prepared.eval_tasks[:config.loop.eval_tasks] if config.loop.eval_tasks else prepared.eval_tasks
    if resumed is not None:
        load_checkpoint(trainer, resumed)
        truncate_metrics(out / "metrics.jsonl", trainer.step_count)
        truncate_tables(out / "tables", trainer.step_count)
        log(f"resumed from {resumed} at step {trainer.step_count}")
    before = read_run_figures(out / "before.json") if resumed is not None else None  # a FIFO: one line
    if before is None and eval_tasks:  # measured before any stage, the warm-up SFT included
        before = evaluate_held_out(trainer, eval_tasks)
        drain_judge_lines(log)
        if all_masked(before):  # nothing to compare the run against, and the judges fail on every episode
            raise RunError(all_masked_line(before, "before training"))
        write_text_atomically(out / "before.json", json.dumps(before))
    if before and "team_success" in before:
        log(f"held-out team success before: {before['team_success']:.3f}{_formed(before)} ({len(eval_tasks)} tasks, "
            "temperature 0)")
    kept = continual.start(out, log) if continual is not None else None  # the old held-out set before
    if resumed is None and "warmup" in config.stages.names:
        report = sft_warmup_stage(trainer, scenario, train_tasks, config.stages.warmup, log)
        if report["sft_steps"]:
            trainer.restart_frozen_copies()  # the KL reference and the first opponent are the warmed-up model
        write_text_atomically(out / "warmup.json", json.dumps(report))
    tracker = _tracker(options, scenario, config.tracking, out, trainer.step_count)
    started = time.perf_counter()
    with tracker:  # an exception or Ctrl-C finishes the W&B run as failed
        run_steps(trainer, train_tasks, tracker, out, log, eval_tasks, features)
        checkpoint = final_checkpoint(trainer, out)
        after = evaluate_held_out(trainer, eval_tasks) if eval_tasks else {}
        example = credit_example(trainer.player, eval_tasks) if after else ""  # the credit split, in words
        drain_judge_lines(log)
        if all_masked(after):
            log(all_masked_line(after, "after training"))
        write_text_atomically(out / "after.json", json.dumps(after))
        kept = continual.finish(out, kept, log) if continual is not None else None  # and after: the forgetting
        budget_section = log_budget_curve(trainer, eval_tasks, tracker, out, log)  # train.budget_curve; [] by default
        summary = _summary(trainer, before, after, time.perf_counter() - started, list(config.stages.plan))
        if kept is not None:
            summary["continual"] = summary_figures(kept, before, after)
            budget_section += "\n" + report_section(kept, spec.name, before, after, len(eval_tasks))
        tracker.summary(summary)
        tracker.log_artifact(checkpoint, name=f"{spec.name}-checkpoint", type="model",
                             metadata={"train/step": trainer.step_count}, aliases=["latest"])
    record_scenario(out, options.scenario, options.overrides, spec.name, config)  # what a later --init-from loads
    write_text_atomically(out / "summary.json", json.dumps(summary, indent=2, default=str))
    report = _write_report(out, spec, before, after, trainer, "\n".join(p for p in (example, budget_section) if p))
    if after and "team_success" in after:
        log(f"held-out team success after:  {after['team_success']:.3f} "
            f"(change {after['team_success'] - (before or {}).get('team_success', math.nan):+.3f}){_formed(after)}")
    log(f"report: {report}")
    return summary


def _formed(figures: dict) -> str:
    """`; well formed 0.95` when the scenario scores the format (evaluate_team's well_formed), else ''."""
    return f"; well formed {figures['well_formed']:.3f}" if "well_formed" in figures else ""


def _tracker(options: RunOptions, scenario, tracking, out: Path, step: int):
    """The run's tracker (--tracker, else train.tracking); a resume continues the same W&B run."""
    return run_tracker(options.tracker or tracking.tracker, out, step, project=tracking.project,
                       config=scenario.spec.model_dump(mode="json"), group=scenario.spec.name)


def _summary(trainer, before, after, seconds: float, plan) -> dict:
    ledger = active()
    return {"scenario": trainer.spec.name, "steps": trainer.step_count, "stages": plan, "before": before,
            "after": after, "train_seconds": seconds, "totals": trainer.totals,
            "masked_episodes": trainer.totals["masked_episodes"],
            "judges": ledger.counts() if ledger is not None else {}}  # this session's calls, hits, failures


def _write_report(out: Path, spec, before, after, trainer, budget_section: str = "") -> Path:
    per_agent = spec.mode != "cooperative"  # a cooperative team shares one reward: per-agent rows repeat it
    figures = lambda d: {k: v for k, v in (d or {}).items() if k in ("team_success", "team_reward") or  # noqa: E731
                         (per_agent and k.startswith("agent/"))}
    totals = trainer.totals
    judges = (f"## Judges\n\n{totals['masked_episodes']} of {totals['episodes']} training episodes had a "
              "masked reward (a judge or reward failure: advantage 0, never scored 0); "
              f"{totals['masked_credit']} more had their credit masked because a counterfactual replay's "
              "judgment failed.\n")

    ledger = active()
    counts = ledger.counts() if ledger is not None else {}
    if counts:  # since this session started (a resume counts its own): calls paid for vs answers read back
        judges += "\nJudge calls in this session (cache: judge_cache.sqlite):\n\n" + "".join(
            f"- {line}\n" for line in format_counts(counts).splitlines())
    return write_report(out, title=f"marl run: {spec.name}", before=figures(before), after=figures(after),
                        extra=judges + (f"\n{budget_section}" if budget_section else ""),
                        titles=credit_titles(spec.credit))
