"""The sampler/trainer mismatch and truncated importance sampling (trainers/engine/correction.py, train.tis_cap).

When the sampler's logprobs equal the trainer's, the correction is a no-op: the same loss and the
same gradients as the on-policy update. When they differ, every token's surrogate is weighed by
min(p_trainer / p_sampler, cap), and the mismatch figures say by how much they differ.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from trainers.engine.correction import mismatch_metrics, tis_weights
from trainers.grpo.config import GRPOConfig
from trainers.grpo.learner import PolicyLearner
from trainers.grpo.objective import policy_loss
from trainers.policy.generation import completion_logprobs, encode_prompts, sample_completions

PROMPTS = ["Task: 12+35=", "You are the solver. 3*4=", "9+1=", "The weather in Paris is"]


def test_tis_weights_are_the_truncated_ratio_and_one_where_unknown():
    trainer = torch.tensor([[0.0, -1.0, -2.0]])
    sampler = torch.tensor([[0.0, -2.0, float("nan")]])
    weights = tis_weights(trainer, sampler, cap=2.0)
    assert weights[0].tolist() == pytest.approx([1.0, 2.0, 1.0])  # e^1 = 2.72 is cut to 2; NaN -> 1
    assert tis_weights(trainer, trainer.clone(), cap=2.0).tolist() == [[1.0, 1.0, 1.0]]


def test_the_loss_with_agreeing_logprobs_is_the_on_policy_loss():
    generator = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(4, 5, generator=generator).requires_grad_()
    advantages, mask = torch.randn(4, generator=generator), torch.ones(4, 5)
    plain, _ = policy_loss(logprobs, None, None, advantages, mask)
    corrected, _ = policy_loss(logprobs, None, None, advantages, mask, sampler_logprobs=logprobs.detach().clone(),
                               tis_cap=2.0)
    assert corrected.item() == plain.item()


def test_disagreeing_logprobs_weigh_each_token_by_its_capped_ratio():
    generator = torch.Generator().manual_seed(1)
    logprobs = -torch.rand(3, 4, generator=generator)
    sampler = logprobs + 0.5 * torch.randn(3, 4, generator=generator)
    advantages, mask = torch.tensor([1.0, -1.0, 0.5]), torch.ones(3, 4)
    corrected, _ = policy_loss(logprobs, None, None, advantages, mask, sampler_logprobs=sampler, tis_cap=1.5)
    weights = torch.exp(logprobs - sampler).clamp(max=1.5)
    expected = (-(advantages[:, None]) * weights).sum() / mask.sum()  # ratio 1 on-policy: the surrogate is -A
    assert corrected.item() == pytest.approx(expected.item(), rel=1e-6)
    off, _ = policy_loss(logprobs, None, None, advantages, mask, sampler_logprobs=sampler, tis_cap=0.0)
    plain, _ = policy_loss(logprobs, None, None, advantages, mask)
    assert off.item() == plain.item()  # cap 0: the correction is off


def test_mismatch_metrics_are_zero_when_equal_and_the_k3_kl_otherwise():
    trainer = torch.tensor([[-1.0, -2.0, -0.5]])
    mask = torch.ones(1, 3)
    same = mismatch_metrics([(trainer, trainer.clone(), mask)], cap=2.0)
    assert same["engine/mismatch_kl"] == 0.0 and same["engine/is_ratio_max"] == 1.0 and same["engine/tis_capped"] == 0.0
    sampler = torch.tensor([[-1.0, -3.0, float("nan")]])
    figures = mismatch_metrics([(trainer, sampler, mask)], cap=2.0)
    r = math.e  # the second token: p_t / p_s = e^1
    assert figures["engine/mismatch_kl"] == pytest.approx((0.0 + (r - 1 - 1.0)) / 2)
    assert figures["engine/is_ratio_max"] == pytest.approx(r) and figures["engine/tis_capped"] == pytest.approx(0.5)
    assert figures["engine/unknown_logprobs"] == pytest.approx(1 / 3)


def _batch(micro_policy):
    model, tokenizer = micro_policy(seed=2)
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    completions = sample_completions(model, ids, mask, group_size=3, max_new_tokens=6,
                                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                     generator=torch.Generator().manual_seed(0))
    advantages = torch.randn(completions.completion_ids.size(0), generator=torch.Generator().manual_seed(1))
    return model, completions, advantages


def _update(model, completions, advantages, offpolicy: bool, **knobs):
    model = copy.deepcopy(model)
    config = GRPOConfig(**(dict(lr=1e-2, max_grad_norm=1e9, spike_factor=0.0, max_new_tokens=6) | knobs))
    stats = PolicyLearner(model, config).update(completions, advantages, offpolicy=offpolicy)
    return stats, {name: p.detach().clone() for name, p in model.named_parameters()}


def test_an_off_policy_update_whose_sampler_agrees_is_the_on_policy_update(micro_policy):
    """The sampler's logprobs replaced by the trainer's own (what a perfect engine sends): TIS changes nothing."""
    model, completions, advantages = _batch(micro_policy)
    with torch.no_grad():
        exact = dataclasses.replace(completions, logprobs=completion_logprobs(model, completions))
    on, on_weights = _update(model, exact, advantages, offpolicy=False)
    off, off_weights = _update(model, exact, advantages, offpolicy=True)
    assert off["loss"] == pytest.approx(on["loss"], abs=1e-7)
    for name in on_weights:
        torch.testing.assert_close(off_weights[name], on_weights[name], atol=1e-7, rtol=1e-6)
    assert off["mismatch"]["engine/mismatch_kl"] == pytest.approx(0.0, abs=1e-9)


def test_an_off_policy_update_whose_sampler_disagrees_is_corrected_and_reported(micro_policy):
    model, completions, advantages = _batch(micro_policy)
    with torch.no_grad():
        exact = completion_logprobs(model, completions)
    skewed = dataclasses.replace(completions, logprobs=exact - 0.7 * completions.completion_mask)  # p_s < p_t
    on, on_weights = _update(model, skewed, advantages, offpolicy=False)
    off, off_weights = _update(model, skewed, advantages, offpolicy=True, tis_cap=1.5)
    assert off["mismatch"]["engine/is_ratio_min"] == pytest.approx(math.exp(0.7), rel=1e-4)
    assert off["mismatch"]["engine/tis_capped"] == 1.0  # every ratio e^0.7 = 2.01 > 1.5
    # every token weighed by 1.5: the loss is 1.5 times the on-policy loss
    assert off["loss"] == pytest.approx(1.5 * on["loss"], rel=1e-5)
    assert any(not torch.equal(off_weights[n], on_weights[n]) for n in on_weights)


def test_without_tis_the_clipped_ratio_is_against_the_sampler_and_unknown_logprobs_are_the_trainers(micro_policy):
    """tis_cap 0: the old policy is the sampler's logprobs; where the sampler sent none (NaN), the trainer's own.
    A sampler that agrees, with or without gaps, gives the on-policy update."""
    model, completions, advantages = _batch(micro_policy)
    with torch.no_grad():
        exact = completion_logprobs(model, completions)
    gaps = exact.clone()
    gaps[:, 1] = float("nan")
    on, on_weights = _update(model, dataclasses.replace(completions, logprobs=exact), advantages, offpolicy=False)
    for sampler in (exact, gaps):
        off, off_weights = _update(model, dataclasses.replace(completions, logprobs=sampler), advantages,
                                   offpolicy=True, tis_cap=0.0)
        assert off["loss"] == pytest.approx(on["loss"], abs=1e-7)
        for name in on_weights:
            torch.testing.assert_close(off_weights[name], on_weights[name], atol=1e-7, rtol=1e-6)
