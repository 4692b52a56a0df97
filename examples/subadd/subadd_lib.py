"""Tasks and the expert of the subadd scenario: (a-b)+c with a > b."""
import random
import re

SUM = re.compile(r"\s*(\d+)\s*([+-])\s*(\d+)\s*=\s*$")


def generate_tasks(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        b = rng.randint(10, 40)
        a = rng.randint(b + 1, 60)
        c = rng.randint(10, 39)
        tasks.append({"id": f"subadd-{index}", "prompt": f"({a}-{b})+{c}=", "answer": str(a - b + c),
                      "metadata": {"pair": f"{a}-{b}=", "add": str(c)}})
    return tasks


def expert(agent: str, observation: str, task) -> str:
    match = SUM.match(observation)
    if not match:
        return ""
    x, op, y = int(match.group(1)), match.group(2), int(match.group(3))
    return str(x - y if op == "-" else x + y)
