"""The embedded tiny model: tokenizer, deterministic build, disk cache, loading through transformers."""

import json

import pytest
import torch

from trainers.policy.tinylm import (TinyLMRecipe, build_char_tokenizer, build_or_load_tiny_model, init_tiny_model,
                             load_policy)

MICRO = dict(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, sft_max_steps=6, sft_batch_size=8,
             sft_warmup_steps=2)
DEMOS = [(f"{a}+{b}=", str(a + b)) for a in range(10, 20) for b in range(10, 20)]


def test_char_tokenizer_round_trips_and_adds_no_bos():
    tokenizer = build_char_tokenizer("0123456789+=")
    ids = tokenizer("12+35=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 6 and tokenizer.bos_token_id not in ids
    assert tokenizer.decode(ids) == "12+35="
    assert tokenizer.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=True) == "12+35="
    assert tokenizer("x", add_special_tokens=False)["input_ids"] == [tokenizer.unk_token_id]
    assert len(tokenizer) == 16 and tokenizer.padding_side == "left"


def test_tokenizer_rejects_repeated_characters():
    with pytest.raises(ValueError, match="repeats"):
        build_char_tokenizer("0123455")


def test_default_recipe_is_a_small_llama():
    recipe = TinyLMRecipe()
    tokenizer = build_char_tokenizer(recipe.alphabet)
    model = init_tiny_model(recipe, len(tokenizer), 0, 1, 2)
    params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= params <= 5_000_000
    assert type(model).__name__ == "LlamaForCausalLM"


def test_recipe_key_is_stable_and_sensitive():
    assert TinyLMRecipe().key() == TinyLMRecipe().key()
    assert TinyLMRecipe(seed=1).key() != TinyLMRecipe().key()
    assert TinyLMRecipe(hidden_size=64).key() != TinyLMRecipe().key()


def test_build_is_deterministic_cached_and_loads_with_auto_classes(tmp_path):
    recipe = TinyLMRecipe(**MICRO)
    logs = []
    first = build_or_load_tiny_model(recipe, DEMOS, cache_dir=tmp_path / "a", log=logs.append)
    second = build_or_load_tiny_model(recipe, DEMOS, cache_dir=tmp_path / "b", log=logs.append)
    assert any("building" in line for line in logs)
    model_a, tokenizer = load_policy(first)
    model_b, _ = load_policy(second)
    for (name, a), (_, b) in zip(model_a.state_dict().items(), model_b.state_dict().items()):
        assert torch.equal(a, b), f"{name} differs between two builds of the same recipe"
    report = json.loads((first / "marl_build.json").read_text())
    assert report["recipe"]["hidden_size"] == 16 and report["sft"]["steps"] == 6

    logs.clear()
    again = build_or_load_tiny_model(recipe, DEMOS, cache_dir=tmp_path / "a", log=logs.append)
    assert again == first and logs == [f"tiny model: cached at {first}"]

    from transformers import AutoModelForCausalLM, AutoTokenizer

    auto = AutoModelForCausalLM.from_pretrained(first)
    assert AutoTokenizer.from_pretrained(first).decode(tokenizer("7=")["input_ids"]) == "7="
    assert torch.equal(auto.lm_head.weight, model_a.lm_head.weight)


def test_sft_lowers_the_loss_and_stops_at_the_target(tmp_path):
    calls = []

    def accuracy(model, tokenizer):
        calls.append(1)
        return 1.0  # target reached at the first check

    recipe = TinyLMRecipe(**{**MICRO, "sft_max_steps": 50, "sft_eval_every": 5})
    path = build_or_load_tiny_model(recipe, DEMOS, accuracy, cache_dir=tmp_path, log=lambda m: None)
    report = json.loads((path / "marl_build.json").read_text())["sft"]
    assert report["steps"] == 5 and len(calls) == 1


def test_sft_learns_the_demonstrations(micro_policy):
    from trainers.policy.tinylm import sft_warmup

    model, tokenizer = micro_policy()
    recipe = TinyLMRecipe(sft_max_steps=60, sft_batch_size=16, sft_warmup_steps=5, sft_lr=3e-3)
    from trainers.policy.tinylm import _sft_batch

    ids, mask, labels = _sft_batch(tokenizer, DEMOS[:32])
    before = model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
    sft_warmup(model, tokenizer, DEMOS, recipe, log=lambda m: None)
    after = model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
    assert after < 0.7 * before


def test_load_policy_rejects_a_directory_without_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy(tmp_path)
