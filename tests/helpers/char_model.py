"""A micro character-level Llama for fast unit tests: one token per character, left padding, no chat
template (the plain-text prompt path). The embedded default is a BPE chat model (trainers/policy/tinylm.py);
this one exists because its one-token-per-character prompts make token counts easy to reason about.
"""

from __future__ import annotations

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


def build_char_tokenizer(alphabet: str):
    """A character-level fast tokenizer: one token per character, left padding, no BOS added."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet {alphabet!r} repeats a character")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(alphabet)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", padding_side="left")


def micro_char_llama(seed: int = 0, *, alphabet: str | None = None, hidden: int = 32, layers: int = 2,
                     heads: int = 2, intermediate: int = 64, positions: int = 32):
    """(model, tokenizer): a seeded, untrained LlamaForCausalLM in eval mode and its char tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from marl.addition import ALPHABET

    tokenizer = build_char_tokenizer(alphabet or ALPHABET)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=intermediate, max_position_embeddings=positions,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float().eval(), tokenizer
