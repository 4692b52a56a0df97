"""Tasks and the expert of the specialists scenario: the same surface ("37 25"), two skills by role."""

from __future__ import annotations

import random
import re

PAIR = re.compile(r"\s*(\d+)\s+(\d+)\s*$")
SUBTRACTING = ("subtractor", "final")  # the agents whose job is a - b; the adder's is a + b


def _draw(rng: random.Random) -> tuple[int, int, int, int]:
    """a, b in [10, 49]; c in [20, 59] minus d in [10, c-10] (a two-digit difference); redrawn until
    (a+b) - (c-d) has two digits, so that every message and the answer have two digits."""
    while True:
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        c = rng.randint(20, 59)
        d = rng.randint(10, c - 10)
        if 10 <= (a + b) - (c - d) <= 99:
            return a, b, c, d


def generate_tasks(seed: int, count: int) -> list[dict]:
    """(a+b)-(c-d): the adder sees "a b", the subtractor "c d", final "a+b c-d"."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        a, b, c, d = _draw(rng)
        carries = (a % 10 + b % 10 >= 10) + (c % 10 < d % 10) + ((a + b) % 10 < (c - d) % 10)
        tasks.append({
            "id": f"specialists-{index}",
            "prompt": f"({a}+{b})-({c}-{d})=",
            "answer": str((a + b) - (c - d)),
            "metadata": {"add": f"{a} {b}", "sub": f"{c} {d}"},
            "difficulty": float(carries >= 2),  # two or more carries and borrows: the hard bucket
            "variants": [  # the adder's operands swapped: the same team answer
                {"prompt": f"({b}+{a})-({c}-{d})=", "metadata": {"add": f"{b} {a}", "sub": f"{c} {d}"}},
            ],
        })
    return tasks


def expert(agent: str, observation: str, task) -> str:
    """The adder adds the two numbers it sees; the subtractor and final subtract the second from the first."""
    match = PAIR.match(observation)
    if not match:
        return ""
    first, second = int(match.group(1)), int(match.group(2))
    return str(first - second if agent in SUBTRACTING else first + second)
