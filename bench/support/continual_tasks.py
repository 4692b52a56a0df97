"""The task families of bench/continual.py: relay's own, a second one, and both for retraining from scratch.

    low   relay's tasks (scenarios/relay_lib.py): (a+b)+(c+d), every number in [10, 49]
    high  (a+b)+(c+d) with each pair summing to [60, 99], one of its numbers in [50, 89]: the partial
          sums are the high end of relay's, and final always carries into the hundreds (120-198)
    both  the training tasks of low and high interleaved, then the held-out tasks of each (EVAL_COUNT
          apiece): the held-out sets are exactly the two families' own

Every family is generated from the same seed as the scenario file says; the expert adds what it sees.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

EVAL_COUNT = 100  # held-out tasks per family (the scenario files' tasks.eval_count: 100, 100, 200)
RELAY_LIB = Path(__file__).resolve().parents[2] / "scenarios" / "relay_lib.py"


def _relay_lib():
    spec = importlib.util.spec_from_file_location("continual_relay_lib", RELAY_LIB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generate_low(seed: int, count: int) -> list[dict]:
    """relay's own tasks (the same generator, seed and count give the same tasks)."""
    return _relay_lib().generate_tasks(seed=seed, count=count)


def _high_pair(rng: random.Random) -> tuple[int, int]:
    total = rng.randint(60, 99)
    big = rng.randint(50, total - 10)
    return (big, total - big) if rng.random() < 0.5 else (total - big, big)


def generate_high(seed: int, count: int) -> list[dict]:
    """The second family (module docstring), ids high-<i>."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        (a, b), (c, d) = _high_pair(rng), _high_pair(rng)
        tasks.append({"id": f"high-{index}", "prompt": f"({a}+{b})+({c}+{d})=", "answer": str(a + b + c + d),
                      "metadata": {"left": f"{a}+{b}=", "right": f"{c}+{d}="},
                      "difficulty": float(sum(x % 10 for x in (a, b, c, d)) >= 20)})
    return tasks


def generate_both(seed: int, count: int) -> list[dict]:
    """Both families' training tasks interleaved, then low's held-out tasks, then high's (count // 2 each)."""
    half = count // 2
    low, high = generate_low(seed, half), generate_high(seed, half)
    train = [task for pair in zip(low[:-EVAL_COUNT], high[:-EVAL_COUNT]) for task in pair]
    return train + low[-EVAL_COUNT:] + high[-EVAL_COUNT:]


def expert(agent: str, observation: str, task) -> str:
    """Every agent adds the two numbers it sees (relay's expert)."""
    return _relay_lib().expert(agent, observation, task)
