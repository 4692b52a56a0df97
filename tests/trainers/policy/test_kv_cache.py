"""The in-place KV cache of the sampler (trainers/policy/kv_cache.py): the logits of a decode step equal a
full forward over prompt + completion, across buffer growth and the dropping of stopped rows, and the
whole sampler gives the tokens of a plain `generate` (greedy) and of the same keys in any batch."""

from __future__ import annotations

import pytest
import torch

from trainers.policy import kv_cache
from trainers.policy.generation import encode_prompts, full_sequence_logprobs, sample_completions

PROMPTS = ["12+35=", "9+1=", "77+80=", "3=", "12+35="]  # a repeated prompt: prefilled once


@pytest.mark.parametrize("first_room", [1, 3, 64])  # the buffer doubles 0, several or many times
def test_decode_logprobs_equal_a_full_forward_through_growth_and_dropped_rows(micro_policy, monkeypatch, first_room):
    monkeypatch.setattr(kv_cache, "FIRST_ROOM", first_room)
    model, tokenizer = micro_policy(seed=5)
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    # stopping at common characters ends rows at different steps: stopped rows are dropped mid-generation
    stops = [tokenizer.eos_token_id, *tokenizer("1", add_special_tokens=False)["input_ids"],
             *tokenizer("+", add_special_tokens=False)["input_ids"]]
    out = sample_completions(model, ids, mask, group_size=3, max_new_tokens=12, eos_token_id=stops,
                             pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0))
    lengths = out.completion_mask.sum(-1)
    assert lengths.min() < lengths.max() == 12  # some rows stopped early, some ran to the limit
    full = full_sequence_logprobs(model, out)
    known = out.completion_mask.bool()
    torch.testing.assert_close(out.logprobs[known], full[known], atol=1e-5, rtol=0)


def test_a_layer_grows_in_place_and_keeps_what_it_held():
    keys, values = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    layer = kv_cache.GrowingLayer(keys, values, longest=9)
    buffer = layer._keys
    new = [(torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5)) for _ in range(5)]
    for k, v in new:
        returned_keys, returned_values = layer.update(k, v)
    assert layer.get_seq_length() == 9 and layer._keys.shape[-2] == 9  # never past the longest sequence
    torch.testing.assert_close(returned_keys, torch.cat([keys, *(k for k, _ in new)], dim=-2), atol=0, rtol=0)
    torch.testing.assert_close(returned_values, torch.cat([values, *(v for _, v in new)], dim=-2), atol=0, rtol=0)
    assert buffer.shape[-2] == 9  # FIRST_ROOM (64) past 4 positions is capped at the longest: no regrowth
    layer.batch_select_indices(torch.tensor([1]))
    torch.testing.assert_close(layer.keys, returned_keys[1:], atol=0, rtol=0)


def test_identical_prompts_are_prefilled_once(micro_policy):
    model, tokenizer = micro_policy(seed=2)
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    widths = []
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape),
                                             with_kwargs=True)
    sample_completions(model, ids, mask, group_size=4, max_new_tokens=3, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, row_keys=[1, 2, 3, 4, 5])
    handle.remove()
    assert widths[0] == (4, ids.size(1))  # 5 prompts, 4 distinct: 4 prefill rows, not 5 x G = 20
    assert all(shape[1] == 1 for shape in widths[1:]) and widths[1][0] == 20  # then every row decodes, one token
