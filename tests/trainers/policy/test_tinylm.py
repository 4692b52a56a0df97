"""The embedded tiny model: a Qwen2 chat model with a locally trained BPE tokenizer; deterministic build,
a disk cache keyed by the recipe, the demonstrations and the build code, loading through plain transformers."""

import json

import pytest
import torch

from trainers.policy import tinylm
from trainers.policy.prompts import DEFAULT_STYLE, TurnStyle
from trainers.policy.tinylm import (TinyLMRecipe, build_or_load_tiny_model, build_tiny_tokenizer, cache_key,
                                    init_tiny_model, load_policy)
from trainers.policy.tokenizer import build_bpe_tokenizer

MICRO = dict(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32, sft_max_steps=6,
             sft_batch_size=8, sft_warmup_steps=2)
DEMOS = [(f"{a}+{b}=", str(a + b), DEFAULT_STYLE) for a in range(10, 20) for b in range(10, 20)]
WORDY = [("Forecast for Paris: sunny, 21 C. What should I wear?", "A t-shirt.", TurnStyle(role="You advise."))] * 4


def test_the_tokenizer_is_byte_level_bpe_with_chatml_and_digits_one_by_one():
    tokenizer = build_tiny_tokenizer(TinyLMRecipe(), DEMOS + WORDY)
    ids = tokenizer("12+35=", add_special_tokens=False)["input_ids"]
    assert [tokenizer.decode([i]) for i in ids] == ["1", "2", "+", "3", "5", "="]  # digits read one by one
    words = tokenizer("Forecast for Paris", add_special_tokens=False)["input_ids"]
    assert len(words) < len("Forecast for Paris") / 2  # real subwords, not characters
    assert tokenizer.decode(tokenizer("naïve ☃ text never seen", add_special_tokens=False)["input_ids"]) \
        == "naïve ☃ text never seen"  # byte level: nothing is unknown
    prompt = tokenizer.apply_chat_template([{"role": "system", "content": "You advise."},
                                            {"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>system\nYou advise.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.padding_side == "left" and len(tokenizer) <= TinyLMRecipe().vocab_size


def test_the_tokenizer_is_deterministic():
    a, b = (build_bpe_tokenizer(["the cat sat on the mat", "SELECT * FROM t;"] * 3, 300) for _ in range(2))
    assert a.get_vocab() == b.get_vocab()
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()


def test_default_recipe_is_a_small_qwen2_with_a_long_context():
    recipe = TinyLMRecipe()
    tokenizer = build_tiny_tokenizer(recipe, DEMOS)
    model = init_tiny_model(recipe, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= params <= 5_000_000
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.max_position_embeddings == 2048
    assert model.generation_config.eos_token_id == [tokenizer.convert_tokens_to_ids("<|im_end|>"),
                                                    tokenizer.convert_tokens_to_ids("<|endoftext|>")]


def test_cache_key_follows_recipe_demonstrations_and_build_code(monkeypatch):
    base = cache_key(TinyLMRecipe(), DEMOS)
    assert cache_key(TinyLMRecipe(), list(DEMOS)) == base
    assert cache_key(TinyLMRecipe(seed=1), DEMOS) != base
    assert cache_key(TinyLMRecipe(), DEMOS[:-1]) != base
    assert cache_key(TinyLMRecipe(), [(o, m, TurnStyle(role="x")) for o, m, _ in DEMOS]) != base
    # a change to the build code is a new key: a cache built by older code is never reused
    monkeypatch.setattr(tinylm, "build_code_version", lambda: "older-code")
    assert cache_key(TinyLMRecipe(), DEMOS) != base


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
    assert report["build_code"] == tinylm.build_code_version()

    logs.clear()
    again = build_or_load_tiny_model(recipe, DEMOS, cache_dir=tmp_path / "a", log=logs.append)
    assert again == first and logs == [f"tiny model: cached at {first}"]

    from transformers import AutoModelForCausalLM, AutoTokenizer

    auto = AutoModelForCausalLM.from_pretrained(first)  # plain transformers, no marl code
    plain = AutoTokenizer.from_pretrained(first)
    assert plain.decode(tokenizer("7=")["input_ids"]) == "7=" and plain.chat_template == tokenizer.chat_template
    assert torch.equal(auto.lm_head.weight, model_a.lm_head.weight)


def test_the_warm_up_trains_on_chat_rendered_turns_ended_by_im_end(tmp_path, monkeypatch):
    seen = []
    real = tinylm.sft_warmup
    monkeypatch.setattr(tinylm, "sft_warmup", lambda model, tokenizer, demos, *a, **k:
                        seen.append((tokenizer, demos)) or real(model, tokenizer, demos, *a, **k))
    build_or_load_tiny_model(TinyLMRecipe(**MICRO), WORDY, cache_dir=tmp_path, log=lambda m: None)
    tokenizer, demos = seen[0]
    prompt, answer, end = demos[0]
    assert prompt == ("<|im_start|>system\nYou advise.<|im_end|>\n<|im_start|>user\nForecast for Paris: sunny, "
                      "21 C. What should I wear?<|im_end|>\n<|im_start|>assistant\n")
    assert answer == "A t-shirt." and end == tokenizer.convert_tokens_to_ids("<|im_end|>")


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
    from trainers.policy.tinylm import _sft_batch, sft_warmup

    model, tokenizer = micro_policy()
    recipe = TinyLMRecipe(sft_max_steps=60, sft_batch_size=16, sft_warmup_steps=5, sft_lr=3e-3)
    pairs = [(o, m) for o, m, _ in DEMOS]
    ids, mask, labels = _sft_batch(tokenizer, pairs[:32])
    before = model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
    sft_warmup(model, tokenizer, pairs, recipe, log=lambda m: None)
    after = model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
    assert after < 0.7 * before


def test_a_build_needs_demonstrations(tmp_path):
    with pytest.raises(ValueError, match="at least one demonstration"):
        build_or_load_tiny_model(TinyLMRecipe(**MICRO), [], cache_dir=tmp_path, log=lambda m: None)


def test_load_policy_rejects_a_directory_without_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy(tmp_path)


def test_a_build_under_way_elsewhere_is_waited_for_not_repeated(tmp_path):
    """While another process holds the build lock (here: this test, building the model itself), a
    second request says it waits, then loads what the other built instead of building it again."""
    import threading

    from filelock import FileLock

    recipe = TinyLMRecipe(**MICRO)
    target = tmp_path / "models" / f"tinylm-{cache_key(recipe, DEMOS)}"
    target.parent.mkdir(parents=True)
    waiting, logs, result = threading.Event(), [], []

    def log(line):
        logs.append(line)
        if "waiting for it" in line:
            waiting.set()

    other = FileLock(str(target.parent / f".{target.name}.lock"))
    with other:
        second = threading.Thread(target=lambda: result.append(
            build_or_load_tiny_model(recipe, DEMOS, cache_dir=tmp_path, log=log)))
        second.start()
        assert waiting.wait(timeout=600)  # a hang guard only: the line comes as soon as the lock is tried
        tinylm._build_tiny_model(recipe, DEMOS, None, target, log=lambda m: None)  # "the other process"
    second.join()
    assert result == [target]
    assert not any(line.startswith("tiny model: building") for line in logs)
    assert logs[-1] == f"tiny model: cached at {target} (built by another process meanwhile)"
