"""`marl export --gguf` (trainers/policy/gguf_export.py): a model written as GGUF converts back (trainers/policy/
gguf.py) into a model with the same logits and a tokenizer that gives the same ids and text; a model GGUF
cannot hold is one line, exit 2, and nothing already written is lost."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.cli import one_error_line
from helpers.inprocess import marl_in_process

gguf = pytest.importorskip("gguf")

TEXTS = ("Task: 12+35= ANSWER: 47.", "def add(a, b):\n    return a + b\n", "  two  spaces\tand a tab\n",
         "Café déjà vu: 3.50 EUR", "<|im_start|>user\nhi<|im_end|>\n")


def exported_and_back(directory: Path, tmp_path: Path, *extra: str) -> tuple[Path, Path]:
    """(the GGUF file `marl export --gguf` wrote for `directory`, that file converted back into a directory)."""
    from trainers.policy.gguf import convert_gguf

    out = tmp_path / f"{directory.name}.gguf"
    result = marl_in_process("export", str(directory), "--gguf", "--out", str(out), *extra)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {out} ({directory.name}, GGUF ")
    return out, convert_gguf(out, tmp_path / "cache", log=lambda line: None)


def logits(directory: Path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_an_exported_file_converts_back_to_the_same_logits_and_tokenizer(real_model_dirs, tmp_path, architecture):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = real_model_dirs[architecture]
    _, back = exported_and_back(source, tmp_path)
    before, after = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(back)
    for text in TEXTS:
        ids = before(text, add_special_tokens=False)["input_ids"]
        assert after(text, add_special_tokens=False)["input_ids"] == ids
        assert after.decode(ids) == text
    ids = before("".join(TEXTS))["input_ids"]
    torch.testing.assert_close(logits(back, ids), logits(source, ids), rtol=0, atol=1e-4)
    assert type(AutoModelForCausalLM.from_pretrained(back)).__name__ == \
        type(AutoModelForCausalLM.from_pretrained(source)).__name__
    assert after.chat_template == before.chat_template
    assert (after.eos_token, after.pad_token) == (before.eos_token, before.pad_token) == ("<|im_end|>", "<|endoftext|>")


def test_f16_holds_the_matrices_in_half_precision_and_the_norms_in_f32(real_model_dirs, tmp_path):
    source = real_model_dirs["llama"]
    file, back = exported_and_back(source, tmp_path, "--dtype", "f16")
    types = {tensor.name: tensor.tensor_type.name for tensor in gguf.GGUFReader(file).tensors}
    assert types["blk.0.attn_q.weight"] == "F16" and types["token_embd.weight"] == "F16"
    assert types["blk.0.attn_norm.weight"] == "F32" and types["output_norm.weight"] == "F32"
    assert "output.weight" not in types  # tied: the reader ties it back to token_embd
    ids = list(range(3, 60))
    torch.testing.assert_close(logits(back, ids), logits(source, ids), rtol=0, atol=2e-2)


def test_the_llama_permutation_is_the_one_transformers_reverses():
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    from trainers.policy.gguf_export import llama_cpp_permute

    weights = np.arange(16 * 6, dtype=np.float32).reshape(16, 6)
    for heads in (1, 2, 4):
        permuted = llama_cpp_permute(weights, heads)
        assert not np.array_equal(permuted, weights)
        assert np.array_equal(LlamaTensorProcessor()._reverse_permute_weights(permuted, heads, heads), weights)


def test_a_model_gguf_cannot_hold_is_one_line_and_an_existing_file_is_kept(real_model_dirs, micro_policy, tmp_path):
    out = tmp_path / "model.gguf"
    out.write_bytes(b"the file a previous export wrote")
    line = one_error_line(marl_in_process("export", str(real_model_dirs["gpt2"]), "--gguf", "--out", str(out)))
    assert "GPT2LMHeadModel cannot be written as GGUF" in line and "marl export without --gguf" in line
    model, tokenizer = micro_policy()
    model.save_pretrained(tmp_path / "char")
    tokenizer.save_pretrained(tmp_path / "char")
    line = one_error_line(marl_in_process("export", str(tmp_path / "char"), "--gguf", "--out", str(out)))
    assert "not byte-level BPE" in line or "no tokenizer.json" in line
    assert out.read_bytes() == b"the file a previous export wrote"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_dtype_without_gguf_and_a_folder_in_the_way_are_one_line(real_model_dirs, tmp_path):
    line = one_error_line(marl_in_process("export", str(real_model_dirs["llama"]), "--dtype", "f16", "--out",
                                          str(tmp_path / "x")))
    assert line.startswith("marl: error: --dtype f16: only --gguf") and not (tmp_path / "x").exists()
    (tmp_path / "taken.gguf").mkdir()
    line = one_error_line(marl_in_process("export", str(real_model_dirs["llama"]), "--gguf", "--out",
                                          str(tmp_path / "taken.gguf")))
    assert "is a folder; give a file path ending in .gguf" in line


def test_a_folder_out_gets_one_file_named_after_the_model(real_model_dirs, tmp_path):
    result = marl_in_process("export", str(real_model_dirs["qwen2"]), "--gguf", "--out", str(tmp_path / "exported"))
    assert result.returncode == 0, result.stderr
    assert [p.name for p in (tmp_path / "exported").iterdir()] == ["qwen2.gguf"]
    reader = gguf.GGUFReader(tmp_path / "exported" / "qwen2.gguf")
    assert reader.fields["general.architecture"].contents() == "qwen2"
    assert reader.fields["tokenizer.ggml.pre"].contents() == "qwen2"


@pytest.mark.real
def test_the_packaged_smollm2_exports_and_converts_back(tmp_path):
    from transformers import AutoTokenizer

    from trainers.policy.gguf import resolve_model_dir

    directory = resolve_model_dir("smollm2-135m-instruct", tmp_path / "cache", log=lambda line: None)
    _, back = exported_and_back(directory, tmp_path, "--dtype", "f16")
    before, after = AutoTokenizer.from_pretrained(directory), AutoTokenizer.from_pretrained(back)
    for text in TEXTS:
        assert after(text)["input_ids"] == before(text)["input_ids"]
    ids = before("The capital of France is")["input_ids"]
    torch.testing.assert_close(logits(back, ids), logits(directory, ids), rtol=0, atol=5e-2)
