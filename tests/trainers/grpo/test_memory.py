"""Bounded memory (issue 12, item 5), on the real-architecture fixtures (Qwen2, Llama, GPT-2 with a BPE
tokenizer) and the micro policy, all float32:

- micro-batches by `max_tokens_per_microbatch` with gradient accumulation give the loss and gradient
  of one batch (1e-5), for every loss aggregation, with a KL reference and mu > 1;
- gradient checkpointing gives the same loss and gradients and saves fewer activations;
- the packed forward applies the LM head only where a completion token is predicted, with the
  logprobs of the plain per-row forward.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from helpers.real_models import ARCHITECTURES
from trainers.grpo.config import GRPOConfig
from trainers.grpo.learner import PolicyLearner, training_forward
from trainers.policy.loading import load_policy
from trainers.policy.generation import (completion_logprobs, encode_prompts, full_sequence_logprobs, microbatch_rows,
                                      sample_completions)

PROMPTS = ["Task: 12+35=", "You are the solver. Compute the answer and write it after ANSWER:. 3*4=", "9+1=",
           "The weather in Paris is"]
G = 3


def _batch(model, tokenizer, seed=0):
    """A sampled batch (prompts of different lengths, G rows each) and seeded advantages."""
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    completions = sample_completions(model, ids, mask, group_size=G, max_new_tokens=6,
                                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                     generator=torch.Generator().manual_seed(seed))
    advantages = torch.randn(completions.completion_ids.size(0), generator=torch.Generator().manual_seed(seed + 1))
    return completions, advantages


def _gradients(model, completions, advantages, **knobs):
    """Loss and gradients of one learner update that changes nothing (lr 1e-30, no clipping), on a copy."""
    model = copy.deepcopy(model)
    settings = dict(lr=1e-30, max_grad_norm=1e9, spike_factor=0.0, max_new_tokens=6) | knobs
    update = PolicyLearner(model, GRPOConfig(**settings)).update(completions, advantages)
    return update, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _assert_close(expected, actual, tolerance=1e-5):
    assert expected.keys() == actual.keys() and expected
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=tolerance, rtol=tolerance, msg=name)


@pytest.fixture(scope="module")
def real_models(real_model_dirs):
    return {arch: load_policy(real_model_dirs[arch]) for arch in ARCHITECTURES}


# -- micro-batches with gradient accumulation ------------------------------------------------------------


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_micro_batches_give_the_loss_and_gradient_of_one_batch(real_models, architecture, loss_type):
    model, tokenizer = real_models[architecture]
    completions, advantages = _batch(model, tokenizer)
    budget = 24
    assert len(microbatch_rows(completions, budget)) > 2  # the batch really is split
    whole, expected = _gradients(model, completions, advantages, loss_type=loss_type)
    split, actual = _gradients(model, completions, advantages, loss_type=loss_type, max_tokens_per_microbatch=budget)
    assert split["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert split["trained_rows"] == whole["trained_rows"]
    _assert_close(expected, actual)


def test_micro_batches_keep_the_kl_and_the_mu_updates(real_models):
    model, tokenizer = real_models["qwen2"]
    completions, advantages = _batch(model, tokenizer, seed=3)
    knobs = dict(beta=0.04, mu=2)
    whole, expected = _gradients(model, completions, advantages, **knobs)
    split, actual = _gradients(model, completions, advantages, max_tokens_per_microbatch=20, **knobs)
    assert split["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert split["kl"] == pytest.approx(whole["kl"], abs=1e-7)
    assert split["clip_fraction"] == pytest.approx(whole["clip_fraction"])
    _assert_close(expected, actual)


def test_micro_batch_rows_respect_the_budget_and_keep_every_row_once(micro_policy):
    model, tokenizer = micro_policy()
    completions, _ = _batch(model, tokenizer)
    lengths = completions.completion_mask.sum(-1).tolist()
    prompts = completions.prompt_mask.sum(-1).tolist()
    for budget in (1, 10, 25, 10_000):
        groups = microbatch_rows(completions, budget)
        assert sorted(row for group in groups for row in group) == list(range(len(lengths)))
        for group in groups:
            firsts = {completions.prompt_index[row].item(): row for row in reversed(group)}
            tokens = sum(lengths[row] - 1 for row in group) + sum(prompts[row] for row in firsts.values())
            assert len(group) == 1 or tokens <= budget
    assert len(microbatch_rows(completions, 10_000)) == 1
    assert microbatch_rows(completions, None) == [list(range(len(lengths)))]


def test_one_micro_batch_is_the_unsplit_update_exactly(micro_policy):
    model, tokenizer = micro_policy()
    completions, advantages = _batch(model, tokenizer)
    whole, expected = _gradients(model, completions, advantages)
    same, actual = _gradients(model, completions, advantages, max_tokens_per_microbatch=10_000)
    assert same["loss"] == whole["loss"]
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


# -- gradient checkpointing -------------------------------------------------------------------------------


def _saved_bytes(model, completions, checkpointing: bool) -> int:
    """Bytes of the tensors autograd keeps for the backward of one training forward."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with training_forward(model, checkpointing), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        completion_logprobs(model, completions).sum().backward()
    return total


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_gradient_checkpointing_keeps_loss_and_gradients_and_saves_less(real_models, architecture):
    from trainers.grpo.learner import enable_checkpointing

    model, tokenizer = real_models[architecture]
    completions, advantages = _batch(model, tokenizer)
    plain, expected = _gradients(model, completions, advantages, beta=0.04)
    checkpointed, actual = _gradients(model, completions, advantages, beta=0.04, gradient_checkpointing=True)
    assert checkpointed["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    _assert_close(expected, actual)
    copy_ = copy.deepcopy(model)
    without = _saved_bytes(copy_, completions, checkpointing=False)
    enable_checkpointing(copy_)
    with_checkpointing = _saved_bytes(copy_, completions, checkpointing=True)
    assert with_checkpointing < 0.7 * without
    assert not any(m.training for m in copy_.modules())  # eval mode again after the training forward


def test_checkpointing_leaves_sampling_in_eval_mode_with_its_cache(micro_policy):
    model, tokenizer = micro_policy()
    completions, advantages = _batch(model, tokenizer)
    learner = PolicyLearner(model, GRPOConfig(gradient_checkpointing=True, max_new_tokens=6))
    learner.update(completions, advantages)
    assert not any(m.training for m in model.modules())
    assert any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
    again, _ = _batch(model, tokenizer)  # sampling still runs with its KV cache
    assert again.completion_ids.shape[0] == completions.completion_ids.shape[0]


# -- logits only where a completion token is predicted ------------------------------------------------------


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_lm_head_runs_only_at_completion_positions(real_models, architecture):
    model, tokenizer = real_models[architecture]
    completions, _ = _batch(model, tokenizer)
    seen = []
    handle = model.get_output_embeddings().register_forward_hook(lambda module, args, out: seen.append(out.shape))
    try:
        packed = completion_logprobs(model, completions)
    finally:
        handle.remove()
    (shape,) = seen
    lengths = completions.completion_mask.sum(-1)
    # one head row per distinct predicting position: each completion token but a prompt's G first ones share one
    assert shape[:2] == (1, int(lengths.sum()) - (G - 1) * len(PROMPTS))
    plain = full_sequence_logprobs(model, completions) * completions.completion_mask
    torch.testing.assert_close(packed, plain, atol=1e-5, rtol=1e-5)


def test_a_lora_adapter_micro_batches_and_checkpoints_to_the_same_gradient(real_model_dirs):
    """With LoRA (one peft base, the reference = adapters disabled) the two memory knobs change nothing either."""
    from marl.scenario.spec import LoraSpec
    from trainers.policy.adapters import AdapterBase

    results = []
    for knobs in ({}, {"gradient_checkpointing": True, "max_tokens_per_microbatch": 16}):
        model, tokenizer = load_policy(real_model_dirs["qwen2"])
        adapter = AdapterBase(model, real_model_dirs["qwen2"], tokenizer).add("alice", LoraSpec(r=4, alpha=8.0))
        for name, parameter in adapter.named_parameters():  # B starts at 0: give A a gradient too
            if "lora_B" in name:
                torch.nn.init.normal_(parameter, std=0.1, generator=torch.Generator().manual_seed(1))
        completions, advantages = _batch(adapter, tokenizer)
        update = PolicyLearner(adapter, GRPOConfig(lr=1e-30, max_grad_norm=1e9, spike_factor=0.0, beta=0.04,
                                                   max_new_tokens=6, **knobs)).update(completions, advantages)
        results.append((update["loss"], {name: p.grad.clone() for name, p in adapter.named_parameters()}))
    (loss, expected), (other, actual) = results
    assert other == pytest.approx(loss, abs=1e-6)
    _assert_close(expected, actual)


# -- the per-row layout: no mask built, for varlen (flash) attention ------------------------------------------


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_the_per_row_layout_passes_no_mask_and_gives_the_plain_logprobs(real_model_dirs, architecture,
                                                                         implementation):
    model, tokenizer = load_policy(real_model_dirs[architecture])
    model.set_attn_implementation(implementation)
    completions, _ = _batch(model, tokenizer)
    masks = []
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: masks.append(kwargs.get("attention_mask")),
                                             with_kwargs=True)
    try:
        per_row = completion_logprobs(model, completions, packing="per_row")
        shared = completion_logprobs(model, completions, packing="shared_prompt")
    finally:
        handle.remove()
    assert masks[0] is None and masks[1].dim() == 4  # per row: transformers finds the segments from the positions
    plain = full_sequence_logprobs(model, completions) * completions.completion_mask
    torch.testing.assert_close(per_row, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_both_layouts_give_the_same_loss_and_gradient(real_models, architecture):
    model, tokenizer = real_models[architecture]
    completions, advantages = _batch(model, tokenizer)
    shared, expected = _gradients(model, completions, advantages, packing="shared_prompt", beta=0.04)
    per_row, actual = _gradients(model, completions, advantages, packing="per_row", beta=0.04,
                                 max_tokens_per_microbatch=24)
    assert per_row["loss"] == pytest.approx(shared["loss"], abs=1e-6)
    _assert_close(expected, actual)


def test_auto_packing_is_per_row_under_flash_attention_only(real_models):
    from trainers.policy.generation import resolve_packing

    model, _ = real_models["qwen2"]
    assert resolve_packing(model) == "shared_prompt" and resolve_packing(model, "per_row") == "per_row"
    flash = copy.deepcopy(model)
    flash.config._attn_implementation = "flash_attention_2"  # what loading with flash-attn sets; no kernel runs here
    assert resolve_packing(flash) == "per_row" and resolve_packing(flash, "shared_prompt") == "shared_prompt"
    with pytest.raises(ValueError, match="packing 'rows'"):
        resolve_packing(model, "rows")


@pytest.mark.skipif(torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None,
                    reason="this machine can run flash attention")
def test_an_attention_the_machine_lacks_is_one_line_before_training(demo_model_dir, tmp_path, capsys):
    from trainers.cli.main import main

    out = tmp_path / "run"
    assert main(["run", "relay", "--set", "train.attention=flash_attention_2", "--tracker", "none",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "train.attention=flash_attention_2: this model or machine cannot use it" in err and "use auto" in err
    assert not (out / "metrics.jsonl").exists()
