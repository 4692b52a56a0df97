"""The option lists of marl's settings, each defined once (torch-free, so every layer can import them).

The scenario schema (`marl.scenario.spec`) turns these into `Literal` types, the GRPO core
(`trainers.grpo`) and the credit engine check values against them, and the command line names them
in its help. A new choice is added here and nowhere else.
"""

from __future__ import annotations

LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")
"""How the GRPO loss is aggregated over tokens and sequences (TRL 1.16's loss types)."""

SCALE_MODES = ("group", "batch", "none")
"""How advantages are scaled: by the group's std, the batch's std, or not at all."""

LR_SCHEDULES = ("constant", "linear", "cosine")
"""Learning-rate schedules after the linear warm-up (linear and cosine decay to 0 over the run)."""

ABSENT_MODES = ("null_message", "skip_turn", "default_policy", "resample", "replay", "mask")
"""What an agent outside a coalition does in a counterfactual episode (each mode is documented in marl.rollout)."""

SAMPLE_SHARING = ("task", "group", "episode")
"""credit.samples_shared_by: whose replays share fresh samples (group: the task's, reusing the group's own messages)."""

CREDIT_METHODS = ("team", "shapley", "banzhaf", "owen", "myerson", "difference", "least_core")
"""Credit assignment methods of a scenario's `credit.method`."""

CREDIT_ESTIMATORS = ("auto", "exact", "permutation", "antithetic", "tmc", "stratified", "kernel")
"""How coalition values are sampled (`credit.estimator`)."""

TRACKERS = ("wandb", "jsonl", "none")
"""Experiment trackers; metrics.jsonl is written whichever is chosen."""

DEVICES = ("auto", "cpu", "cuda", "mps")
"""Where models and tensors live; auto = cuda when available, else mps when available, else cpu."""

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Model weights' dtype; auto = bfloat16 on a GPU that supports it, float32 otherwise. Logprobs and the
loss are computed in float32 whatever the weights' dtype (as TRL does)."""

ATTENTIONS = ("auto", "eager", "sdpa", "flash_attention_2")
"""The models' attention kernels (transformers' attn_implementation); auto keeps what the model loads with
(sdpa for most architectures). flash_attention_2 needs the flash-attn package and a CUDA device."""

PACKINGS = ("auto", "shared_prompt", "per_row")
"""How the training forward lays out a batch: shared_prompt = each prompt once, its rows after it, under a
block mask (S x L x L) built by marl; per_row = every row its own segment, positions restarting, no mask
passed (a varlen kernel such as flash attention runs it with nothing L x L); auto = per_row under flash
attention, else shared_prompt."""

CHAT_TEMPLATE_MODES = ("auto", "none")
"""How an agent's turn becomes a prompt: auto = the policy's chat template when its tokenizer has one
(role as the system message, observation as the user message), else the plain observation; none = the
plain observation always."""

STAGES = ("warmup", "main", "reflection", "safety")
"""The training stages of `marl run`, in the order they run."""


def one_of(options: tuple[str, ...]) -> str:
    """The options as prose for help texts and messages: 'a, b or c'."""
    return options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"
