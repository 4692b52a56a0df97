"""`PolicyLearner`, the GRPO core every trainer's policy updates through: exact batch compaction, the KL
reference, the spike guard, the lr schedules, and an update that moves every parameter.

The learner is driven directly on completions the micro model sampled (`sample_completions`, as the
in-process engine samples them) with advantages chosen here: nothing asserted depends on which tokens
a random model happens to sample (where duplicates are needed, the logits are pinned on one token).
"""

import pytest
import torch

from trainers.grpo.config import GRPOConfig
from trainers.grpo.learner import PolicyLearner, SpikeGuard, lr_lambda
from trainers.grpo.objective import policy_loss
from trainers.policy.generation import (completion_logprobs, decode_completions, encode_prompts,
                                        sample_completions)
from trainers.policy.prompts import stop_token_ids

FAST = dict(prompts_per_step=4, group_size=4, max_new_tokens=4, lr=1e-3)
PROMPTS = ["10+20=", "11+21=", "12+22=", "13+23="]
SPREAD = torch.tensor([1.0, -1.0] * 8)  # every group of 4 has a spread: every row carries a gradient


def _params(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _sample(model, tokenizer, *, pinned: str | None = None, seed: int = 0):
    """G = 4 completions of each prompt; with `pinned`, the logits are fixed on that token while sampling
    (every completion the same on every CPU; the losses and gradients stay the model's own)."""
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    handle = None
    if pinned is not None:
        token_id = tokenizer.convert_tokens_to_ids(pinned)

        def fix(module, inputs, logits):
            bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
            bias[token_id] = 1e4
            return logits + bias

        handle = model.lm_head.register_forward_hook(fix)
    try:
        completions = sample_completions(model, ids, mask, group_size=4, max_new_tokens=4,
                                         eos_token_id=stop_token_ids(model, tokenizer),
                                         pad_token_id=tokenizer.pad_token_id,
                                         generator=torch.Generator().manual_seed(seed))
    finally:
        if handle is not None:
            handle.remove()
    return completions, decode_completions(tokenizer, completions)


def test_an_update_changes_every_parameter(micro_policy):
    model, tokenizer = micro_policy()
    learner = PolicyLearner(model, GRPOConfig(**FAST))
    before = _params(model)
    completions, _ = _sample(model, tokenizer)
    stats = learner.update(completions, SPREAD)
    for name, param in model.named_parameters():
        assert not torch.equal(before[name], param), f"{name} did not change"
    assert stats["trained_rows"] > 0 and stats["grad_norm"] > 0 and stats["kl"] is None


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_compact_batch_keeps_loss_and_gradient_exact(micro_policy, beta):
    """Dropping zero-advantage rows and merging duplicate completions must not change anything."""
    model, tokenizer = micro_policy()
    config = GRPOConfig(**FAST, beta=beta)
    learner = PolicyLearner(model, config)
    completions, texts = _sample(model, tokenizer, pinned="7")  # every completion '7777': duplicates to merge
    advantages = torch.tensor([0.0] * 4 + [1.0] * 2 + [-1.0] * 2 + [0.0] * 4 + [2.0, -2.0, 0.0, 0.0])
    reference = completion_logprobs(model, completions).detach()
    for loss_type in ("dapo", "bnpo", "grpo", "dr_grpo"):
        learner.config = config.with_knobs(loss_type=loss_type)
        rows, row_adv, weights, scale = learner.compact_batch(completions, advantages)
        assert rows.completion_ids.size(0) < 16 and weights.sum() <= 16
        if beta == 0:
            assert (row_adv != 0).all()

        def gradient(batch, adv, w, factor):
            model.zero_grad()
            ref = reference if batch is completions else reference[keep_rows(batch)]
            loss, _ = policy_loss(completion_logprobs(model, batch), None, ref, adv, batch.completion_mask,
                                  loss_type=loss_type, beta=beta, max_completion_length=4, row_weights=w)
            (loss * factor).backward()
            return loss.item() * factor, torch.cat([p.grad.flatten() for p in model.parameters()])

        def keep_rows(batch):
            return [next(i for i in range(16) if torch.equal(completions.completion_ids[i], ids)
                         and completions.prompt_index[i] == p)
                    for ids, p in zip(batch.completion_ids, batch.prompt_index)]

        full_loss, full_grad = gradient(completions, advantages, None, 1.0)
        compact_loss, compact_grad = gradient(rows, row_adv, weights, scale)
        assert compact_loss == pytest.approx(full_loss, abs=1e-7)
        torch.testing.assert_close(compact_grad, full_grad, atol=1e-7, rtol=1e-5)
    assert texts == ["7777"] * 16  # the test really had duplicates to merge


def test_a_batch_without_signal_trains_nothing_but_keeps_the_clock(micro_policy):
    model, tokenizer = micro_policy()
    learner = PolicyLearner(model, GRPOConfig(**FAST, steps=4, lr_schedule="linear"))
    before, lr = _params(model), learner.lr()
    completions, _ = _sample(model, tokenizer)
    assert learner.compact_batch(completions, torch.zeros(16)) is None
    stats = learner.update(completions, torch.zeros(16))
    assert stats["trained_rows"] == 0 and stats["loss"] == 0.0
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert learner.lr() < lr  # the schedule moved on one step


def test_the_kl_reference_is_built_only_with_beta_and_is_frozen(micro_policy):
    model, _ = micro_policy()
    assert PolicyLearner(model, GRPOConfig(**FAST)).reference is None
    learner = PolicyLearner(model, GRPOConfig(**FAST, beta=0.04))
    assert learner.reference is not None and learner.reference is not model
    assert not any(p.requires_grad for p in learner.reference.parameters())
    assert all(torch.equal(a, b) for a, b in zip(learner.reference.parameters(), model.parameters()))


def test_spike_guard_flags_outliers_after_history():
    guard = SpikeGuard(factor=5.0, window=10)
    assert not any(guard.is_spike(1e-9, 1.0 + 0.01 * i) for i in range(6))
    assert guard.is_spike(1e-9, 50.0)
    assert not guard.is_spike(1e-9, 1.1)
    assert guard.is_spike(float("nan"), 1.0)


def test_spike_guard_ignores_the_loss_unless_asked():
    quiet, watching = SpikeGuard(factor=5.0, window=10), SpikeGuard(factor=5.0, window=10, watch_loss=True)
    for guard in (quiet, watching):
        for i in range(6):
            guard.is_spike(1e-3, 1.0)
    assert not quiet.is_spike(1e-1, 1.0)  # the on-policy loss swings in scale: not a spike by itself
    assert watching.is_spike(1e-1, 1.0)


def test_spike_guard_skips_the_optimizer_step(micro_policy):
    model, tokenizer = micro_policy()
    learner = PolicyLearner(model, GRPOConfig(**FAST))
    learner.spikes.grad_norms = [1e-12] * 10  # any real gradient is now a spike
    learner.spikes.losses = [0.0] * 10
    before = _params(model)
    completions, _ = _sample(model, tokenizer)
    stats = learner.update(completions, SPREAD)
    assert stats["trained_rows"] > 0 and stats["grad_norm"] > 0  # there was a gradient
    assert learner.skipped_spikes == 1
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert learner.state_dict()["skipped_spikes"] == 1  # a checkpoint keeps the count


@pytest.mark.parametrize("schedule,expected", [("constant", [1, 1, 1]), ("linear", [1, 0.5, 0.0]),
                                               ("cosine", [1, 0.5, 0.0])])
def test_lr_schedules(schedule, expected):
    factor = lr_lambda(GRPOConfig(steps=4, warmup_steps=2, lr_schedule=schedule))
    assert [factor(0), factor(1)] == [0.5, 1.0]
    assert [factor(s) for s in (2, 3, 4)] == pytest.approx(expected)


@pytest.mark.parametrize("bad", [dict(loss_type="ppo"), dict(scale_rewards="max"), dict(group_size=1),
                                 dict(mu=0), dict(temperature=0), dict(lr_schedule="step"), dict(beta=-1)])
def test_bad_config_is_rejected_with_the_field_name(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        GRPOConfig(**bad)
