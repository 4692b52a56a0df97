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
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = (
    "You are the planner. Break the task into steps and hand them on.",
    "You are the solver. Compute the answer and write it after ANSWER:.",
    "Task: 12+35= ANSWER: 47. Task: 3*4= ANSWER: 12. The weather in Paris is sunny, 21 C.",
    "SELECT name FROM users WHERE age > 30 ORDER BY name; def add(a, b): return a + b",
    "The debate motion: cities should ban cars. I argue for, because air quality improves.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:;!?()[]{}<>=+-*/'\"#_\n",
)


def build_bpe_tokenizer(texts=CORPUS, vocab_size: int = 400):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts`, with ChatML tokens and template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    # Qwen2's own normaliser and pre-tokeniser: transformers rebuilds exactly these when it loads a
    # qwen2 directory, so the saved tokenizer splits text the same way under every architecture
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(list(texts) * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


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

    tokenizer = tokenizer or build_bpe_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config(architecture, tokenizer, **sizes))
    end_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    model.generation_config = GenerationConfig(eos_token_id=end_ids, pad_token_id=tokenizer.pad_token_id)
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
