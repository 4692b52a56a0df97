"""The GRPO objective: group advantages and the clipped policy loss, as pure tensor functions.

1. `group_advantages(rewards, group_size, scale)`: (r - group mean) / (Bessel std + 1e-4).
2. `policy_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, ...)`: token-level ratio,
   clipped surrogate, k3 KL to a reference multiplied by the ratio, and the four aggregations.
   Both are numerically identical to TRL 1.16's GRPOTrainer (checked against TRL's own
   `_compute_loss` in tests/trainers/grpo/test_grpo_trl_equivalence.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from marl.options import LOSS_TYPES, SCALE_MODES  # noqa: F401 - the option lists, defined once (re-exported)
STD_EPS = 1e-4  # TRL adds 1e-4 (not 1e-8) to the std before dividing


def _nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Bessel-corrected standard deviation ignoring NaNs (NaN where fewer than two values)."""
    keep = dict(dim=dim, keepdim=True) if dim is not None else {}
    mean = torch.nanmean(x, **keep)
    var = torch.nanmean((x - mean) ** 2, **keep)
    count = (~torch.isnan(x)).sum(**keep)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(var, float("nan")))
    std = torch.sqrt(var * correction)
    return std.squeeze(dim) if dim is not None else std.reshape(())


def group_advantages(rewards, group_size: int, scale: str = "group") -> torch.Tensor:
    """Group-relative advantages for rewards grouped contiguously, G = group_size per prompt.

    `scale="group"`: (r - group mean) / (group std + 1e-4); `"batch"`: (r - group mean) /
    (batch std + 1e-4); `"none"`: r - group mean. Std is Bessel-corrected. A NaN reward (a masked
    judge or reward failure) is left out of every statistic and gets advantage 0, as in TRL 1.16.
    """
    rewards = torch.as_tensor(rewards)
    if not torch.is_floating_point(rewards):
        rewards = rewards.to(torch.float32)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"group_size={group_size} must be >= 1 and divide len(rewards)={rewards.numel()} "
            "(rewards are grouped contiguously, G per prompt)"
        )
    if scale not in SCALE_MODES:
        raise ValueError(f"scale={scale!r} is not one of {SCALE_MODES}")
    grouped = rewards.view(-1, group_size)
    group_mean = torch.nanmean(grouped, dim=1).repeat_interleave(group_size)
    advantages = rewards - group_mean
    if scale == "group":
        std = _nanstd(grouped, dim=1).repeat_interleave(group_size) if group_size > 1 else torch.zeros_like(rewards)
        advantages = advantages / (std + STD_EPS)
    elif scale == "batch":
        std = _nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = advantages / (std + STD_EPS)
    return torch.nan_to_num(advantages, nan=0.0)


def zero_std_group_fraction(rewards, group_size: int) -> float:
    """Fraction of groups whose (non-NaN) rewards are all equal: they carry no GRPO signal."""
    grouped = torch.as_tensor(rewards, dtype=torch.float64).view(-1, group_size)
    if group_size == 1:
        return 1.0
    std = torch.nan_to_num(_nanstd(grouped, dim=1), nan=0.0)
    return torch.isclose(std, torch.zeros_like(std)).double().mean().item()


@dataclass
class LossStats:
    """Detached diagnostics of one `policy_loss` call (masked token means over the batch)."""

    kl: float | None
    clip_fraction: float
    low_clip_fraction: float
    high_clip_fraction: float


def _check_loss_inputs(logprobs, old_logprobs, ref_logprobs, advantages, mask, beta):
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    shape = tuple(logprobs.shape)
    named = {"old_logprobs": old_logprobs, "mask": mask}
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("ref_logprobs is required when beta != 0 (pass the reference model's logprobs)")
        named["ref_logprobs"] = ref_logprobs
    for name, tensor in named.items():
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but logprobs has shape {shape}; both must be (B, T)")
    if tuple(advantages.shape) not in ((shape[0],), (shape[0], 1)):
        raise ValueError(f"advantages must be (B,) = ({shape[0]},), got shape {tuple(advantages.shape)}")
    for name, tensor in (("logprobs", logprobs), ("advantages", advantages)):
        if not torch.is_floating_point(tensor):
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")


def _aggregate(per_token_loss, mask, loss_type, max_completion_length, row_weights):
    """Reduce (B, T) token losses to one scalar exactly as TRL 1.16 does for one optimizer step.

    With row_weights w, row r counts as w_r identical rows (numerators and normalisers alike).
    """
    if row_weights is None:
        row_weights = torch.ones(per_token_loss.size(0), dtype=per_token_loss.dtype)
    row_weights = row_weights.to(per_token_loss.dtype)
    row_sums = (per_token_loss * mask).sum(-1)
    if loss_type == "grpo":
        return (row_weights * row_sums / mask.sum(-1).clamp(min=1.0)).sum() / row_weights.sum()
    if loss_type == "dr_grpo":
        length = max_completion_length if max_completion_length is not None else mask.size(1)
        return (row_weights * row_sums).sum() / (row_weights.sum() * length)
    # dapo: TRL normalises by the completion tokens of the whole generation batch; for one optimizer
    # step over that batch this is mask.sum(), which is also bnpo's normaliser.
    return (row_weights * row_sums).sum() / (row_weights * mask.sum(-1)).sum().clamp(min=1.0)


def loss_normaliser(mask: torch.Tensor, loss_type: str, row_weights: torch.Tensor | None = None) -> float:
    """What `_aggregate` divides the summed token losses by, up to a factor equal for every sub-batch.

    grpo and dr_grpo: the (weighted) number of rows; dapo and bnpo: the (weighted) number of completion
    tokens. A micro-batch's loss times its normaliser over the batch's is its share of the batch loss.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r} is not one of {LOSS_TYPES}")
    weights = torch.ones(mask.size(0), device=mask.device) if row_weights is None else row_weights.float()
    if loss_type in ("grpo", "dr_grpo"):
        return float(weights.sum())
    return float((weights * mask.float().sum(-1)).sum().clamp(min=1.0))


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "dapo",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    max_completion_length: int | None = None,
    row_weights: torch.Tensor | None = None,
    sampler_logprobs: torch.Tensor | None = None,
    tis_cap: float = 0.0,
) -> tuple[torch.Tensor, LossStats]:
    """Clipped GRPO surrogate with optional k3 KL, aggregated as TRL 1.16 for one optimizer step.

    logprobs, old_logprobs, ref_logprobs, mask: (B, T); advantages: (B,). `old_logprobs=None` means
    on-policy (the detached current logprobs, ratio 1). `ref_logprobs` is only read when beta != 0.
    Per token: ratio = exp(logp - old), loss = -min(ratio*A, clip(ratio, 1-eps_low, 1+eps_high)*A)
    + beta * ratio * (exp(ref - logp) - (ref - logp) - 1). Aggregation: `dapo`/`bnpo` sum/mask.sum(),
    `grpo` mean of per-sequence means, `dr_grpo` sum/(B * max_completion_length, default T).
    `row_weights` (B,), optional: row r stands for w_r identical rows (the trainer merges duplicate
    completions); the result equals the loss of the batch with every row repeated w_r times.
    `sampler_logprobs` (B, T) with `tis_cap` > 0: the samples came from another forward than the
    trainer's, and each token's surrogate is weighed by min(exp(old - sampler), tis_cap)
    (trainers/engine/correction.py: truncated importance sampling; the KL term is not weighed).
    Returns the scalar loss and detached `LossStats`.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r} is not one of {LOSS_TYPES}")
    _check_loss_inputs(logprobs, old_logprobs, ref_logprobs, advantages, mask, beta)
    mask = mask.to(logprobs.dtype)
    old_logprobs = logprobs.detach() if old_logprobs is None else old_logprobs
    advantages = advantages.reshape(-1, 1).to(logprobs.dtype)

    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    if sampler_logprobs is not None and tis_cap > 0:
        from trainers.engine.correction import tis_weights

        per_token_loss = per_token_loss * tis_weights(old_logprobs, sampler_logprobs, tis_cap)
    per_token_kl = None
    if beta != 0.0:
        delta = ref_logprobs - logprobs
        per_token_kl = (torch.exp(delta) - delta - 1) * ratio
        per_token_loss = per_token_loss + beta * per_token_kl
    if row_weights is not None and tuple(row_weights.shape) != (logprobs.size(0),):
        raise ValueError(f"row_weights must be (B,) = ({logprobs.size(0)},), got shape {tuple(row_weights.shape)}")
    loss = _aggregate(per_token_loss, mask, loss_type, max_completion_length, row_weights)
    stats_mask = mask if row_weights is None else mask * row_weights.to(mask.dtype)[:, None]
    return loss, _loss_stats(ratio.detach(), advantages, stats_mask, per_token_kl, epsilon_low, epsilon_high)


def _loss_stats(ratio, advantages, mask, per_token_kl, epsilon_low, epsilon_high) -> LossStats:
    def mean(x):  # a token mean; a boolean x (clipped or not) counts as 0/1 in the mask's dtype
        return masked_mean(x.to(mask.dtype), mask).item()

    low = (ratio < 1 - epsilon_low) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    kl = mean(per_token_kl.detach()) if per_token_kl is not None else None
    return LossStats(kl=kl, clip_fraction=mean(low | high), low_clip_fraction=mean(low), high_clip_fraction=mean(high))


# --------------------------------------------------------------------------------------------------


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is 1: over `dim`, or over everything when None.

    An empty mask gives 0 (its sum is clamped to 1), never NaN. The one masked mean of the trainers:
    token means of the loss stats and the entropy, and each row's mean logprob (the floor reward's
    partial progress).
    """
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)
