"""One trainable policy's side of GRPO: optimizer, schedule, KL reference, spike guard and the update.

`PolicyLearner.update(completions, advantages)` runs `mu` clipped-surrogate updates of the model on a
batch of sampled completions whose advantages are already known. The single-policy `GRPOTrainer`
owns one learner; the multi-agent trainer owns one per trainable policy. Both therefore share one
implementation of the exact batch compaction, the loss (`trainers.grpo.policy_loss`) and the guards.
"""

from __future__ import annotations

import copy
import warnings

import torch

from trainers.sampling import Completions, completion_logprobs, select_rows


class PolicyLearner:
    """Optimizer, lr schedule, optional frozen reference and spike guard of one policy (see module doc)."""

    def __init__(self, model, config):
        from trainers.grpo import SpikeGuard, lr_lambda

        self.model, self.config = model, config
        self.reference = frozen_copy(model) if config.beta != 0 else None
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=config.adam_betas,
                                           eps=config.adam_eps, weight_decay=config.weight_decay,
                                           fused=True)  # one kernel for all tensors: ~3x faster than the loop
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(config))
        self.spikes = SpikeGuard(config.spike_factor, config.spike_window, watch_loss=config.spike_on_loss)
        self.skipped_spikes = 0

    def update(self, completions: Completions, advantages: torch.Tensor, *, lr_scale: float = 1.0) -> dict[str, float]:
        """`mu` clipped-surrogate updates on the batch; returns loss, grad norm, KL and clip stats.

        `lr_scale` multiplies this step's scheduled learning rate (the warm-up stage's low-lr check).
        """
        from trainers.grpo import policy_loss

        cfg = self.config
        for group, scheduled in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = scheduled * lr_scale  # the scheduler's next step restores the schedule
        compact = self.compact_batch(completions, advantages)
        if compact is None:  # every advantage is 0: no gradient, but keep the optimizer's clock
            self.optimizer.zero_grad(set_to_none=False)
            self._optimizer_step(skip=False)
            return {"loss": 0.0, "grad_norm": 0.0, "kl": None, "clip_fraction": 0.0, "trained_rows": 0}
        rows, row_adv, weights, scale = compact
        old = None if cfg.mu == 1 else _no_grad_logprobs(self.model, rows, cfg.temperature)
        ref = None if self.reference is None else _no_grad_logprobs(self.reference, rows, cfg.temperature)
        for _ in range(cfg.mu):
            logprobs = completion_logprobs(self.model, rows, cfg.temperature)
            loss, stats = policy_loss(logprobs, old, ref, row_adv, rows.completion_mask, loss_type=cfg.loss_type,
                                      epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high, beta=cfg.beta,
                                      max_completion_length=cfg.max_new_tokens, row_weights=weights)
            loss = loss * scale
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm, foreach=True).item()
            self._optimizer_step(skip=self.spikes.is_spike(loss.item(), grad_norm))
        return {"loss": loss.item(), "grad_norm": grad_norm, "kl": stats.kl, "clip_fraction": stats.clip_fraction,
                "trained_rows": rows.completion_ids.size(0)}

    def compact_batch(self, completions: Completions, advantages: torch.Tensor):
        """The rows worth a forward and backward pass, with weights that keep the loss exact.

        Two exact savings: (1) with beta = 0 a row whose advantage is 0 has zero loss and gradient, so
        it is dropped; (2) rows with the same prompt, the same completion tokens and the same advantage
        have identical losses, so each is run once with its multiplicity as row weight (short answers
        repeat a lot within a group). `scale` rescales the compact loss to the full batch's normaliser.
        Returns (rows, advantages, weights, scale), or None when no row carries a gradient.
        """
        lengths = completions.completion_mask.sum(-1).tolist()
        first_of: dict[tuple, tuple[int, int]] = {}
        counts: list[int] = []
        for row, (prompt, tokens, adv, length) in enumerate(zip(
                completions.prompt_index.tolist(), completions.completion_ids.tolist(), advantages.tolist(), lengths)):
            if adv == 0 and self.config.beta == 0:
                continue
            key = (prompt, tuple(tokens[:length]), adv)
            if key in first_of:
                counts[first_of[key][1]] += 1
            else:
                first_of[key] = (row, len(counts))
                counts.append(1)
        if not counts:
            return None
        keep = torch.tensor([row for row, _ in first_of.values()])
        weights = torch.tensor(counts, dtype=torch.float32)
        rows = select_rows(completions, keep)
        if self.config.loss_type in ("dapo", "bnpo"):
            kept = (weights * rows.completion_mask.sum(-1)).sum().item()
            scale = kept / max(1, sum(lengths))
        else:  # grpo and dr_grpo divide by the number of sequences
            scale = weights.sum().item() / len(lengths)
        return rows, advantages[keep], weights, scale

    def _optimizer_step(self, skip: bool) -> None:
        if skip:
            self.skipped_spikes += 1
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
        with warnings.catch_warnings():  # a skipped first step makes torch warn about the call order
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()

    def lr(self) -> float:
        """The learning rate the next step will use."""
        return self.scheduler.get_last_lr()[0]

    def state_dict(self) -> dict:
        """Model, optimizer, schedule, guard and reference weights."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "skipped_spikes": self.skipped_spikes,
                "spikes": {"grad_norms": list(self.spikes.grad_norms), "losses": list(self.spikes.losses)},
                "reference": None if self.reference is None else self.reference.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()` (the learner must have been built with the same config)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.skipped_spikes = state.get("skipped_spikes", 0)
        self.spikes.grad_norms, self.spikes.losses = list(state["spikes"]["grad_norms"]), list(state["spikes"]["losses"])
        if self.reference is not None and state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])


def frozen_copy(model):
    """A frozen deep copy of a policy (the KL reference, or a self-play opponent)."""
    reference = copy.deepcopy(model).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


@torch.no_grad()
def _no_grad_logprobs(model, completions: Completions, temperature: float) -> torch.Tensor:
    return completion_logprobs(model, completions, temperature)



