"""dtype auto on a CPU: float32 weights under bfloat16 autocast where the hardware computes bfloat16."""

import copy
import json

import pytest
import torch

from trainers.policy.loading import (AUTOCAST_MIN_PARAMETERS, autocast_choice, cpu_bf16_flags, enable_autocast,
                                     place_autocast)


def small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def with_lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def linear_output_dtypes(model, ids) -> set:
    seen = set()
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    return seen


def test_the_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse avx2 avx512f amx_bf16 amx_tile\n\nprocessor : 1\n")
    assert cpu_bf16_flags(info) == ["amx_bf16"]
    info.write_text("flags : fpu sse avx2\n")
    assert cpu_bf16_flags(info) == []
    assert cpu_bf16_flags(tmp_path / "missing") == []


@pytest.mark.parametrize("setting, device, parameters, flags, expected", [
    ("auto", "cpu", AUTOCAST_MIN_PARAMETERS, ["avx512_bf16"], torch.bfloat16),
    ("auto", "cpu", AUTOCAST_MIN_PARAMETERS, [], None),                   # no native bfloat16
    ("auto", "cpu", AUTOCAST_MIN_PARAMETERS - 1, ["amx_bf16"], None),     # the tiny model stays exact
    ("float32", "cpu", AUTOCAST_MIN_PARAMETERS, ["amx_bf16"], None),      # asked for float32
    ("auto", "cuda", AUTOCAST_MIN_PARAMETERS, ["amx_bf16"], None),        # a GPU gets bfloat16 weights instead
])
def test_autocast_is_chosen_only_for_auto_on_a_cpu_with_native_bfloat16(setting, device, parameters, flags,
                                                                         expected):
    dtype, why = autocast_choice(setting, device, parameters, flags)
    assert dtype == expected and why
    if flags and expected is None and setting == "auto" and device == "cpu":
        assert f"{parameters:,}" in why


def test_a_lora_model_under_autocast_computes_in_bfloat16_and_keeps_float32_weights_and_gradients():
    model = with_lora(small_llama())
    ids = torch.randint(0, 64, (2, 12))
    plain = model(input_ids=ids).logits.float()
    assert linear_output_dtypes(model, ids) == {torch.float32}
    enable_autocast(model, torch.bfloat16)
    enable_autocast(model, torch.bfloat16)  # a second call changes nothing
    assert linear_output_dtypes(model, ids) == {torch.bfloat16}
    logits = model(input_ids=ids).logits.float()
    assert torch.allclose(logits, plain, atol=0.05) and not torch.equal(logits, plain)
    torch.nn.functional.cross_entropy(logits.view(-1, 64), ids.view(-1)).backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
                           for p in trained)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_a_deep_copy_autocasts_itself_and_saving_records_the_original_architecture(tmp_path):
    model = small_llama()
    enable_autocast(model, torch.bfloat16)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.zero_()  # the copy must compute with its own weights, not the original's
    ids = torch.randint(0, 64, (1, 8))
    assert linear_output_dtypes(reference, ids) == {torch.bfloat16}
    assert not torch.equal(reference(input_ids=ids).logits, model(input_ids=ids).logits)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


class Actor:
    def __init__(self, model):
        self.model = model


def test_place_autocast_logs_why_it_kept_float32_for_a_small_model():
    lines = []
    actors = {"a": Actor(small_llama()), "scripted": object()}
    assert place_autocast(actors, "auto", "cpu", lines.append) is None
    assert len(lines) == 1 and lines[0].startswith("precision: float32")
    assert linear_output_dtypes(actors["a"].model, torch.randint(0, 64, (1, 4))) == {torch.float32}


def test_a_lora_learner_is_sized_by_its_whole_model_not_by_the_adapter_it_trains(real_model_dirs, monkeypatch):
    """An AdapterPolicy's parameters() are its adapter's alone; the autocast threshold reads the base too."""
    from marl.scenario.sections import LoraSpec
    from trainers.policy import loading
    from trainers.policy.adapters import AdapterBase
    from trainers.policy.loading import load_policy, transformers_model

    model, tokenizer = load_policy(real_model_dirs["llama"])
    whole = sum(p.numel() for p in model.parameters())
    adapter = AdapterBase(model, real_model_dirs["llama"], tokenizer).add("alice", LoraSpec(r=4, alpha=8.0))
    trained = sum(p.numel() for p in adapter.parameters())
    assert trained < whole and transformers_model(adapter) is model
    monkeypatch.setattr(loading, "cpu_bf16_flags", lambda: ["amx_bf16"])
    monkeypatch.setattr(loading, "AUTOCAST_MIN_PARAMETERS", trained + 1)  # above the adapter, below the model
    assert place_autocast({"alice": Actor(adapter)}, "auto", "cpu", lambda line: None) == torch.bfloat16
    assert type(model).marl_autocast == torch.bfloat16
