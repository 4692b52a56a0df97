"""The sampler/trainer mismatch, and the truncated importance-sampling (TIS) weight that corrects for it.

A rollout engine's logprobs come from its own forward: another process (the HTTP engine), other
kernels or precision, or older weights (Ray with max_staleness > 0). The policy gradient is taken
under the trainer's forward, so a token sampled with probability p_s that the trainer gives p_t
carries the weight r = p_t / p_s; truncated at `cap` (Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training"; verl's rollout_is) the weight's variance stays bounded:

    w = min(exp(logp_trainer - logp_sampler), cap)          detached: a weight, not a path for gradients

A sampler logprob the server did not send (NaN) gets w = 1. `mismatch_metrics` says how far apart the
two are, every step: the k3 estimate of KL(sampler || trainer) per token, E_s[r - 1 - log r] >= 0,
and the spread of r. When the two agree, r = 1 everywhere and the correction changes nothing.
"""

from __future__ import annotations

import torch


def tis_weights(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """min(p_trainer / p_sampler, cap) per token, detached; 1 where the sampler's logprob is unknown (NaN)."""
    log_ratio = trainer_logprobs.detach().float() - sampler_logprobs.float()
    log_ratio = torch.where(torch.isnan(sampler_logprobs), torch.zeros_like(log_ratio), log_ratio)
    return torch.exp(log_ratio).clamp(max=cap)


def mismatch_metrics(pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], cap: float) -> dict[str, float]:
    """engine/* figures of (trainer logprobs, sampler logprobs, token weights) over a batch's parts.

    mismatch_kl: the k3 estimate of KL(sampler || trainer) per token; is_ratio_mean, _min, _max, _std:
    the importance ratio p_trainer / p_sampler; tis_capped: the share of tokens whose ratio the cap cut
    (with cap > 0); unknown_logprobs: the share of tokens whose sampler logprob was not sent.
    """
    trainer = torch.cat([t.detach().float().flatten() for t, _, _ in pairs])
    sampler = torch.cat([s.float().flatten() for _, s, _ in pairs])
    weights = torch.cat([w.float().flatten() for _, _, w in pairs])
    counted = weights > 0
    known = counted & ~torch.isnan(sampler)
    if not bool(counted.any()):
        return {}
    metrics = {"engine/unknown_logprobs": float(weights[counted & ~known].sum() / weights[counted].sum())}
    if not bool(known.any()):
        return metrics
    log_ratio, w = (trainer - sampler)[known], weights[known]
    ratio = torch.exp(log_ratio)
    mean = float((w * ratio).sum() / w.sum())
    metrics.update({
        "engine/mismatch_kl": float((w * (ratio - 1 - log_ratio)).sum() / w.sum()),
        "engine/is_ratio_mean": mean, "engine/is_ratio_min": float(ratio.min()),
        "engine/is_ratio_max": float(ratio.max()),
        "engine/is_ratio_std": float(((w * (ratio - mean) ** 2).sum() / w.sum()).sqrt())})
    if cap > 0:
        metrics["engine/tis_capped"] = float(w[ratio > cap].sum() / w.sum())
    return metrics
