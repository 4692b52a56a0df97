"""A realistic model for the benches: a randomly initialised Qwen2-architecture causal LM with a byte-level
BPE tokenizer trained locally with `tokenizers` (no hub is reachable), ChatML tokens and chat template,
saved as a standard directory that plain `AutoModelForCausalLM` / `AutoTokenizer` load.

    directory = build_model_dir("30m", cache / "qwen2-30m")   # sizes: SIZES (tiny, 30m, 0.5b)
    prompts = chat_prompts(tokenizer, count=64, tokens=100)   # ChatML-rendered prompts of ~100 tokens
    peak_rss_bytes(), current_rss_bytes()                     # this process, from the kernel

The tokenizer is trained on the texts the project ships (README, docs, scenario files and their libraries),
so its merges are real subwords. The 0.5b size is Qwen2.5-0.5B's shape (24 layers, hidden 896, 14
heads, 2 KV heads, MLP 4864, vocabulary 151936, tied embeddings): its embedding is padded past the
tokenizer's own vocabulary to that size, so the logits cost what they cost on the real model.
Built once per (size, seed, BUILD_VERSION) and cached; a bench must not import from tests/.
"""

from __future__ import annotations

import json
import random
import resource
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_VERSION = 2  # bump when anything below changes what is built
# hidden, layers, heads, kv heads, MLP width, vocabulary (None = the tokenizer's own)
SIZES = {
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, mlp=128, vocab=None),
    "30m": dict(hidden=512, layers=8, heads=8, kv_heads=2, mlp=1792, vocab=None),
    "0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, mlp=4864, vocab=151936),
}
TOKENIZER_VOCAB = 8192


def corpus() -> list[str]:
    """The project's own texts, one paragraph a line: README, the docs and every scenario file and library."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "scenarios").glob("*.yaml")),
             *sorted((ROOT / "scenarios").glob("*.py"))]
    paragraphs = []
    for path in files:
        paragraphs += [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    return paragraphs


def build_tokenizer(vocab_size: int = TOKENIZER_VOCAB):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `corpus()`, with ChatML tokens and template
    (marl's own builder, trainers/policy/tokenizer.py, the one the embedded default model uses)."""
    from trainers.policy.tokenizer import build_bpe_tokenizer

    return build_bpe_tokenizer(corpus(), vocab_size)


def qwen2_config(size: str, tokenizer, context: int = 1024):
    """The Qwen2Config of `size` (SIZES) for `tokenizer`."""
    from transformers import Qwen2Config

    shape = SIZES[size]
    return Qwen2Config(
        vocab_size=shape["vocab"] or len(tokenizer), hidden_size=shape["hidden"], intermediate_size=shape["mlp"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], max_position_embeddings=context, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"))


def build_model_dir(size: str, directory: Path, *, seed: int = 0) -> Path:
    """A seeded random Qwen2 model of `size` and its BPE tokenizer in `directory` (cached: built once)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    from trainers.policy.tokenizer import end_ids

    transformers.logging.disable_progress_bar()
    directory = Path(directory)
    stamp = {"size": size, "seed": seed, "build_version": BUILD_VERSION, "shape": SIZES[size]}
    if (directory / "bench_build.json").is_file() and json.loads((directory / "bench_build.json").read_text()) == stamp:
        return directory
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(qwen2_config(size, tokenizer), dtype=torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=end_ids(tokenizer), pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "bench_build.json").write_text(json.dumps(stamp))
    return directory


def parameter_count(directory: Path) -> int:
    """Parameters of the saved model (tied embeddings counted once), from its config alone."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    return sum(p.numel() for p in model.parameters())


def chat_prompts(tokenizer, count: int, tokens: int = 100, seed: int = 0) -> list[str]:
    """`count` ChatML-rendered prompts of about `tokens` tokens: a system role and a passage of the corpus."""
    rng, text = random.Random(seed), " ".join(corpus())
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    frame = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are the summariser."}, {"role": "user", "content": "Summarise: "}],
        tokenize=False, add_generation_prompt=True)
    body = max(1, tokens - len(tokenizer(frame, add_special_tokens=False)["input_ids"]))
    prompts = []
    for _ in range(count):
        start = rng.randrange(0, len(ids) - body)
        passage = tokenizer.decode(ids[start:start + body]).strip()
        prompts.append(tokenizer.apply_chat_template(
            [{"role": "system", "content": "You are the summariser."},
             {"role": "user", "content": f"Summarise: {passage}"}], tokenize=False, add_generation_prompt=True))
    return prompts


def text_reward(text: str) -> float:
    """A cheap, deterministic, non-constant reward on text: the share of letters and spaces in it."""
    return sum(c.isalpha() or c == " " for c in text) / len(text) if text else 0.0


def text_reward_score(item, candidate) -> float:
    """`text_reward` as a scenario's `callable` scorer (called with the judged item and candidate)."""
    return text_reward(candidate.text)


def current_rss_bytes() -> int:
    """This process's resident set size now (VmRSS), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    import psutil  # not Linux: psutil reads it

    return psutil.Process().memory_info().rss


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
