"""The base of every scenario section (`Strict`) and the sub-sections of `train` that are not GRPO knobs.

Tracking, self-play, the three training stages' settings (warm-up, reflection, safety), LoRA, continual RL
and the Ray backend: each owns its fields and defaults, and `marl.scenario.spec.TrainSpec` holds one of
each (spec.py re-exports them, so `from marl.scenario.spec import RaySpec` keeps working).

May import: pydantic and marl.options only (spec.py builds on this module, never the other way).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WrapValidator, field_validator, model_validator

from marl.options import TRACKERS


def at_most(limit: int, why: str) -> WrapValidator:
    """An upper bound whose problem says the bound and why, for `Annotated[int, at_most(...)]`: pydantic's own
    `le=` says only "less than or equal to N", and a count past its bound runs for ever or fills the memory.

    A number is compared before pydantic converts it too, so 1.0e+30 for an int is this problem, not
    pydantic's "unable to parse" (a float that large is no integer it converts)."""
    def too_large(value) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and value > limit

    def check(value, handler):
        if too_large(value) or too_large(value := handler(value)):
            raise ValueError(f"at most {limit:,} ({why})")
        return value

    return WrapValidator(check)


# upper bounds of the counts and sizes a scenario sets: each far above any sound value, far below one that
# would run for months or exhaust a machine (train.steps: 1e15 validated, then trained without end)
MAX_STEPS = 1_000_000
MAX_BATCH = 100_000
MAX_THREADS = 1024
MAX_SEED = 2**32 - 1
Steps = Annotated[int, at_most(MAX_STEPS, "a step plays episodes and updates the model: a million steps already take "
                                          "months, and an interval past the run's length is never reached")]
BatchSize = Annotated[int, at_most(MAX_BATCH, "what one step plays or trains on is held in memory at once")]
Threads = Annotated[int, at_most(MAX_THREADS, "more threads than any machine has cores")]
Mebibytes = Annotated[int, at_most(1 << 20, "1,048,576 MiB is a tebibyte of memory")]
Seed = Annotated[int, Field(ge=0), at_most(MAX_SEED, "a seed is a 32-bit number; torch and numpy generators are "
                                                     "seeded from it and numbers derived from it")]


class Strict(BaseModel):
    """Base of every section: unknown keys are rejected and specs are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # .inf/.nan are never settings


class TrackingSpec(Strict):
    """Experiment tracking."""

    tracker: Literal[TRACKERS] = Field("wandb", description="wandb (offline unless WANDB_API_KEY is set), jsonl or "
                                         "none; metrics.jsonl is always written")
    project: str = Field("marl", description="the W&B project the run is logged under")


CONVERGE_MODES = ("none", "mmd", "average")


class SelfPlaySpec(Strict):
    """Self-play of competitive scenarios: the learner against its past snapshots, and how it converges."""

    enabled: bool | None = Field(None, description="default: on for competitive and mixed scenarios")
    pool_size: Annotated[int, at_most(1024, "each snapshot is a copy of the model, kept in memory")] = Field(
        8, ge=1, description="past snapshots kept in the opponent pool")
    snapshot_every: Steps = Field(10, ge=1, description="steps between snapshots added to the pool")
    strategy: Literal["latest", "uniform", "prioritised"] = Field(
        "prioritised", description="which snapshot the learner faces: the latest, one drawn uniformly, or one drawn "
                                   "by how often it beats the learner (prioritised)")
    self_play_fraction: float = Field(0.5, ge=0, le=1, description="share of steps the learner plays itself "
                                                                   "(the rest: a sampled snapshot)")
    ratings: Literal["elo", "trueskill"] = Field("elo", description="the rating system of the pool's snapshots "
                                                                    "and the learner (selfplay/rating/*)")
    fixed_opponents: dict[str, float] = Field(
        default_factory=dict, description="share of steps the learner plays each of the scenario's fixed "
                                          "`opponents` (by name); the other steps follow self_play_fraction")
    converge: Literal[CONVERGE_MODES] = Field(
        "none", description="how self-play converges in a zero-sum game: none (the last iterate, which may cycle), "
                            "mmd (magnetic mirror descent: a KL pull toward a magnet, the policy as it was at the "
                            "last reset, reset every magnet_every steps; the last iterate converges) or average "
                            "(the served policy is the mixture of every iterate's snapshot, one drawn per game)")
    magnet_every: Steps = Field(10, ge=0, description="mmd: steps between resets of the magnet to the current policy "
                                                      "(0: never, the magnet stays the start)")
    magnet_weight: float = Field(0.1, ge=0, description="mmd: coefficient of the KL pull toward the magnet (the "
                                                        "GRPO beta; 0: no pull, the plain update)")
    average_every: Steps = Field(1, ge=1, description="average: steps between the snapshots the served mixture "
                                 "draws from, each weighted by the steps it stood for (1: every iterate, exact); "
                                 "each is a copy of the weights kept in memory and in the checkpoint")

    @field_validator("fixed_opponents")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        if any(not 0 < share <= 1 for share in value.values()) or sum(value.values()) > 1 + 1e-9:
            raise ValueError(f"each share must lie in (0, 1] and together at most 1, got {value}")
        return value


WARMUP_DEFAULTS = {"tiny": (1e-3, 300), "pretrained": (1e-5, 50), "pretrained_lora": (1e-4, 50)}
"""(sft_lr, sft_max_steps) a learner's warm-up SFT uses when the scenario leaves them unset: the embedded
tiny model learns from scratch at 1e-3; pretrained weights (any train.model directory, or an agent's
own model directory) are fine-tuned gently, LoRA adapters at a larger lr since only they move."""


class WarmupSpec(Strict):
    """Stage 1: SFT on expert demonstrations until the format is right and each agent succeeds often enough
    among expert teammates, within a time budget; then a short low-lr RL check."""

    sft_max_steps: Steps | None = Field(None, ge=0, description="most SFT steps of each learner (0: no SFT; default: "
                                      "300 for the tiny model, 50 for pretrained weights)")
    sft_lr: float | None = Field(None, gt=0, description="SFT AdamW lr (default: 1e-3 for the tiny model; for "
                                 "pretrained weights 1e-5, or 1e-4 with train.lora, which trains the adapters only)")
    sft_batch_size: BatchSize = Field(32, ge=1, description="demonstrations per SFT step")
    format_target: float = Field(0.9, ge=0, le=1, description="a learner whose agents' sampled answers pass the "
                                 "format layer this often skips SFT; SFT stops once they do")
    accuracy_target: float = Field(0.2, ge=0, le=1, description="with an expert: SFT also goes on until each of "
                                   "a learner's agents, sampled among expert teammates (or against the expert), "
                                   "succeeds this often (0: the format alone decides)")
    sft_time_budget_s: float = Field(300.0, gt=0, description="most seconds of warm-up SFT per learner")
    probe_tasks: BatchSize = Field(64, ge=1, description="training tasks the compliance and accuracy probes play "
                             "(before SFT and every few SFT steps, once per agent); fewer for a large model on a CPU")
    rl_steps: Steps = Field(3, ge=0, description="low-lr RL steps that print samples with their scores")
    rl_lr_scale: float = Field(0.1, gt=0, le=1, description="the warm-up check's RL steps train at train.lr x this")
    samples_shown: BatchSize = Field(4, ge=0, description="episodes the warm-up check prints after each of its steps")

    def resolved(self, *, pretrained: bool = False, lora: bool = False) -> WarmupSpec:
        """This section with sft_lr and sft_max_steps set: the scenario's values, else WARMUP_DEFAULTS for
        the tiny model or for pretrained weights (with LoRA: adapters only)."""
        kind = "tiny" if not pretrained else "pretrained_lora" if lora else "pretrained"
        lr, steps = WARMUP_DEFAULTS[kind]
        return self.model_copy(update={"sft_lr": lr if self.sft_lr is None else self.sft_lr,
                                       "sft_max_steps": steps if self.sft_max_steps is None else self.sft_max_steps})


class ReflectionSpec(Strict):
    """Stage 3: tasks whose reward stayed low are retried with the failure reason in the prompt."""

    steps: Steps = Field(20, ge=0, description="RL steps of the reflection stage")
    threshold: float = Field(0.5, ge=0, le=1, description="tasks whose pass rate is below this are retried")
    retry_discount: float = Field(0.9, gt=0, le=1, description="a corrected answer earns this x a first-try one")


class SafetySpec(Strict):
    """Stage 4: adversarial tasks with penalties for fabrication and ignored constraints."""

    steps: Steps = Field(20, ge=0, description="RL steps of the safety stage")
    generator: str | None = Field(None, description="'module:function' of adversarial tasks; default: the "
                                                    "built-in perturbations of the training tasks")
    fabrication_penalty: float = Field(0.5, ge=0, description="subtracted when an unanswerable task gets an "
                                       "answer that is neither empty nor a refusal (fabricated)")
    constraint_penalty: float = Field(0.5, ge=0, description="subtracted when a message matches the task's "
                                      "`forbidden` regex")


class LoraSpec(Strict):
    """LoRA adapters (peft) instead of full fine-tuning: one frozen base, an adapter per trained policy."""

    r: int = Field(16, ge=1, le=4096, description="adapter rank")
    alpha: float = Field(32.0, gt=0, description="scaling numerator: the update is scaled by alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")
    target_modules: list[str] | str = Field(
        "all-linear", description="module names (or suffixes) that get adapters, or 'all-linear' "
                                  "(every linear layer but the output head, as peft defines it)")


class ContinualSpec(Strict):
    """Continual RL (`marl run SCENARIO --init-from RUN`): how much of the earlier run to keep."""

    replay: float = Field(0.0, ge=0, le=1, description="share of the main stage's steps played on tasks replayed "
                                                        "from the earlier run's scenario (its training tasks; 0: none)")
    kl: float = Field(0.0, ge=0, description="coefficient of the k3 KL to the earlier run's policy (the run's GRPO "
                                             "beta, its reference being that policy; 0: no KL term)")


class RaySpec(Strict):
    """The Ray backend (`train.backend: ray`): where the cluster is and how rollout work is spread on it."""

    address: str | None = Field(None, description="absent: start a local cluster; 'auto' (the running one) or "
                                                  "'ray://HOST:PORT' to connect to an existing cluster")
    rollout_workers: int = Field(2, ge=1, le=1024, description="Ray actors that play episodes and their replays")
    num_cpus: float = Field(1.0, ge=0, description="CPUs each rollout worker reserves")
    num_gpus: float = Field(0.0, ge=0, description="GPUs each rollout worker reserves (fractions share one)")
    max_staleness: Steps = Field(0, ge=0, description="policy versions a sample may lag the learner by: 0 is "
                                                    "on-policy (a stale sample is an error); k broadcasts weights "
                                                    "every k+1 versions and logs the off-policy samples")
    max_retries: int = Field(2, ge=0, le=100, description="times a dead worker's episodes are replayed on a new "
                                                         "worker before the step fails")
    object_store_mb: Mebibytes = Field(512, ge=64, description="object store of a local cluster started by marl (MiB)")


class EngineSpec(Strict):
    """The rollout engine (trainers/engine): where a model actor's tokens are generated."""

    kind: Literal["inprocess", "http"] = Field("inprocess", description="inprocess: the KV-cache sampler on the "
                                               "live weights; http: an OpenAI-compatible generation server "
                                               "(vLLM, or marl serve --enable-lora) serving train.model, each "
                                               "trained LoRA adapter published to it under a versioned name")
    url: str | None = Field(None, description="http: the server's base URL, e.g. http://127.0.0.1:8000/v1")
    adapters_dir: str | None = Field(None, description="http: where published adapters are written for the "
                                     "server to read (a path it can see; default: the run's engine_adapters/)")
    timeout_s: float = Field(300.0, gt=0, le=86400, description="http: seconds one request may take")

    @model_validator(mode="after")
    def _http_needs_a_url(self) -> EngineSpec:
        if self.kind == "http" and not self.url:
            raise ValueError("engine.kind http needs engine.url, the server's base URL (e.g. "
                             "http://127.0.0.1:8000/v1 after `marl serve MODEL --enable-lora --port 8000`)")
        return self
