"""Batched sampling with a shared-prefix KV cache, and the logprobs GRPO trains on."""

import pytest
import torch

from trainers.policy.generation import (completion_logprobs, decode_completions, encode_prompts, full_sequence_logprobs,
                               pack_completions, sample_completions)

PROMPTS = ["12+35=", "9+1=", "77+80=", "3="]  # different lengths: exercises left padding


def _sample(model, tokenizer, prompts=PROMPTS, seed=0, **kwargs):
    ids, mask = encode_prompts(tokenizer, prompts)
    options = dict(group_size=4, max_new_tokens=6, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    options.update(kwargs)
    return sample_completions(model, ids, mask, **options)


def test_encode_prompts_left_pads_without_special_tokens(micro_policy):
    _, tokenizer = micro_policy()
    ids, mask = encode_prompts(tokenizer, ["12+3=", "7="])
    assert ids.shape == mask.shape == (2, 5)
    assert mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
    assert ids[1, :3].tolist() == [tokenizer.pad_token_id] * 3
    assert tokenizer.decode(ids[0].tolist()) == "12+3="


def test_masks_cover_tokens_up_to_and_including_eos(micro_policy):
    model, tokenizer = micro_policy()
    out = _sample(model, tokenizer, max_new_tokens=8)
    assert out.completion_ids.shape == out.completion_mask.shape == out.logprobs.shape
    assert out.completion_ids.size(0) == len(PROMPTS) * 4
    eos = tokenizer.eos_token_id
    for ids, mask, truncated in zip(out.completion_ids.tolist(), out.completion_mask.tolist(), out.truncated.tolist()):
        length = sum(mask)
        assert mask == [1] * length + [0] * (len(mask) - length)  # a prefix of ones
        assert eos not in ids[:length - 1]
        assert truncated == (ids[length - 1] != eos)
        assert all(t == tokenizer.pad_token_id for t in ids[length:])
    assert (out.logprobs[out.completion_mask == 0] == 0).all()
    assert (out.logprobs[out.completion_mask == 1] < 0).all()


def test_seeded_sampling_is_reproducible_and_seed_dependent(micro_policy):
    model, tokenizer = micro_policy()
    first, again, other = (_sample(model, tokenizer, seed=s) for s in (3, 3, 4))
    assert torch.equal(first.completion_ids, again.completion_ids)
    assert not torch.equal(first.completion_ids, other.completion_ids)


def test_greedy_matches_transformers_generate(micro_policy):
    model, tokenizer = micro_policy(seed=1)
    for prompt in PROMPTS:
        ids, mask = encode_prompts(tokenizer, [prompt])
        ours = sample_completions(model, ids, mask, greedy=True, max_new_tokens=6,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        reference = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6,
                                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        theirs = reference[0, ids.size(1):].tolist()
        length = int(ours.completion_mask.sum())
        assert ours.completion_ids[0, :length].tolist() == theirs[:length]


def test_batched_left_padded_greedy_equals_one_prompt_at_a_time(micro_policy):
    model, tokenizer = micro_policy(seed=2)
    batched = decode_completions(tokenizer, _sample(model, tokenizer, greedy=True, group_size=1))
    alone = [decode_completions(tokenizer, _sample(model, tokenizer, [p], greedy=True, group_size=1))[0]
             for p in PROMPTS]
    assert batched == alone


def test_training_logprobs_equal_sampling_and_full_forward(micro_policy):
    model, tokenizer = micro_policy()
    out = _sample(model, tokenizer, max_new_tokens=8)
    ours = completion_logprobs(model, out)
    full = full_sequence_logprobs(model, out)
    mask = out.completion_mask.bool()
    torch.testing.assert_close(ours[mask], out.logprobs[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours[mask], full[mask], atol=1e-5, rtol=0)


def test_shared_prefix_gradient_equals_full_forward_gradient(micro_policy):
    model, tokenizer = micro_policy()
    out = _sample(model, tokenizer, max_new_tokens=8)
    weights = torch.randn(out.completion_mask.shape) * out.completion_mask

    def gradient(fn):
        model.zero_grad()
        (fn(model, out) * weights).sum().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    torch.testing.assert_close(gradient(completion_logprobs), gradient(full_sequence_logprobs), atol=1e-5, rtol=1e-4)


def test_temperature_scales_logprobs(micro_policy):
    model, tokenizer = micro_policy()
    out = _sample(model, tokenizer, temperature=0.5)
    mask = out.completion_mask.bool()
    hot = completion_logprobs(model, out, temperature=0.5)
    cold = completion_logprobs(model, out, temperature=1.0)
    torch.testing.assert_close(hot[mask], out.logprobs[mask], atol=1e-5, rtol=0)
    assert not torch.allclose(hot[mask], cold[mask])


def test_tiny_top_p_is_greedy(micro_policy):
    model, tokenizer = micro_policy()
    greedy = _sample(model, tokenizer, greedy=True)
    nucleus = _sample(model, tokenizer, top_p=1e-6)
    assert torch.equal(greedy.completion_ids, nucleus.completion_ids)


@pytest.mark.parametrize("bad", [dict(temperature=0.0), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_sampling_settings_are_rejected(micro_policy, bad):
    model, tokenizer = micro_policy()
    with pytest.raises(ValueError):
        _sample(model, tokenizer, **bad)


@pytest.mark.parametrize("pack_tokens", [None, 1024, 12, 1])
def test_packed_logprobs_equal_full_forward_for_any_pack_size(micro_policy, pack_tokens):
    model, tokenizer = micro_policy()
    out = _sample(model, tokenizer, max_new_tokens=8)
    mask = out.completion_mask.bool()
    packed = completion_logprobs(model, out, pack_tokens=pack_tokens)
    torch.testing.assert_close(packed[mask], full_sequence_logprobs(model, out)[mask], atol=1e-5, rtol=0)
    assert (packed[~mask] == 0).all()


def test_short_rows_get_short_packed_sequences_under_a_block_mask(micro_policy):
    """The auto pack length: a few of the longest rows under shared_prompt's dense mask (its attention
    grows with the length for every token), within bounds; the full length per row, which needs no mask."""
    from trainers.policy.generation import PACK_ROWS, PACK_TOKENS_MAX, PACK_TOKENS_MIN, auto_pack_tokens

    model, tokenizer = micro_policy()
    out = _sample(model, tokenizer, max_new_tokens=8)
    longest = int((out.prompt_mask.sum(-1) + out.completion_mask.sum(-1)).max())
    assert auto_pack_tokens(out, shared=True) == max(PACK_TOKENS_MIN, min(PACK_TOKENS_MAX, PACK_ROWS * longest))
    assert auto_pack_tokens(out, shared=False) == PACK_TOKENS_MAX
    wide = _sample(model, tokenizer, max_new_tokens=PACK_TOKENS_MAX)  # rows that may reach the cap
    assert PACK_TOKENS_MIN <= auto_pack_tokens(wide, shared=True) <= PACK_TOKENS_MAX


def test_pack_holds_each_prompt_once_and_no_padding(micro_policy):
    model, tokenizer = micro_policy()
    out = _sample(model, tokenizer, max_new_tokens=8)
    pack = pack_completions(out)
    assert len(pack.ids) == 1
    prompt_tokens = sum(len(p) for p in PROMPTS)
    completion_inputs = int((out.completion_mask.sum(-1) - 1).sum())
    assert len(pack.ids[0]) == prompt_tokens + completion_inputs
    assert len(pack.targets) == int(out.completion_mask.sum())
    small = pack_completions(out, pack_tokens=10)
    assert len(small.ids) > 1 and all(len(ids) <= max(10, 6 + 7) for ids in small.ids)


def test_keyed_rows_draw_the_same_tokens_in_any_batch(micro_policy):
    from trainers.policy.generation import stream_key

    model, tokenizer = micro_policy(seed=3)
    keys = [stream_key(7, i, "agent") for i in range(len(PROMPTS))]
    batched = _sample(model, tokenizer, row_keys=keys, generator=None)
    alone = [_sample(model, tokenizer, [p], row_keys=[k], generator=torch.Generator().manual_seed(99))
             for p, k in zip(PROMPTS, keys)]
    reversed_batch = _sample(model, tokenizer, PROMPTS[::-1], row_keys=keys[::-1])
    texts = decode_completions(tokenizer, batched)
    assert texts == [t for out in alone for t in decode_completions(tokenizer, out)]  # the generator is unused
    flipped = decode_completions(tokenizer, reversed_batch)
    assert texts == [t for i in reversed(range(len(PROMPTS))) for t in flipped[4 * i:4 * i + 4]]
    other = _sample(model, tokenizer, row_keys=[stream_key(8, i, "agent") for i in range(len(PROMPTS))])
    assert decode_completions(tokenizer, other) != texts  # another key, other samples
    assert len(set(texts[:4])) > 1  # the G rows of a prompt draw different streams


def test_keyed_draws_follow_the_sampling_distribution(micro_policy):
    """Over many keys, the first token's frequencies match softmax(logits / T) (and top_p's nucleus)."""
    from trainers.policy.generation import sampling_probabilities, stream_key

    model, tokenizer = micro_policy(seed=4)
    ids, mask = encode_prompts(tokenizer, ["12+3="])
    logits = model(input_ids=ids, attention_mask=mask).logits[0, -1].detach()
    n = 4000
    for temperature, top_p in ((2.0, 1.0), (1.0, 0.8)):
        out = sample_completions(model, ids.repeat(n, 1), mask.repeat(n, 1), max_new_tokens=1,
                                 temperature=temperature, top_p=top_p, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id, row_keys=[stream_key(1, i) for i in range(n)])
        counts = torch.bincount(out.completion_ids[:, 0], minlength=logits.numel()).double() / n
        expected = sampling_probabilities(logits[None], temperature, top_p)[0].double()
        assert (counts[expected == 0] == 0).all()  # nothing outside the nucleus
        assert (counts - expected).abs().max() < 4 * (0.25 / n) ** 0.5  # within 4 standard errors


def test_row_keys_must_match_the_prompts(micro_policy):
    model, tokenizer = micro_policy()
    with pytest.raises(ValueError, match="row_keys has 1 keys for 4 prompts"):
        _sample(model, tokenizer, row_keys=[1])
