"""One trainable policy's side of GRPO: lr schedule, spike guard, optimizer, KL reference and the update.

`PolicyLearner.update(completions, advantages)` runs `mu` clipped-surrogate updates of the model on a
batch of sampled completions whose advantages are already known. The trainer (trainers/team/trainer.py)
owns one learner per trainable policy, so a one-agent scenario and a team share one implementation of
the exact batch compaction, the loss (`trainers.grpo.objective.policy_loss`) and the guards.
"""

from __future__ import annotations

import copy
import math
import statistics
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from trainers.policy.adapters import BaseReference, opponent_model, reference_model
from trainers.policy.generation import Completions, completion_logprobs, microbatch_rows, select_rows


def lr_lambda(config) -> Callable[[int], float]:
    """Multiplier of the base lr at each step: linear warm-up, then constant, linear or cosine decay."""
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.lr_schedule == "constant":
            return 1.0
        progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        if config.lr_schedule == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


class SpikeGuard:
    """Flags a step whose grad norm exceeds `factor` x the running median of recent steps.

    A non-finite loss or grad norm is always a spike. The loss itself is only watched when
    `watch_loss` is set: the on-policy GRPO loss is a length-weighted sum of centred advantages whose
    magnitude swings between ~1e-9 and ~1e-2 from step to step, so its median is no scale and a
    loss test would skip healthy steps. Flagged values still enter the window, so a lasting change of
    scale is accepted after window/2 steps.
    """

    def __init__(self, factor: float, window: int, min_history: int = 5, watch_loss: bool = False):
        self.factor, self.window, self.min_history, self.watch_loss = factor, window, min_history, watch_loss
        self.grad_norms: list[float] = []
        self.losses: list[float] = []

    def is_spike(self, loss: float, grad_norm: float) -> bool:
        """Record the step and say whether it should be skipped."""
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        spike = not finite
        if len(self.grad_norms) >= self.min_history and self.factor > 0:
            spike |= grad_norm > self.factor * statistics.median(self.grad_norms)
            if self.watch_loss:
                spike |= abs(loss) > self.factor * statistics.median(self.losses)
        if finite:
            self.grad_norms = (self.grad_norms + [grad_norm])[-self.window:]
            self.losses = (self.losses + [abs(loss)])[-self.window:]
        return spike


class PolicyLearner:
    """Optimizer, lr schedule, optional frozen reference and spike guard of one policy (see module doc)."""

    def __init__(self, model, config):
        self.model, self.config = model, config
        # with LoRA the reference is the base with adapters disabled (no copy); else a frozen copy
        self.reference = reference_model(model, frozen_copy) if config.beta != 0 else None
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=config.adam_betas,
                                           eps=config.adam_eps, weight_decay=config.weight_decay,
                                           fused=True)  # one kernel for all tensors: ~3x faster than the loop
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(config))
        self.spikes = SpikeGuard(config.spike_factor, config.spike_window, watch_loss=config.spike_on_loss)
        self.skipped_spikes = 0
        if config.gradient_checkpointing:  # after the reference copy: only the trained model recomputes
            enable_checkpointing(model)

    def update(self, completions: Completions, advantages: torch.Tensor, *, lr_scale: float = 1.0,
               offpolicy: bool = False) -> dict[str, float]:
        """`mu` clipped-surrogate updates on the batch; returns loss, grad norm, KL and clip stats, and
        the sampler/trainer mismatch (`mismatch`: engine/* figures, trainers/engine/correction.py).

        `lr_scale` multiplies this step's scheduled learning rate (the warm-up stage's low-lr check).
        `offpolicy`: the samples were not drawn by the trainer's own forward (an HTTP engine, or older
        weights: the Ray backend's max_staleness > 0). With `tis_cap` > 0 every token is then weighed
        by its truncated importance ratio against the sampler's logprobs (`completions.logprobs`); with
        0 the clipped ratio is taken against the sampler's logprobs instead. On-policy, the old policy
        is the current one before the update.
        """
        cfg = self.config
        for group, scheduled in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = scheduled * lr_scale  # the scheduler's next step restores the schedule
        compact = self.compact_batch(completions, advantages)
        if compact is None:  # every advantage is 0: no gradient, but keep the optimizer's clock
            return self.keep_clock()
        rows, row_adv, weights, scale = compact
        parts = microbatches(rows, row_adv, weights, cfg.max_tokens_per_microbatch, cfg.loss_type)
        correct = offpolicy and cfg.tis_cap > 0
        if offpolicy and not correct:  # no TIS: the clipped ratio is against the sampler (unknown: the trainer's)
            old = [self._sampler_or_trainer(p.rows) for p in parts]
        else:
            old = None if cfg.mu == 1 else [_no_grad_logprobs(self.model, p.rows, cfg.temperature, cfg.packing)
                                            for p in parts]
        ref = None if self.reference is None else [_no_grad_logprobs(self.reference, p.rows, cfg.temperature,
                                                                     cfg.packing)
                                                   for p in parts]
        pairs: list = []  # (trainer, sampler, token weights) of the first pass: the mismatch before any update
        for _ in range(cfg.mu):
            self.optimizer.zero_grad(set_to_none=True)
            loss, stats = self._accumulate(parts, old, ref, scale, correct, pairs)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm, foreach=True).item()
            self._optimizer_step(skip=self.spikes.is_spike(loss, grad_norm))
        from trainers.engine.correction import mismatch_metrics

        return {"loss": loss, "grad_norm": grad_norm, "kl": stats.kl, "clip_fraction": stats.clip_fraction,
                "trained_rows": rows.completion_ids.size(0),
                "mismatch": mismatch_metrics(pairs, cfg.tis_cap if correct else 0.0)}

    def _accumulate(self, parts, old, ref, scale: float, correct: bool = False, pairs: list | None = None):
        """Forward and backward of every micro-batch, gradients accumulated: the loss of the whole batch.

        Each part's loss is weighted by its share of the batch's normaliser, so the summed gradients
        equal those of one forward over all rows. `correct`: weigh tokens by their truncated importance
        ratio against the sampler's logprobs. An empty `pairs` list is filled with each part's (trainer,
        sampler, token weights) logprobs. Returns the batch loss (a float) and its LossStats.
        """
        from trainers.grpo.objective import policy_loss

        cfg, total, results, record = self.config, 0.0, [], pairs is not None and not pairs
        for index, part in enumerate(parts):
            with training_forward(self.model, cfg.gradient_checkpointing):
                logprobs = completion_logprobs(self.model, part.rows, cfg.temperature, packing=cfg.packing)
                loss, stats = policy_loss(logprobs, None if old is None else old[index],
                                          None if ref is None else ref[index], part.advantages,
                                          part.rows.completion_mask, loss_type=cfg.loss_type,
                                          epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high, beta=cfg.beta,
                                          max_completion_length=cfg.max_new_tokens, row_weights=part.weights,
                                          sampler_logprobs=part.rows.logprobs if correct else None,
                                          tis_cap=cfg.tis_cap)
                loss = loss * scale if part.share is None else loss * (part.share * scale)
                loss.backward()
            if record:
                pairs.append((logprobs.detach(), part.rows.logprobs,
                              part.rows.completion_mask * part.weights[:, None].to(logprobs.dtype)))
            total += loss.item()
            results.append(stats)
        return total, results[0] if len(parts) == 1 else _merge_stats(results, parts)

    def _sampler_or_trainer(self, rows: Completions) -> torch.Tensor:
        """The sampler's logprobs of `rows`; where it sent none (NaN), the trainer's own, computed only then."""
        sampler = rows.logprobs.float()
        unknown = torch.isnan(sampler)
        if not bool(unknown.any()):
            return sampler
        return torch.where(unknown, _no_grad_logprobs(self.model, rows, self.config.temperature, self.config.packing),
                           sampler)

    def keep_clock(self) -> dict[str, float]:
        """A step without samples or signal: the optimizer and lr schedule still advance one step,
        as a zero loss would make them (so every policy stays on the run's step clock)."""
        self.optimizer.zero_grad(set_to_none=False)
        for group in self.optimizer.param_groups:  # a learner restored from a checkpoint has no gradients yet:
            for parameter in group["params"]:      # give them zeros, or AdamW skips them and the clock slips
                if parameter.grad is None:
                    parameter.grad = torch.zeros_like(parameter)
        self._optimizer_step(skip=False)
        return {"loss": 0.0, "grad_norm": 0.0, "kl": None, "clip_fraction": 0.0, "trained_rows": 0}

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
        device = completions.completion_ids.device
        keep = torch.tensor([row for row, _ in first_of.values()], device=device)
        weights = torch.tensor(counts, dtype=torch.float32, device=device)
        advantages = advantages.to(device)
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

    def end_step(self, step: int) -> None:
        """After the run's step number `step`: the KL reference moves when `ref_update_every` says so."""
        if self.config.ref_update_every and step % self.config.ref_update_every == 0:
            self.move_reference()

    def move_reference(self) -> None:
        """The KL reference becomes the current policy (`ref_update_every`): the KL term then pulls toward
        where the policy was a few steps ago, a proximal step, instead of toward the start. Under LoRA the
        reference moves from the base (adapters off) to a frozen copy of the adapter."""
        if self.reference is None:
            return
        if isinstance(self.reference, BaseReference):
            self.reference = opponent_model(self.model, "reference", frozen_copy)
        else:
            self.reference.load_state_dict(self.model.state_dict())

    def set_reference(self, reference) -> None:
        """The KL term pulls toward `reference` from now on (a frozen model, e.g. an earlier run's policy)."""
        self.reference = reference

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
            if isinstance(self.reference, BaseReference) and state["reference"]:  # a moved LoRA reference
                self.reference = opponent_model(self.model, "reference", frozen_copy)
            self.reference.load_state_dict(state["reference"])


def frozen_copy(model):
    """A frozen deep copy of a policy (the KL reference, or a self-play opponent)."""
    reference = copy.deepcopy(model).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


@torch.no_grad()
def _no_grad_logprobs(model, completions: Completions, temperature: float, packing: str = "auto") -> torch.Tensor:
    return completion_logprobs(model, completions, temperature, packing=packing)


# -- bounded memory: micro-batches with gradient accumulation, gradient checkpointing -------------------


@dataclass
class MicroBatch:
    """Rows trained in one forward, with their advantages and row weights; `share` is their part of the
    batch's loss normaliser (None for the whole batch in one part: the loss is then used as computed)."""

    rows: Completions
    advantages: torch.Tensor
    weights: torch.Tensor
    share: float | None


def microbatches(rows: Completions, advantages: torch.Tensor, weights: torch.Tensor, max_tokens: int | None,
                 loss_type: str) -> list[MicroBatch]:
    """The batch split by a token budget (`train.max_tokens_per_microbatch`; None = one part).

    The loss is a sum over rows divided by one normaliser (`objective.loss_normaliser`), so part i's
    own loss times normaliser_i / normaliser equals its share of the batch loss, and the gradients
    summed over parts are those of the whole batch.
    """
    from trainers.grpo.objective import loss_normaliser

    groups = microbatch_rows(rows, max_tokens)
    if len(groups) == 1:
        return [MicroBatch(rows, advantages, weights, None)]
    whole = loss_normaliser(rows.completion_mask, loss_type, weights)
    parts = []
    for group in groups:
        index = torch.tensor(group, device=advantages.device)
        part = select_rows(rows, index)
        share = loss_normaliser(part.completion_mask, loss_type, weights[index]) / whole
        parts.append(MicroBatch(part, advantages[index], weights[index], share))
    return parts


def _merge_stats(stats: list, parts: list[MicroBatch]):
    """The LossStats of the whole batch from its parts': token means weighted by each part's tokens."""
    from trainers.grpo.objective import LossStats

    tokens = [float((p.rows.completion_mask * p.weights[:, None]).sum()) for p in parts]
    total = sum(tokens) or 1.0

    def mean(name):
        values = [getattr(s, name) for s in stats]
        return None if values[0] is None else sum(v * t for v, t in zip(values, tokens)) / total

    return LossStats(kl=mean("kl"), clip_fraction=mean("clip_fraction"), low_clip_fraction=mean("low_clip_fraction"),
                     high_clip_fraction=mean("high_clip_fraction"))


def enable_checkpointing(model) -> None:
    """Turn on the model's gradient (activation) checkpointing, non-reentrant (works with frozen inputs).

    It only acts in the training forward (`training_forward`): sampling stays in eval mode with its cache.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"train.gradient_checkpointing: {type(model).__name__} does not support gradient "
                         "checkpointing; set train.gradient_checkpointing: false")
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2x; the old name warns
    if enable is None:
        enable = model.gradient_checkpointing_enable
    enable({"use_reentrant": False})


@contextmanager
def training_forward(model, checkpointing: bool):
    """Inside the block the checkpointed modules are in training mode, so their checkpointing runs.

    transformers checkpoints a layer only when `layer.training`; `model.train()` would also turn on
    dropout and change the numbers. Only the modules that carry a `gradient_checkpointing` flag get
    `training = True` (not their children: dropout and attention dropout stay off), and get it back.
    """
    if not checkpointing:
        yield
        return
    flagged = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    before = [m.training for m in flagged]
    for module in flagged:
        module.training = True
    try:
        yield
    finally:
        for module, mode in zip(flagged, before):
            module.training = mode
