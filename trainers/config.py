"""`TrainConfig`: everything a training run reads, resolved once from a scenario by `resolve_config`.

The job (`marl run`: trainers/run.py) calls `resolve_config` once, at its edge; the trainer, the stages
and the features below it read the `TrainConfig` they are given, never `scenario.spec.train`. Each
concern owns one written, typed config with a help text per field, defined once:

    grpo        trainers.grpo.config.GRPOConfig: every knob of the GRPO core (the scenario's, by name, plus
                the two derived ones: the steps of every stage, the agents' longest message; with
                train.selfplay.converge: mmd, beta and ref_update_every are the magnet's: magnet_knobs)
    lora        marl.scenario.sections.LoraSpec, or None (full fine-tuning)
    stages      StageConfig: the plan (stage, RL steps) and the warm-up, reflection and safety sections
    selfplay    marl.scenario.sections.SelfPlaySpec when self-play is on (resolved from the scenario's mode
                when the section leaves it unset), else None
    backend     BackendConfig: local or ray (RaySpec), and the rollout engine (EngineSpec)
    tracking    marl.scenario.sections.TrackingSpec
    loop        LoopConfig: checkpoints, held-out evaluations, budgets and the run's guards

The YAML schema (`marl.scenario.spec.TrainSpec`), `--set train.KEY=VALUE` and `marl run --help`
(`settings_help`) all come from those definitions.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

from pydantic import BaseModel

from marl.scenario.sections import (ContinualSpec, EngineSpec, LoraSpec, RaySpec, ReflectionSpec, SafetySpec,
                                    SelfPlaySpec, TrackingSpec, WarmupSpec)
from marl.scenario.spec import TrainSpec
from trainers.grpo.config import DERIVED_KNOBS, GRPOConfig

__all__ = ["BackendConfig", "ContinualError", "LoopConfig", "StageConfig", "TrainConfig", "grpo_config", "resolve_config",
           "continual_beta", "magnet_knobs", "settings_help", "stage_at", "stage_plan"]



@dataclass(frozen=True)
class StageConfig:
    """The stages of a run, in order (help: marl.scenario.sections.WarmupSpec, ReflectionSpec, SafetySpec).

    plan: (stage, RL steps) in the order of `train.stages` (a stage of 0 steps is kept, and skipped).
    """

    plan: tuple[tuple[str, int], ...]
    warmup: WarmupSpec
    reflection: ReflectionSpec
    safety: SafetySpec

    @property
    def names(self) -> tuple[str, ...]:
        """The stages of the plan, in order."""
        return tuple(stage for stage, _ in self.plan)

    @property
    def total_steps(self) -> int:
        """RL steps over every stage (the GRPO knob `steps`)."""
        return sum(steps for _, steps in self.plan)


@dataclass(frozen=True)
class BackendConfig:
    """Where episodes are played and tokens generated (help: train.backend, RaySpec, EngineSpec)."""

    kind: str  # local: this process; ray: Ray rollout workers
    ray: RaySpec
    engine: EngineSpec


@dataclass(frozen=True)
class LoopConfig:
    """The step loop's own settings (each field's help: the same name in marl.scenario.spec.TrainSpec)."""

    checkpoint_every: int
    eval_every: int | None
    eval_tasks: int | None
    budget_curve: tuple[int, ...]
    max_masked_fraction: float
    truncation_warn_fraction: float
    tool_silence_steps: int


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run reads (see the module docstring); made by `resolve_config`."""

    grpo: GRPOConfig
    model: str
    lora: LoraSpec | None
    stages: StageConfig
    selfplay: SelfPlaySpec | None
    backend: BackendConfig
    tracking: TrackingSpec
    loop: LoopConfig
    continual: ContinualSpec | None  # with --init-from only: how much of the earlier run to keep


def stage_plan(train) -> tuple[tuple[str, int], ...]:
    """((stage, RL steps), ...) in the order of a `train` section's `stages`."""
    steps = {"warmup": train.warmup.rl_steps, "main": train.steps, "reflection": train.reflection.steps,
             "safety": train.safety.steps}
    return tuple((stage, steps[stage]) for stage in train.stages)


def stage_at(plan, step: int) -> tuple[str, int]:
    """(stage, step within it) of global step `step` (0-based)."""
    start = 0
    for stage, steps in plan:
        if step < start + steps:
            return stage, step - start
        start += steps
    raise ValueError(f"step {step} is past the plan's {start} steps")


def grpo_config(scenario, plan=None) -> GRPOConfig:
    """The GRPOConfig of a scenario: every knob of its `train` section, by name, plus the two derived
    ones (`DERIVED_KNOBS`): steps = every stage's steps (of `plan`, default the section's), max_new_tokens =
    the agents' longest max_tokens."""
    train = scenario.spec.train
    derived = {"steps": sum(steps for _, steps in (plan if plan is not None else stage_plan(train))),
               "max_new_tokens": max(agent.max_tokens for agent in scenario.spec.agents)}
    assert set(derived) == set(DERIVED_KNOBS), "every derived GRPO knob is derived here"
    return GRPOConfig(**train.grpo_knobs(), **derived)


def resolve_config(scenario, *, grpo: GRPOConfig | None = None, continual: bool = False) -> TrainConfig:
    """The TrainConfig of a scenario, read from its `train` section once.

    `grpo` replaces the knobs the scenario gives (a test's or a bench's own); `continual` says the run
    starts from an earlier one (--init-from): its `train.continual` applies, the warm-up stage is left
    out, and the GRPO beta is the KL to the earlier policy (`continual_beta`: a
    ContinualError, one line, when the KL settings conflict).
    """
    train, spec = scenario.spec.train, scenario.spec
    selfplay = train.selfplay.enabled if train.selfplay.enabled is not None else spec.mode != "cooperative"
    plan = stage_plan(train)
    if continual:  # the policy starts trained, and a warm-up would move the KL reference off the earlier policy
        plan = tuple((stage, steps) for stage, steps in plan if stage != "warmup")
        grpo = grpo if grpo is not None else grpo_config(scenario, plan).with_knobs(beta=continual_beta(train))
    if grpo is None and selfplay and train.selfplay.converge == "mmd":
        grpo = grpo_config(scenario, plan).with_knobs(**magnet_knobs(train.selfplay))
    return TrainConfig(
        grpo=grpo if grpo is not None else grpo_config(scenario, plan), model=train.model, lora=train.lora,
        stages=StageConfig(plan, train.warmup, train.reflection, train.safety),
        selfplay=train.selfplay if selfplay else None,
        backend=BackendConfig(train.backend, train.ray, train.engine), tracking=train.tracking,
        loop=LoopConfig(train.checkpoint_every, train.eval_every, train.eval_tasks, tuple(train.budget_curve),
                        train.max_masked_fraction, train.truncation_warn_fraction, train.tool_silence_steps),
        continual=train.continual if continual else None)


class ContinualError(ValueError):
    """`--init-from` cannot be used as asked (the message names the problem and the directory); raised here
    for settings that conflict with it, and by trainers.continual for the earlier run."""


def continual_beta(train) -> float:
    """The run's GRPO beta with --init-from, from a scenario's `train` section: train.continual.kl, else
    train.beta (both are a KL to the one reference, the earlier policy); ContinualError when both are set
    to different values, or when the reference would move."""
    kl = train.continual.kl
    if kl and train.beta and kl != train.beta:
        raise ContinualError(f"train.continual.kl={kl:g} and train.beta={train.beta:g} both set a KL to the earlier "
                             "policy (with --init-from it is the one reference); set only train.continual.kl")
    if train.selfplay.converge == "mmd":
        raise ContinualError("train.selfplay.converge=mmd moves the KL reference to the current policy, which "
                             "--init-from keeps on the earlier policy; use converge none or average")
    if train.ref_update_every:
        raise ContinualError(f"train.ref_update_every={train.ref_update_every} would move the KL reference away "
                             "from the earlier policy, which --init-from keeps it on; set ref_update_every: 0")
    return kl or train.beta


def magnet_knobs(selfplay) -> dict:
    """The GRPO knobs of `converge: mmd` (magnetic mirror descent, Sokota et al. 2022): the KL term is the pull
    toward the magnet (beta = magnet_weight) and its reference is the magnet, moved to the current policy every
    magnet_every steps (ref_update_every; the learner moves it as it ends a step). A magnet that pulls nothing
    never moves, so magnet_weight 0 is the plain update, with no reference built."""
    weight = selfplay.magnet_weight
    return {"beta": weight, "ref_update_every": selfplay.magnet_every if weight else 0}


def settings_help(model=None, prefix: str = "train.") -> list[tuple[str, str]]:
    """(key, help) of every setting of a scenario's `train` section, sub-sections flattened (`train.lora.r`),
    from the schema's own field descriptions and defaults: what `marl run --help` lists."""
    rows = []
    for name, info in (model or TrainSpec).model_fields.items():
        section = _section_model(info.annotation)
        if section is not None:
            rows += settings_help(section, f"{prefix}{name}.")
            continue
        default = info.get_default(call_default_factory=True)
        rows.append((f"{prefix}{name}", f"{info.description or ''} (default {default!r})".strip()))
    return rows


def _section_model(annotation):
    """The pydantic model of a sub-section field (`LoraSpec | None` -> LoraSpec), else None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None
