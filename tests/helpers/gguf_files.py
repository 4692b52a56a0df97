"""Small GGUF files written with gguf.GGUFWriter for tests (no hub is reachable): a random 2-layer Llama in
F32 (or Q8_0) with the project's byte-level BPE tokenizer and ChatML, of any `general.architecture`.

    path = write_tiny_gguf(tmp_path / "tiny.gguf")                          # converts with trainers/policy/gguf.py
    write_tiny_gguf(tmp_path / "odd.gguf", architecture="marl-unknown-arch")  # one transformers cannot convert
    write_tiny_gguf(tmp_path / "plain.gguf", chat_template=None)             # no chat template
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_tiny_gguf(path: Path, *, seed: int = 0, pre: str = "qwen2", architecture: str = "llama",
                    quantized: bool = False, chat_template: str | None = "chatml") -> Path:
    """A 2-layer Llama (hidden 32, grouped-query attention) with random F32 weights (`quantized`: the
    matrices in Q8_0) and a 300-token byte-level BPE tokenizer (tokenizer.ggml.model gpt2) with ChatML's
    tokens and template (`chat_template`: None for none, or a template of its own)."""
    import gguf

    from trainers.policy.tokenizer import CHATML_TEMPLATE, GENERAL_TEXT, build_bpe_tokenizer

    tokenizer = build_bpe_tokenizer(GENERAL_TEXT, 300)
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    tokens = [token for token, _ in sorted(state["model"]["vocab"].items(), key=lambda kv: kv[1])]
    specials = {added["id"] for added in state["added_tokens"]}
    hidden, layers, heads, kv_heads, ff, vocab = 32, 2, 4, 2, 64, len(tokens)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in specials else 1 for i in range(vocab)])  # 3: control (special) tokens
    writer.add_token_merges([" ".join(pair) for pair in state["model"]["merges"]])
    writer.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|im_start|>"))
    writer.add_eos_token_id(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(CHATML_TEMPLATE if chat_template == "chatml" else chat_template)

    def weight(name: str, *shape: int, scale: float = 0.1, offset: float = 0.0) -> None:
        values = (offset + rng.standard_normal(shape) * scale).astype(np.float32)
        if quantized and len(shape) == 2:
            kind = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, values)

    weight("token_embd.weight", vocab, hidden)
    for block in range(layers):
        weight(f"blk.{block}.attn_norm.weight", hidden, scale=0.05, offset=1.0)
        weight(f"blk.{block}.attn_q.weight", hidden, hidden)
        weight(f"blk.{block}.attn_k.weight", hidden * kv_heads // heads, hidden)
        weight(f"blk.{block}.attn_v.weight", hidden * kv_heads // heads, hidden)
        weight(f"blk.{block}.attn_output.weight", hidden, hidden)
        weight(f"blk.{block}.ffn_norm.weight", hidden, scale=0.05, offset=1.0)
        weight(f"blk.{block}.ffn_gate.weight", ff, hidden)
        weight(f"blk.{block}.ffn_up.weight", ff, hidden)
        weight(f"blk.{block}.ffn_down.weight", hidden, ff)
    weight("output_norm.weight", hidden, scale=0.05, offset=1.0)
    weight("output.weight", vocab, hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
