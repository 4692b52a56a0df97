"""The real-architecture fixtures (tests/helpers/real_models.py) are what a user's checkpoint looks like:
plain transformers loads them, the tokenizer round-trips, and the chat template and eos list are there."""

import pytest

from helpers.real_models import ARCHITECTURES, build_bpe_tokenizer

TEXT = "You are the solver. Task: 12+35= ANSWER: 47"


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_a_fixture_loads_with_plain_transformers_and_keeps_its_tokenizer(real_model_dirs, architecture):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = real_model_dirs[architecture]
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    built = build_bpe_tokenizer()
    assert model.config.model_type == architecture
    assert tokenizer(TEXT)["input_ids"] == built(TEXT)["input_ids"]
    assert tokenizer.decode(tokenizer(TEXT)["input_ids"]) == TEXT
    ends = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    assert set(model.generation_config.eos_token_id) == ends and tokenizer.pad_token == "<|endoftext|>"


def test_the_chat_template_renders_chatml(real_model_dirs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(real_model_dirs["qwen2"])
    text = tokenizer.apply_chat_template([{"role": "system", "content": "You are the solver."},
                                          {"role": "user", "content": "12+35="}],
                                         tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are the solver.<|im_end|>\n<|im_start|>user\n12+35=<|im_end|>\n"
                    "<|im_start|>assistant\n")
