"""Small, randomly initialised models of real architectures (Qwen2, Llama, GPT-2) with a byte-level BPE
tokenizer and a ChatML chat template, built locally for tests (no hub is reachable).

    directory = build_model_dir("qwen2", tmp_path / "qwen2")
    model = AutoModelForCausalLM.from_pretrained(directory)      # plain transformers, no marl code
    tokenizer = AutoTokenizer.from_pretrained(directory)

The tokenizer's end of turn is `<|im_end|>`, its pad `<|endoftext|>`; the generation config lists both
as `eos_token_id` (as Qwen2.5-Instruct does), so a test can check that generation stops at either.
"""

from __future__ import annotations

from pathlib import Path

ARCHITECTURES = ("qwen2", "llama", "gpt2")
CORPUS = (
    "You are the planner. Break the task into steps and hand them on.",
    "You are the solver. Compute the answer and write it after ANSWER:.",
    "Task: 12+35= ANSWER: 47. Task: 3*4= ANSWER: 12. The weather in Paris is sunny, 21 C.",
    "SELECT name FROM users WHERE age > 30 ORDER BY name; def add(a, b): return a + b",
    "The debate motion: cities should ban cars. I argue for, because air quality improves.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:;!?()[]{}<>=+-*/'\"#_\n",
)


def build_bpe_tokenizer(texts=CORPUS, vocab_size: int = 400):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts`, with ChatML tokens and template
    (the library's own builder, trainers/policy/tokenizer.py, on this file's small corpus)."""
    from trainers.policy.tokenizer import build_bpe_tokenizer as build

    return build(texts, vocab_size, repeat=4)


def model_config(architecture: str, tokenizer, *, hidden: int = 32, layers: int = 2, heads: int = 4,
                 context: int = 512):
    """A small transformers config of `architecture` sized for `tokenizer`."""
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
               eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    if architecture == "gpt2":
        return GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=context, **ids)
    common = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                  max_position_embeddings=context, tie_word_embeddings=True, **ids)
    if architecture == "qwen2":
        return Qwen2Config(**common)
    if architecture == "llama":
        return LlamaConfig(**common)
    raise ValueError(f"unknown architecture {architecture!r}; known: {', '.join(ARCHITECTURES)}")


def build_model_dir(architecture: str, directory: Path, *, seed: int = 0, tokenizer=None, **sizes) -> Path:
    """Save a seeded random model of `architecture` and its BPE tokenizer as a standard HF directory."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from trainers.policy.tokenizer import end_ids

    tokenizer = tokenizer or build_bpe_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config(architecture, tokenizer, **sizes))
    model.generation_config = GenerationConfig(eos_token_id=end_ids(tokenizer), pad_token_id=tokenizer.pad_token_id)
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
