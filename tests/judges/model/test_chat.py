"""common/chat.py: the one rendering of a turn, the end tokens, and the model-directory checks; and
the local backend behind `marl serve` using them (the template on the prompt, a stop at every eos)."""

import pytest

from helpers.bad_models import broken_model_dir

MESSAGES = [{"role": "system", "content": "You are the solver."}, {"role": "user", "content": "12+35="}]
CHATML = ("<|im_start|>system\nYou are the solver.<|im_end|>\n<|im_start|>user\n12+35=<|im_end|>\n"
          "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def chatml(real_model_dirs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_model_dirs["qwen2"])


def test_render_chat_applies_the_template_with_the_generation_prompt(chatml):
    from common.chat import render_chat, uses_template

    assert uses_template(chatml) and render_chat(chatml, MESSAGES) == CHATML
    assert not uses_template(chatml, "none") and render_chat(chatml, MESSAGES, "none") == "You are the solver.\n12+35="
    with pytest.raises(ValueError, match="expected one of auto, none"):
        render_chat(chatml, MESSAGES, "chatml")


def test_a_tokenizer_without_a_template_gets_the_plain_text():
    from types import SimpleNamespace

    from common.chat import end_of_turn_id, render_chat

    tokenizer = SimpleNamespace(chat_template=None, eos_token_id=2)  # as the embedded character tokenizer
    assert render_chat(tokenizer, MESSAGES) == "You are the solver.\n12+35="
    assert end_of_turn_id(tokenizer) == tokenizer.eos_token_id


def test_the_end_of_turn_is_the_token_that_closes_an_assistant_message(chatml):
    from common.chat import end_of_turn_id

    assert end_of_turn_id(chatml) == chatml.convert_tokens_to_ids("<|im_end|>")


def test_stop_ids_join_the_generation_config_list_the_eos_and_the_end_of_turn(chatml):
    from types import SimpleNamespace

    from common.chat import stop_token_ids

    im_end, text_end = (chatml.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[text_end, im_end]))
    assert stop_token_ids(model, chatml) == [text_end, im_end]
    assert stop_token_ids(SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=text_end)), chatml) == \
        [text_end, im_end]
    assert stop_token_ids(SimpleNamespace(), chatml) == [im_end]  # no generation config: the tokenizer's


def test_ensure_pad_token_pads_with_eos_and_refuses_a_tokenizer_with_neither():
    from types import SimpleNamespace

    from common.chat import ensure_pad_token

    lines = []
    tokenizer = SimpleNamespace(pad_token_id=None, eos_token_id=5, eos_token="</s>", pad_token=None)
    assert ensure_pad_token(tokenizer, lines.append).pad_token == "</s>" and len(lines) == 1
    with pytest.raises(ValueError, match="neither a pad token nor an eos token"):
        ensure_pad_token(SimpleNamespace(pad_token_id=None, eos_token_id=None))


@pytest.mark.parametrize("kind, expected", [
    ("no_config", "is not a Hugging Face model directory (no config.json); pass a directory written by save_pretrained"),
    ("bad_config", ": the config.json does not load ("),
    ("no_eos", ": the tokenizer has neither a pad token nor an eos token; set tokenizer.eos_token"),
])
def test_check_model_dir_names_the_problem_in_one_line(real_model_dirs, tmp_path, kind, expected):
    from common.chat import check_model_dir

    problem = check_model_dir(broken_model_dir(real_model_dirs["llama"], tmp_path / kind, kind))
    assert expected in problem and "\n" not in problem
    assert check_model_dir(tmp_path / "missing").endswith("is not a directory; pass a directory written by "
                                                          "save_pretrained (config.json, weights, tokenizer)")


def test_a_tokenizer_with_eos_but_no_pad_is_accepted_and_pads_with_eos(real_model_dirs, tmp_path):
    from common.chat import check_model_dir
    from judges.model.local_backend import LocalModel

    directory = broken_model_dir(real_model_dirs["llama"], tmp_path / "no_pad", "no_pad")
    assert check_model_dir(directory) is None
    tokenizer = LocalModel(directory).tokenizer
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"


@pytest.mark.parametrize("end", ["<|im_end|>", "<|endoftext|>"])
def test_the_served_model_sees_the_template_and_stops_at_every_eos(real_model_dirs, chatml, end):
    from judges.model.local_backend import LocalModel

    served = LocalModel(real_model_dirs["gpt2"], name="m")
    assert served.tokenizer.decode(served._prompt_ids(MESSAGES)[0].tolist()) == CHATML
    said = served.tokenizer("ANSWER: 47", add_special_tokens=False)["input_ids"]
    forced, calls = said + [served.tokenizer.convert_tokens_to_ids(end), said[0]], []

    def force(module, inputs, output):  # the model emits `forced` in order, one token per forward
        output = output.clone()
        output[..., forced[min(len(calls), len(forced) - 1)]] += 1e4
        calls.append(1)
        return output

    served.model.get_output_embeddings().register_forward_hook(force)
    answer = served.chat({"messages": MESSAGES, "max_tokens": 12, "temperature": 0})
    choice = answer["choices"][0]
    assert choice["message"]["content"] == "ANSWER: 47" and choice["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == len(said) + 1
