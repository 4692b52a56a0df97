"""Judge prompts (MT-Bench style) and their strict verdict parsers.

Candidates are fenced between `[The Start of ...]` / `[The End of ...]` markers, and any marker
text inside a candidate is defused, so an answer cannot close its fence and speak to the judge.
Verdicts must stand at the END of the judge's reply:

    pairwise   ... [[A]]   or [[B]], or [[C]] for a tie
    pointwise  ... Rating: [[N]]       N an integer on the scale
    listwise   ... [[3, 1, 2]]         a permutation of the candidate numbers, best first

A verdict found elsewhere in the text never counts (a candidate quoting "[[A]]" cannot win), and an
out-of-range rating or an invalid ranking is a parse error, never a guess.
"""

from __future__ import annotations

import hashlib
import re

PAIRWISE_SYSTEM = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two AI "
    "assistants to the user question displayed below. {rubric} Avoid any position biases and ensure that "
    "the order in which the responses were presented does not influence your decision. Do not allow the "
    "length of the responses to influence your evaluation. Be as objective as possible. After providing your "
    "explanation, output your final verdict by strictly following this format: \"[[A]]\" if assistant A is "
    "better, \"[[B]]\" if assistant B is better, and \"[[C]]\" for a tie.")
POINTWISE_SYSTEM = (
    "Please act as an impartial judge and evaluate the quality of the response provided by an AI assistant "
    "to the user question displayed below. {rubric} Begin your evaluation by providing a short explanation. "
    "Be as objective as possible. After providing your explanation, you must rate the response on a scale "
    "of {low} to {high} by strictly following this format: \"Rating: [[N]]\", for example: \"Rating: [[{mid}]]\".")
LISTWISE_SYSTEM = (
    "Please act as an impartial judge and rank the {n} responses to the user question displayed below from "
    "best to worst. {rubric} The order of presentation is arbitrary and must not influence you. After a short "
    "explanation, output the ranking by strictly following this format: \"[[i, j, ...]]\" with every response "
    "number exactly once, best first.")
DEFAULT_RUBRIC = "Consider the helpfulness, relevance, accuracy, depth and level of detail of the responses."

_FENCE = re.compile(r"\[The (Start|End) of ", re.IGNORECASE)
_PAIR_VERDICT = re.compile(r"\[\[([ABC])\]\]\W*\Z")
_RATING = re.compile(r"Rating:\s*\[\[\s*(-?\d+(?:\.\d+)?)\s*\]\]\W*\Z", re.IGNORECASE)
_RANKING = re.compile(r"\[\[\s*([\d\s,]+?)\s*\]\]\W*\Z")


def defuse(text: str) -> str:
    """Candidate text with any fence marker neutralised (so it cannot close its own fence)."""
    return _FENCE.sub(lambda m: f"[The {m.group(1)}\u200b of ", text)


def template_hash(*parts: str) -> str:
    """A short hash of the prompt templates, part of a judge's identity."""
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:12]


def pairwise_messages(question: str, answer_a: str, answer_b: str, rubric: str = DEFAULT_RUBRIC) -> tuple:
    """Messages asking which of two answers is better (A is shown first)."""
    user = (f"[User Question]\n{question}\n\n"
            f"[The Start of Assistant A's Answer]\n{defuse(answer_a)}\n[The End of Assistant A's Answer]\n\n"
            f"[The Start of Assistant B's Answer]\n{defuse(answer_b)}\n[The End of Assistant B's Answer]")
    return ({"role": "system", "content": PAIRWISE_SYSTEM.format(rubric=rubric)}, {"role": "user", "content": user})


def pointwise_messages(question: str, answer: str, scale: tuple[int, int], rubric: str = DEFAULT_RUBRIC,
                       reference: str | None = None) -> tuple:
    """Messages asking for a rating of one answer on the integer scale."""
    low, high = scale
    system = POINTWISE_SYSTEM.format(rubric=rubric, low=low, high=high, mid=(low + high) // 2)
    reference_block = (f"[The Start of Reference Answer]\n{defuse(reference)}\n[The End of Reference Answer]\n\n"
                       if reference else "")
    user = (f"[Question]\n{question}\n\n{reference_block}"
            f"[The Start of Assistant's Answer]\n{defuse(answer)}\n[The End of Assistant's Answer]")
    return ({"role": "system", "content": system}, {"role": "user", "content": user})


def listwise_messages(question: str, answers: list[str], rubric: str = DEFAULT_RUBRIC) -> tuple:
    """Messages asking for a ranking of the answers, numbered 1..n in the order given."""
    blocks = "\n\n".join(f"[The Start of Response {i}]\n{defuse(a)}\n[The End of Response {i}]"
                         for i, a in enumerate(answers, start=1))
    system = LISTWISE_SYSTEM.format(n=len(answers), rubric=rubric)
    return ({"role": "system", "content": system}, {"role": "user", "content": f"[User Question]\n{question}\n\n{blocks}"})


def parse_pairwise(text: str) -> str | None:
    """'A', 'B' or 'C' (tie) when the reply ends with [[A]], [[B]] or [[C]]; None otherwise."""
    match = _PAIR_VERDICT.search((text or "").strip())
    return match.group(1) if match else None


def parse_rating(text: str, scale: tuple[int, int]) -> int | None:
    """The integer rating when the reply ends with `Rating: [[N]]` and N is on the scale; None otherwise."""
    match = _RATING.search((text or "").strip())
    if not match:
        return None
    value = float(match.group(1))
    if not value.is_integer() or not scale[0] <= value <= scale[1]:
        return None
    return int(value)


def parse_ranking(text: str, n: int) -> list[int] | None:
    """The ranking (1-based numbers, best first) when the reply ends with a permutation of 1..n."""
    match = _RANKING.search((text or "").strip())
    if not match:
        return None
    try:
        ranking = [int(part) for part in match.group(1).replace(",", " ").split()]
    except ValueError:
        return None
    return ranking if sorted(ranking) == list(range(1, n + 1)) else None
