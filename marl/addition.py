"""The demo task: two-number addition ("12+35=" -> "47"), for tests, benchmarks and `make run`.

All 8100 pairs (a, b) with a, b in [10, 99] are shuffled with a seed and split into an SFT set
(demonstrations for the warm-up), an RL training set and a held-out evaluation set, so that RL and
evaluation prompts are never seen during the warm-up.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from marl.types import Task

ALPHABET = "0123456789+="


@dataclass(frozen=True)
class AdditionSplits:
    """The three disjoint task sets of the addition demo."""

    sft: list[Task]
    train: list[Task]
    eval: list[Task]


def addition_task(a: int, b: int) -> Task:
    """The task "a+b=" with answer str(a+b); difficulty is the number of carries (0 or 1 or 2)."""
    carries = int((a % 10) + (b % 10) >= 10) + int(a + b >= 100)
    return Task(id=f"{a}+{b}", prompt=f"{a}+{b}=", answer=str(a + b),
                metadata={"a": a, "b": b}, difficulty=float(carries))


def addition_splits(seed: int = 0, n_train: int = 744, n_eval: int = 256, low: int = 10, high: int = 99) -> AdditionSplits:
    """Shuffle every pair in [low, high]^2 with `seed`; the last n_train + n_eval become RL and eval."""
    pairs = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    if n_train + n_eval >= len(pairs):
        raise ValueError(f"n_train + n_eval = {n_train + n_eval} leaves no SFT data out of {len(pairs)} pairs")
    random.Random(seed).shuffle(pairs)
    tasks = [addition_task(a, b) for a, b in pairs]
    n_sft = len(tasks) - n_train - n_eval
    return AdditionSplits(sft=tasks[:n_sft], train=tasks[n_sft:n_sft + n_train], eval=tasks[n_sft + n_train:])


def addition_reward(task: Task, completion: str) -> float:
    """1.0 when the stripped completion is exactly the sum, else 0.0 (the anchor's reward)."""
    return 1.0 if completion.strip() == task.answer else 0.0


def addition_progress(task: Task, completion: str) -> float:
    """Partial progress in [0, 1]: the fraction of the answer's leading digits that are right."""
    answer, text = task.answer or "", completion.strip()
    correct = 0
    for expected, got in zip(answer, text):
        if expected != got:
            break
        correct += 1
    return correct / max(1, len(answer))
