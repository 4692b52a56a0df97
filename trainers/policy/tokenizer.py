"""A byte-level BPE tokenizer with ChatML tokens and chat template, trained locally with `tokenizers`.

    tokenizer = build_bpe_tokenizer(texts, vocab_size=1024)   # a PreTrainedTokenizerFast
    tokenizer.apply_chat_template(messages, add_generation_prompt=True)

No hub is reachable, so the embedded default model (trainers/policy/tinylm.py), the benches' realistic
models (bench/support/real_model.py) and the tests' random Qwen2 / Llama / GPT-2 fixtures all train
their tokenizer here, on their own texts. It is Qwen2's design: NFC normalisation, Qwen2's
pre-tokenising split (every digit its own token, so numbers read digit by digit), byte-level BPE over
the 256 byte symbols (any text encodes: there is no unknown token), `<|endoftext|>` as the pad,
`<|im_end|>` as eos (the end of an assistant turn) and `<|im_start|>` opening each turn. Saved with
`save_pretrained`, plain `AutoTokenizer.from_pretrained` loads it with no marl code.

`GENERAL_TEXT` is the general text the project ships for the embedded model's tokenizer, next to a
scenario's own texts: a little prose, arithmetic, code, SQL and dialogue, so that common words and
symbols are whole tokens whichever scenario the model was built for.
"""

from __future__ import annotations

from collections.abc import Iterable

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_end|>"
# Qwen2's pre-tokenising split: transformers rebuilds exactly this when it loads a qwen2 directory, so a
# saved tokenizer splits text the same way under every architecture
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

GENERAL_TEXT = (
    "You are a helpful assistant. Answer the question, then stop.",
    "The user asks a question and the assistant answers it in one short line.",
    "Read the task carefully. Think about what is asked, and write only the answer.",
    "If the answer is a number, write the number. If it is a word, write the word.",
    "Two agents work together: the first one plans, the second one checks the result.",
    "The weather today is sunny in the morning, cloudy at noon and rainy in the evening.",
    "Temperatures are given in degrees Celsius; the wind speed is given in kilometres per hour.",
    "What is the total? 12+35=47. 3+4=7. 100-58=42. 6*7=42. The sum of 19 and 23 is 42.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 20 25 50 99 100 250 1000 2026.",
    "def add(a, b):\n    return a + b\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "import math\n\nfor index, value in enumerate(values):\n    if value > 0:\n        print(index, value)\n",
    "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def step(self):\n        self.count += 1\n",
    "SELECT name, COUNT(*) FROM orders JOIN customers ON orders.customer_id = customers.id "
    "WHERE total > 100 GROUP BY name ORDER BY name;",
    "SELECT AVG(price) FROM products WHERE category = 'books' AND stock IS NOT NULL;",
    "I propose that we split it evenly. I accept your offer. I reject the offer, and I counter with 60.",
    "The motion is that cities should ban cars. I argue for the motion, because the air gets cleaner. "
    "My opponent argues against it, but the evidence shows otherwise.",
    "Call a tool by writing its name and arguments, for example: weather(city=\"Paris\").",
    "ANSWER: 42. FINAL: yes. Result: no. Score: 1.0 out of 1.0.",
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday; January February March April May June.",
    "Paris London Berlin Madrid Rome Tokyo Sydney Cairo Lima Oslo Vienna Lisbon Dublin Prague Warsaw.",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,:;!?()[]{}<>=+-*/%&|^~'\"#_@$\\\n\t",
)


def build_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 1024, *, repeat: int = 1):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts` (each `repeat` times), with ChatML
    tokens and template, left padding (batched generation pads prompts on the left).

    Deterministic: the same texts and size give the same merges (one trainer, no randomness). The
    vocabulary is at most `vocab_size`: a small corpus stops earlier, when no pair is left to merge.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(list(texts) * repeat, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                        additional_special_tokens=["<|im_start|>"], padding_side="left")
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def end_ids(tokenizer) -> list[int]:
    """The ids a ChatML model's generation config lists as eos: <|im_end|> then <|endoftext|> (as
    Qwen2.5-Instruct's does), so generation stops at either."""
    return [tokenizer.convert_tokens_to_ids(token) for token in (EOS_TOKEN, PAD_TOKEN)]
