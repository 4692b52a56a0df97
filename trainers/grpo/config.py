"""`GRPOConfig`: every knob of the GRPO core in one typed config (a scenario's `train` section sets it)."""

from __future__ import annotations

from dataclasses import dataclass

from trainers.grpo.objective import LOSS_TYPES, SCALE_MODES

@dataclass
class GRPOConfig:
    """Every knob of the GRPO core, with defaults that train the tiny model on this CPU."""

    steps: int = 30
    """optimizer steps of the run (each plays prompts_per_step x group_size completions)"""
    prompts_per_step: int = 8
    """prompts per step, all drawn from one difficulty bucket"""
    group_size: int = 8
    """G: completions per prompt; advantages are relative within a group"""
    max_new_tokens: int = 8
    """longest completion; rows stop at EOS before that"""
    temperature: float = 1.0
    """sampling temperature; logprobs are taken at logits / temperature, as in TRL"""
    top_p: float = 1.0
    """nucleus sampling mass (1 = off)"""
    lr: float = 5e-5
    """AdamW learning rate (5e-5 suits the tiny model; >= 2e-4 degrades it)"""
    lr_schedule: str = "constant"
    """constant | linear | cosine (decay to 0 over `steps`, after `warmup_steps`)"""
    warmup_steps: int = 0
    """linear lr warm-up steps"""
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    """gradient clipping by global norm"""
    loss_type: str = "dapo"
    """dapo | grpo | dr_grpo | bnpo, with TRL 1.16's aggregation"""
    scale_rewards: str = "group"
    """group | batch | none: how advantages are scaled"""
    beta: float = 0.0
    """KL coefficient to a frozen reference copy (no reference is built when 0)"""
    epsilon_low: float = 0.2
    """lower clip: ratio >= 1 - epsilon_low"""
    epsilon_high: float = 0.2
    """upper clip: ratio <= 1 + epsilon_high (DAPO's clip-higher uses 0.28)"""
    mu: int = 1
    """policy updates per generated batch (old logprobs are the detached current ones when 1)"""
    spike_factor: float = 10.0
    """skip a step whose grad norm exceeds spike_factor x its running median (0 disables)"""
    spike_window: int = 20
    """steps in the running median of the spike guard"""
    spike_on_loss: bool = False
    """also skip a step whose |loss| exceeds spike_factor x its running median (off: see learner.SpikeGuard)"""
    floor_reward: float = 0.05
    """reward given to the most complete member of an all-failed group (0 disables)"""
    diversity_threshold: float = 0.8
    """pairwise BLEU above which a completion counts as a near-duplicate in its group"""
    diversity_penalty: float = 0.0
    """amount subtracted from a near-duplicate's reward (0 disables)"""
    collapse_threshold: float = 0.9
    """group Self-BLEU above which a collapse alarm is counted"""
    buckets: int = 3
    """difficulty buckets; every batch is drawn from one bucket (1 = uniform sampling)"""
    bucket_ema: float = 0.1
    """weight of a new observation in each task's pass-rate EMA"""
    seed: int = 0
    """seeds the sampler, the task order and torch (runs are reproducible for a seed)"""
    threads: int = 1
    """torch intra-op threads (1 is usually fastest on a small shared CPU)"""

    def __post_init__(self):
        checks = [
            (self.loss_type in LOSS_TYPES, f"loss_type={self.loss_type!r} must be one of {LOSS_TYPES}"),
            (self.scale_rewards in SCALE_MODES, f"scale_rewards={self.scale_rewards!r} must be one of {SCALE_MODES}"),
            (self.lr_schedule in ("constant", "linear", "cosine"),
             f"lr_schedule={self.lr_schedule!r} must be constant, linear or cosine"),
            (self.group_size >= 2, f"group_size={self.group_size} must be >= 2 (advantages compare group members)"),
            (self.prompts_per_step >= 1, f"prompts_per_step={self.prompts_per_step} must be >= 1"),
            (self.mu >= 1, f"mu={self.mu} must be >= 1"),
            (self.temperature > 0, f"temperature={self.temperature} must be > 0"),
            (self.threads >= 1, f"threads={self.threads} must be >= 1"),
            (self.beta >= 0, f"beta={self.beta} must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"GRPOConfig: {message}")
