"""Tasks and the expert of the relay scenario."""

from __future__ import annotations

import random
import re

ADDITION = re.compile(r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*$")


def generate_tasks(seed: int, count: int) -> list[dict]:
    """(a+b)+(c+d) with every number in [10, 49], so that every partial sum has two digits."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        a, b, c, d = (rng.randint(10, 49) for _ in range(4))
        tasks.append({
            "id": f"relay-{index}",
            "prompt": f"({a}+{b})+({c}+{d})=",
            "answer": str(a + b + c + d),
            "metadata": {"left": f"{a}+{b}=", "right": f"{c}+{d}="},
            "difficulty": float(sum(x % 10 for x in (a, b, c, d)) >= 20),
            "variants": [  # the same sums, handed to the other agent or with operands swapped
                {"prompt": f"({c}+{d})+({a}+{b})=", "metadata": {"left": f"{c}+{d}=", "right": f"{a}+{b}="}},
                {"prompt": f"({b}+{a})+({d}+{c})=", "metadata": {"left": f"{b}+{a}=", "right": f"{d}+{c}="}},
            ],
        })
    return tasks


def expert(agent: str, observation: str, task) -> str:
    """Every agent adds the two numbers it sees."""
    match = ADDITION.match(observation)
    return str(int(match.group(1)) + int(match.group(2))) if match else ""
