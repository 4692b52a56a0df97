"""Benchmark `trainers.grpo.safeguards.self_bleu` against the NLTK loop it reproduces.

Run from a checkout: `python bench/self_bleu.py` (`--help` for options). Builds 16 texts of 200 tokens
deterministically (seeded random words from a 500-word vocabulary, interleaved with shared phrases so
that n-grams of every order match across texts), checks that both implementations agree to 1e-9, then
prints the median time of each over several repeats and the speedup (goal: at least 50x). It then does
the same for `group_self_bleu` over a batch of groups, the call the trainer makes every step. Exits
with status 1 when an implementation disagrees with NLTK. The last line, `ratio: ...`, is the
`self_bleu` speedup over the NLTK loop timed in the same run. `--quick` (a second or two, for
tests/integration/test_benchmarks.py) makes the same checks and timings on 8 texts of 100 tokens, fewer repeats.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu  # noqa: E402

from trainers.grpo.safeguards import group_self_bleu, self_bleu  # noqa: E402

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


def build_texts(seed: int = SEED, n_texts: int = N_TEXTS, n_tokens: int = TOKENS_PER_TEXT) -> list[str]:
    """`n_texts` texts of `n_tokens` tokens: random words plus phrases shared across texts."""
    rng = random.Random(seed)
    vocabulary = build_vocabulary(rng, VOCABULARY_SIZE)
    phrases = [[rng.choice(vocabulary) for _ in range(rng.randint(3, 8))] for _ in range(12)]
    texts = []
    for _ in range(n_texts):
        tokens: list[str] = []
        while len(tokens) < n_tokens:
            if rng.random() < 0.3:
                tokens.extend(rng.choice(phrases))
            else:
                tokens.append(rng.choice(vocabulary))
        texts.append(" ".join(tokens[:n_tokens]))
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


def median_seconds(function: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls (after one warm-up call)."""
    function()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def check_equal(name: str, ours: Sequence[float], reference: Sequence[float]) -> float:
    """Largest |ours - reference|; raises SystemExit (status 1) when it reaches 1e-9."""
    difference = max(abs(a - b) for a, b in zip(ours, reference, strict=True))
    if difference >= 1e-9:
        print(f"{name}: MISMATCH ours {list(ours)!r} nltk {list(reference)!r} (max diff {difference:.3g})")
        raise SystemExit(1)
    return difference


def bench_self_bleu(texts: list[str], args: argparse.Namespace) -> float:
    """One set of texts: `self_bleu` against the NLTK loop (the figure the goal is about); the speedup."""
    ours_value, nltk_value = self_bleu(texts, args.max_n), nltk_self_bleu(texts, args.max_n)
    difference = check_equal("self_bleu", [ours_value], [nltk_value])
    ours_seconds = median_seconds(lambda: self_bleu(texts, args.max_n), repeats=args.repeats_ours)
    nltk_seconds = median_seconds(lambda: nltk_self_bleu(texts, args.max_n), repeats=args.repeats_nltk)
    print(
        f"self_bleu: {len(texts)} texts x {args.tokens} tokens, BLEU-{args.max_n} = {ours_value:.6f} "
        f"(|ours - nltk| = {difference:.1e})"
    )
    print(
        f"self_bleu: ours {ours_seconds:.5f} s, nltk {nltk_seconds:.3f} s, "
        f"speedup {nltk_seconds / ours_seconds:.0f}x (goal >= {SPEEDUP_GOAL:.0f}x)"
    )
    return nltk_seconds / ours_seconds


def bench_group_self_bleu(args: argparse.Namespace) -> None:
    """A whole generation batch (`--groups` groups of `--texts`): one vectorised call against a per-group loop."""
    texts = [text for group in range(args.groups) for text in build_texts(args.seed + group, args.texts, args.tokens)]
    size = args.texts

    def nltk_groups() -> list[float]:
        return [nltk_self_bleu(texts[start : start + size], args.max_n) for start in range(0, len(texts), size)]

    difference = check_equal("group_self_bleu", group_self_bleu(texts, size, args.max_n), nltk_groups())
    ours_seconds = median_seconds(lambda: group_self_bleu(texts, size, args.max_n), repeats=args.repeats_ours)
    nltk_seconds = median_seconds(nltk_groups, repeats=max(1, args.repeats_nltk // 2))
    print(
        f"group_self_bleu: {args.groups} groups x {size} texts (max diff {difference:.1e}): ours {ours_seconds:.5f} s, "
        f"nltk {nltk_seconds:.3f} s, speedup {nltk_seconds / ours_seconds:.0f}x"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; the defaults are the setting the speedup goal is stated for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=N_TEXTS, help="texts per group")
    parser.add_argument("--tokens", type=int, default=TOKENS_PER_TEXT, help="tokens per text")
    parser.add_argument("--groups", type=int, default=8, help="groups in the group_self_bleu batch")
    parser.add_argument("--max-n", type=int, default=MAX_N, help="BLEU order")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--repeats-ours", type=int, default=51, help="timed calls of ours (median reported)")
    parser.add_argument("--repeats-nltk", type=int, default=7, help="timed calls of the NLTK loop")
    parser.add_argument("--quick", action="store_true", help="the same checks and timings in a second or two")
    args = parser.parse_args(argv)
    if args.quick:
        args.texts, args.tokens, args.groups, args.repeats_ours, args.repeats_nltk = 8, 100, 2, 5, 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Check equality with NLTK, time both implementations, print the figures."""
    args = parse_args(argv)
    speedup = bench_self_bleu(build_texts(args.seed, args.texts, args.tokens), args)
    bench_group_self_bleu(args)
    print(f"ratio: {speedup:.1f} (NLTK loop s / self_bleu s; anchor: the NLTK loop, timed in this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
