"""Benchmark `trainers.safeguards.self_bleu` against the NLTK loop it reproduces.

Run from a checkout: `python bench/self_bleu.py`. Builds 16 texts of ~200 tokens deterministically
(seeded random words from a ~500-word vocabulary, interleaved with shared phrases so that n-grams of
every order match across texts), checks that both implementations agree to 1e-9, then prints the median
time of each over several repeats and the speedup. Exits non-zero when they disagree.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu  # noqa: E402

from trainers.safeguards import self_bleu  # noqa: E402

N_TEXTS = 16
TOKENS_PER_TEXT = 200
VOCABULARY_SIZE = 500
MAX_N = 4
SEED = 1234
SPEEDUP_GOAL = 50.0


def build_vocabulary(rng: random.Random, size: int) -> list[str]:
    """`size` distinct pronounceable pseudo-words."""
    syllables = [consonant + vowel for consonant in "bdfgklmnprstvz" for vowel in "aeiou"]
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))))
    return sorted(words)


def build_texts(seed: int = SEED) -> list[str]:
    """N_TEXTS texts of about TOKENS_PER_TEXT tokens: random words plus phrases shared across texts."""
    rng = random.Random(seed)
    vocabulary = build_vocabulary(rng, VOCABULARY_SIZE)
    phrases = [[rng.choice(vocabulary) for _ in range(rng.randint(3, 8))] for _ in range(12)]
    texts = []
    for _ in range(N_TEXTS):
        tokens: list[str] = []
        while len(tokens) < TOKENS_PER_TEXT:
            if rng.random() < 0.3:
                tokens.extend(rng.choice(phrases))
            else:
                tokens.append(rng.choice(vocabulary))
        texts.append(" ".join(tokens[:TOKENS_PER_TEXT]))
    return texts


def nltk_self_bleu(texts: Sequence[str], max_n: int = MAX_N) -> float:
    """The reference: mean over i of NLTK sentence BLEU of text i against all the other texts."""
    token_lists = [text.split() for text in texts]
    smoothing = SmoothingFunction().method1
    weights = (1 / max_n,) * max_n
    scores = [
        sentence_bleu(
            [other for j, other in enumerate(token_lists) if j != i],
            hypothesis,
            weights=weights,
            smoothing_function=smoothing,
        )
        for i, hypothesis in enumerate(token_lists)
    ]
    return sum(scores) / len(scores)


def median_seconds(function: Callable[[], float], repeats: int) -> float:
    """Median wall time of `repeats` calls (after one warm-up call)."""
    function()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def main() -> int:
    """Check equality, time both implementations and print one summary line."""
    texts = build_texts()
    ours_value = self_bleu(texts, MAX_N)
    nltk_value = nltk_self_bleu(texts, MAX_N)
    difference = abs(ours_value - nltk_value)
    if difference >= 1e-9:
        print(f"self_bleu: MISMATCH ours {ours_value!r} nltk {nltk_value!r} (diff {difference:.3g})")
        return 1
    ours_seconds = median_seconds(lambda: self_bleu(texts, MAX_N), repeats=51)
    nltk_seconds = median_seconds(lambda: nltk_self_bleu(texts, MAX_N), repeats=7)
    speedup = nltk_seconds / ours_seconds
    print(
        f"self_bleu: {N_TEXTS} texts x {TOKENS_PER_TEXT} tokens, BLEU-{MAX_N} = {ours_value:.6f} "
        f"(|ours - nltk| = {difference:.1e})"
    )
    print(
        f"self_bleu: ours {ours_seconds:.5f} s, nltk {nltk_seconds:.3f} s, "
        f"speedup {speedup:.0f}x (goal >= {SPEEDUP_GOAL:.0f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
