"""Continual RL: `marl run SCENARIO --init-from RUN` starts from a finished run's policies.

The new run's trainable policies are the earlier run's final ones (full models with their tokenizer,
or LoRA adapters on the same base), restored exactly: the first step's logprobs are the earlier
policy's. `train.continual` keeps some of the earlier run:

- `kl`: the run's GRPO beta; the KL reference is the earlier policy itself (the start weights, frozen;
  with LoRA a frozen copy of the earlier adapter on the one base), so the KL is 0 at the first step;
- `replay`: that share of the main stage's steps is played on tasks drawn from the earlier run's
  scenario (its training tasks, its rewards and credit), in place of the new scenario's.

The warm-up stage is skipped: the policy starts trained, and a warm-up would move the reference.
Both held-out sets are measured before and after, so the report shows what was learnt on the new
tasks and what was forgotten on the old ones (forgetting = old before - old after).

    OUT/scenario.json   every run, as it ends: how to load its scenario again (the file and the
                        --set values), its train.model (by content) and whether it trained adapters
    OUT/continual.json  a continual run: the earlier run and the old held-out figures before and after

The earlier run must be finished (summary.json and an intact checkpoint), recorded (scenario.json),
trained from the same train.model, with adapters exactly when this run has them, and played by the
same team (agent names, policies and mode); anything else is one ContinualError line naming the
problem and the directory, raised before any model is built or anything is written.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from common.files import read_user_file, write_text_atomically
from marl.rollout import EpisodePlayer
from marl.scenario.problems import ScenarioError
from marl.scenario.yaml_positions import MAX_BYTES
from trainers.config import ContinualError, continual_beta, resolve_config  # noqa: F401 - re-exported
from trainers.policy.actors import SCRIPTED, actor_key, build_actors
from trainers.policy.adapters import AdapterBaseError, AdapterPolicy, is_adapter_dir, opponent_model
from trainers.records.fingerprint import model_identity
from trainers.records.layout import checkpoint_models
from trainers.records.runfiles import RunFileProblem, figures_problem, read_run_json
from trainers.team.evaluation import evaluate_team

SCENARIO_FILE = "scenario.json"
CONTINUAL_FILE = "continual.json"
RECORD_FIELDS = {"source": str, "overrides": list, "model": str, "lora": bool}  # of scenario.json, as written
_CONTINUAL_FIX = "restore it, or start a new run with --out NEWDIR (pass --init-from RUN again)"


def record_scenario(out: Path, source: str, overrides: list[str], name: str, config) -> None:
    """Write OUT/scenario.json: what a later `--init-from OUT` needs to load this run's scenario again
    (`config`: the run's TrainConfig)."""
    from marl.scenario.load import find_scenario

    path = find_scenario(source).resolve()
    record = {"source": str(path), "source_sha256": _file_sha256(path), "overrides": list(overrides), "name": name,
              "model": model_identity(config.model), "lora": config.lora is not None}
    write_text_atomically(Path(out) / SCENARIO_FILE, json.dumps(record, indent=2) + "\n")


def _file_sha256(path: Path) -> str:
    """sha256 of a scenario file, read as the loader reads it (a regular file of at most its size bound)."""
    return hashlib.sha256(read_user_file(path, max_bytes=MAX_BYTES, expected="a scenario YAML file")).hexdigest()


def recorded_init_from(out: Path) -> str | None:
    """The earlier run a continual run in `out` started from (its continual.json), else None; ContinualError
    (one line) when continual.json cannot be read or names no run (runfiles.py: never a hang or a traceback)."""
    path = Path(out) / CONTINUAL_FILE
    state = read_run_json(path, missing=None, fix=_CONTINUAL_FIX)
    if state is None:
        return None
    if not isinstance(state.get("init_from"), str) or not state["init_from"]:
        raise ContinualError(f"{path}: its init_from is not the directory of a run (not as marl writes it); "
                             f"{_CONTINUAL_FIX}")
    return state["init_from"]


@dataclass
class EarlierRun:
    """A finished run to start from: its directory, final checkpoint, scenario and model directories."""

    run: Path
    checkpoint: Path
    scenario: object  # marl.scenario.load.Scenario
    models: dict[str, Path]  # actor -> model or adapter directory of the checkpoint
    record: dict = field(default_factory=dict)

    def where(self) -> str:
        return f"--init-from {self.run}"


def open_earlier_run(path: str, scenario, config) -> EarlierRun:
    """The finished run in `path`, checked against this run's `scenario` and TrainConfig (resolved with
    continual=True: its KL settings are checked there) (module docstring); ContinualError (one line)
    otherwise. Reads files only: no model is built, nothing is written."""
    from trainers.records.checkpoint import latest_checkpoint

    run = Path(path)
    if not run.is_dir():
        raise ContinualError(f"--init-from {path}: no such directory (pass the directory of a finished marl run)")
    if not (run / "summary.json").is_file() or not (run / "checkpoints").is_dir():
        raise ContinualError(f"--init-from {path}: holds no finished run (no summary.json and checkpoints/, which "
                             "`marl run` writes when it ends); pass the --out directory of a run that finished")
    checkpoint = latest_checkpoint(run)
    if checkpoint is None:
        raise ContinualError(f"--init-from {path}: the run has no intact checkpoint (checkpoints/ holds none that "
                             "passes its manifest); pass a finished run whose checkpoint is intact")
    record = _read_record(run)
    earlier = EarlierRun(run, checkpoint, _earlier_scenario(run, record), checkpoint_models(checkpoint), record)
    _check_model(earlier, config)
    _check_team(earlier, scenario)
    _check_policies(earlier, scenario)
    if config.continual.replay and config.backend.kind == "ray":
        raise ContinualError(f"{earlier.where()}: train.continual.replay is played in this process, not on the Ray "
                             "backend; set train.continual.replay=0 or train.backend=local")
    return earlier


def _read_record(run: Path) -> dict:
    """The earlier run's scenario.json, each field of the type marl writes (runfiles.py reads it: a FIFO, bytes
    that are not JSON, a 5,000-digit integer are one ContinualError line)."""
    path, fix = run / SCENARIO_FILE, "restore it, or pass another run"
    try:
        record = read_run_json(path, fix=fix)
    except FileNotFoundError:
        raise ContinualError(f"--init-from {run}: the run does not record its scenario ({SCENARIO_FILE}, written by "
                             "marl run since continual RL); run it again with this marl") from None
    except RunFileProblem as problem:
        raise ContinualError(f"--init-from {run}: {problem}") from None
    wrong = next((key for key, kind in RECORD_FIELDS.items() if not isinstance(record.get(key), kind)), None)
    if wrong is None and not all(isinstance(value, str) for value in record["overrides"]):
        wrong = "overrides"
    if wrong is not None or not isinstance(record.get("source_sha256", ""), str):
        raise ContinualError(f"--init-from {run}: {path}: its {wrong or 'source_sha256'} is missing or not as marl "
                             f"writes it; {fix}")
    return record


def _earlier_scenario(run: Path, record: dict):
    """The earlier run's scenario, loaded again from its file and --set values."""
    from marl.scenario.load import load_scenario

    recorded = record.get("source_sha256")
    if recorded is not None and Path(record["source"]).is_file() and _file_sha256(record["source"]) != recorded:
        raise ContinualError(f"--init-from {run}: its scenario file {record['source']} changed since the run (its "
                             "tasks and rewards may differ from what it trained on); restore the file, or start from "
                             "a run of the file as it is now")
    try:
        return load_scenario(record["source"], record["overrides"])
    except (ScenarioError, FileNotFoundError, ValueError) as error:
        first = (str(error).strip().splitlines() or [error.__class__.__name__])[0]
        raise ContinualError(f"--init-from {run}: its scenario {record['source']} no longer loads ({first})") from None


def _check_model(earlier: EarlierRun, config) -> None:
    """The earlier policies fit this run: the same train.model (by content), adapters exactly when this run
    trains adapters."""
    train, record = config, earlier.record
    model = model_identity(train.model)
    if model != record["model"]:
        raise ContinualError(f"{earlier.where()}: its policies were trained from train.model={record['model']}, this "
                             f"run's train.model is {model} (an incompatible model); set train.model to the earlier "
                             "run's, or start a new run without --init-from")
    if record["lora"] != (train.lora is not None):
        have = "LoRA adapters" if record["lora"] else "full models"
        want = "LoRA adapters (train.lora is set)" if train.lora is not None else "full models (no train.lora)"
        raise ContinualError(f"{earlier.where()}: the run trained {have}, this run trains {want}; "
                             f"{'set' if record['lora'] else 'remove'} train.lora to match it")


def _check_policies(earlier: EarlierRun, scenario) -> None:
    """A directory in the earlier checkpoint for every trainable model actor of this run."""
    missing = sorted(set(trainable_actor_keys(scenario)) - set(earlier.models))
    if missing:
        held = ", ".join(d.name + "/" for d in earlier.models.values()) or "no model directory"
        raise ContinualError(f"{earlier.where()}: its checkpoint {earlier.checkpoint.name} has no policy for "
                             f"{', '.join(missing)} (it holds {held}); give the agents the policies of the earlier run")


def _check_team(earlier: EarlierRun, scenario) -> None:
    """Continual RL keeps the team and changes the tasks: the same agents, policies and mode."""
    def team(spec):
        return f"{spec.mode}: " + ", ".join(f"{a.name}={a.policy}" for a in spec.agents)

    if team(earlier.scenario.spec) != team(scenario.spec):
        raise ContinualError(f"{earlier.where()}: its team ({team(earlier.scenario.spec)}) is not this run's "
                             f"({team(scenario.spec)}); continual RL keeps the team and changes the tasks")


def _model_played(agent) -> bool:
    return agent.policy in ("shared", "own")  # endpoint and module:function policies hold no local model


def frozen_model_keys(scenario) -> list[str]:
    """The model actors of a scenario that never train (`trainable: false`): they play the base model."""
    trained = set(trainable_actor_keys(scenario))
    return [actor_key(a) for a in scenario.spec.agents if _model_played(a) and actor_key(a) not in trained]


def trainable_actor_keys(scenario) -> list[str]:
    """The actors of a scenario that train a model ('shared', or an agent's name), in agent order."""
    keys = []
    for agent in scenario.spec.agents:
        scripted = agent.policy in SCRIPTED or ":" in agent.policy
        if agent.trainable and not scripted and actor_key(agent) not in keys:
            keys.append(actor_key(agent))
    return keys


def earlier_actors(earlier: EarlierRun, scenario, base_model, grpo, lora, *, device, dtype):
    """(actors, seats) of `scenario` playing the earlier run's policies. Adapters go on the earlier run's base
    model (`base_model()`, the same train.model; checked by fingerprint), and so do frozen model agents,
    which played it in the earlier run too; full models replace it, tokenizer included. ContinualError
    when an adapter does not fit the base."""
    from trainers.policy.tinylm import load_policy

    keys = trainable_actor_keys(scenario)
    adapters = {key: earlier.models[key] for key in keys if is_adapter_dir(earlier.models[key])}
    needs_base = adapters or frozen_model_keys(scenario)
    base = base_model() if needs_base else earlier.models["shared" if "shared" in keys else keys[0]]
    try:
        actors, seats = build_actors(scenario, base, temperature=grpo.temperature, top_p=grpo.top_p,
                                     seed=grpo.seed, lora=lora, adapters=adapters, device=device, dtype=dtype)
    except AdapterBaseError as error:
        raise ContinualError(f"{earlier.where()}: {error}") from None
    for key in keys:
        if key not in adapters and earlier.models[key] != base:
            actors[key].model, actors[key].tokenizer = load_policy(earlier.models[key], device=device, dtype=dtype)
    return actors, seats


def _eval_tasks(scenario) -> list:
    """The held-out tasks the earlier run evaluated (its own train.eval_tasks caps them)."""
    _, held_out = scenario.split()
    limit = resolve_config(scenario).loop.eval_tasks
    return held_out[:limit] if limit else held_out


class Continual:
    """What a continual run keeps of the earlier one, plugged into the step loop: the replay of its tasks
    (`step_plan`), its held-out set (`evaluation`, `start`, `finish`) and continual.json (`mark`)."""

    def __init__(self, earlier: EarlierRun, settings, trainer):
        from trainers.team.trainer import Arena

        self.earlier, self.settings = earlier, settings
        old = earlier.scenario  # played as it is (env, rewards, credit) by this run's actors
        self.player = EpisodePlayer(old, trainer.actors, trainer.seats)
        self.arena = Arena(old.spec, self.player)  # its tasks stay out of this run's difficulty sampler
        self.train_tasks, self.eval_tasks = old.split()[0], _eval_tasks(old)
        self.replayed = False  # whether the last step was a replay step

    def replay_due(self, within: int) -> bool:
        """Whether main-stage step `within` (0-based) replays: every 1/replay steps, exactly the share."""
        share = self.settings.replay
        return bool(self.train_tasks) and math.floor((within + 1) * share) > math.floor(within * share)

    def step_plan(self, trainer, stage: str, within: int):
        """A replay step's StepPlan when one is due (tasks drawn from the earlier scenario, seeded by the
        step, played there), else None: the stage plays its own step."""
        from trainers.team.trainer import StepPlan

        self.replayed = stage == "main" and self.replay_due(within)
        if not self.replayed:
            return None
        rng = random.Random(trainer.grpo.seed * 1_000_003 + trainer.step_count)
        tasks = rng.sample(self.train_tasks, min(trainer.grpo.prompts_per_step, len(self.train_tasks)))
        return StepPlan(tasks=tasks, arena=self.arena)

    def after_step(self, trainer, metrics: dict, log=print) -> dict:
        """continual/replay of the step, and eval/old/* (the earlier scenario's held-out set) on the steps
        train.eval_every evaluates."""
        figures = {"continual/replay": float(self.replayed)}
        if "eval/step" not in metrics or not self.eval_tasks:
            return figures
        old = self.evaluate_old()
        log(f"held-out at step {trainer.step_count}, old tasks ({self.earlier.scenario.spec.name}): team success "
            f"{old['team_success']:.3f}")
        return {**figures, **{f"eval/old/{key}": value for key, value in old.items()}}

    def evaluate_old(self) -> dict:
        """The held-out figures on the earlier scenario's held-out set (temperature 0), {} when it has none."""
        return evaluate_team(self.player, self.eval_tasks) if self.eval_tasks else {}

    def state(self, old_before: dict, old_after: dict | None = None) -> dict:
        """What continual.json holds."""
        return {"init_from": str(self.earlier.run.resolve()), "checkpoint": str(self.earlier.checkpoint.resolve()),
                "earlier_scenario": self.earlier.scenario.spec.name, "replay": self.settings.replay,
                "kl": self.settings.kl, "old_tasks": len(self.eval_tasks), "old_before": old_before,
                "old_after": old_after}

    def mark(self, out: Path) -> None:
        """continual.json as soon as the run directory is open (before any evaluation): a run that stops
        before its first checkpoint still resumes as the continual run it is (`recorded_init_from`)."""
        path = Path(out) / CONTINUAL_FILE
        if not path.is_file():
            write_text_atomically(path, json.dumps(self.state(None), indent=2) + "\n")

    def start(self, out: Path, log=print) -> dict:
        """continual.json at the run's start: the old held-out set measured before any step (kept on a resume)."""
        path = Path(out) / CONTINUAL_FILE
        # only the figures measured before the first step are kept from the file: the rest is this run's
        state = self.state(_recorded_old_before(path))
        if state.get("old_before") is None:  # measured once, before the first step; a resume keeps it
            state["old_before"] = self.evaluate_old()
        write_text_atomically(path, json.dumps(state, indent=2) + "\n")
        if state["old_before"]:
            log(f"held-out team success before, old tasks ({state['earlier_scenario']}): "
                f"{state['old_before']['team_success']:.3f} ({state['old_tasks']} tasks, temperature 0)")
        return state

    def finish(self, out: Path, state: dict, log=print) -> dict:
        """continual.json at the run's end: the old held-out set measured again, and the forgetting said."""
        state = {**state, "old_after": self.evaluate_old()}
        write_text_atomically(Path(out) / CONTINUAL_FILE, json.dumps(state, indent=2) + "\n")
        if state["old_after"]:
            before, after = state["old_before"]["team_success"], state["old_after"]["team_success"]
            log(f"held-out team success after, old tasks ({state['earlier_scenario']}):  {after:.3f} "
                f"(forgetting {before - after:+.3f})")
        return state


def _recorded_old_before(path: Path) -> dict | None:
    """continual.json's old_before (the old held-out figures before the first step), None when not measured
    yet; ContinualError (one line) when the file cannot be read or the figures are not numbers."""
    state = read_run_json(path, missing={}, fix=_CONTINUAL_FIX)
    figures = state.get("old_before")
    if figures is not None and (problem := figures_problem(figures)) is not None:
        raise ContinualError(f"{path}: old_before: {problem} (not as marl writes it); {_CONTINUAL_FIX}")
    return figures


def attach(earlier: EarlierRun, settings, trainer, log=print) -> Continual:
    """The continual run of `earlier` on `trainer`: with LoRA the KL reference becomes a frozen copy of the
    earlier adapter (a full model's reference already is a frozen copy of its start weights, the earlier
    ones); the returned Continual plays the replay steps and the old held-out set."""
    from trainers.grpo.learner import frozen_copy

    trainer.anchor_references(lambda name, model: opponent_model(model, f"earlier_{name}", frozen_copy)
                              if isinstance(model, AdapterPolicy) else None)
    log(f"--init-from {earlier.run}: starting from {earlier.checkpoint.name} of {earlier.scenario.spec.name!r}; "
        f"replay {settings.replay:g} of the main steps, KL {trainer.grpo.beta:g} to the earlier policy")
    return Continual(earlier, settings, trainer)


def report_section(state: dict, new_name: str, before: dict | None, after: dict | None, new_tasks: int) -> str:
    """The report's markdown: both held-out sets before and after, and the forgetting."""
    def row(label, tasks, first, last, note):
        b, a = (first or {}).get("team_success", math.nan), (last or {}).get("team_success", math.nan)
        return f"| {label} | {tasks} | {b:.3f} | {a:.3f} | {a - b:+.3f}{note} |"

    old_b, old_a = state.get("old_before"), state.get("old_after")
    forgetting = (old_b or {}).get("team_success", math.nan) - (old_a or {}).get("team_success", math.nan)
    return "\n".join([
        "## Continual RL", "",
        f"Started from `{state['init_from']}` ({Path(state['checkpoint']).name}, scenario "
        f"{state['earlier_scenario']}); replay {state['replay']:g} of the main steps from its training tasks, "
        f"KL {state['kl']:g} to its policy. Held-out team success at temperature 0:", "",
        "| held-out set | tasks | before | after | change |", "|---|---|---|---|---|",
        row(f"old: {state['earlier_scenario']}", state["old_tasks"], old_b, old_a, f" (forgetting {forgetting:.3f})"),
        row(f"new: {new_name}", new_tasks, before, after, ""), ""])


def summary_figures(state: dict, before: dict | None, after: dict | None) -> dict:
    """summary.json's `continual` entry: both sets before and after, the forgetting, the flat eval/* keys."""
    success = lambda figures: (figures or {}).get("team_success", math.nan)  # noqa: E731
    old_b, old_a, new_b, new_a = success(state["old_before"]), success(state["old_after"]), success(before), \
        success(after)
    return {**{k: state[k] for k in ("init_from", "earlier_scenario", "replay", "kl")},
            "old": {"before": old_b, "after": old_a, "forgetting": old_b - old_a},
            "new": {"before": new_b, "after": new_a, "gain": new_a - new_b},
            "eval/old/team_success": old_a, "eval/new/team_success": new_a}


# -- the run's side (trainers/run.py) --------------------------------------------------------------------
