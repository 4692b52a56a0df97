"""Tasks and expert of the debate scenario.

Each task is a two-step arithmetic word problem with a claimed answer that is right about half of
the time (off by a typical slip otherwise). The debaters argue and each ends its message with
`ANSWER: <number>`; the rule judge scores each debater's own last answer.
"""

from __future__ import annotations

import random

TEMPLATES = (
    ("A crate holds {a} boxes of {b} apples each, plus {c} loose apples. How many apples are there?",
     lambda a, b, c: a * b + c, "{a} boxes x {b} apples = {ab}; plus {c} loose = {r}"),
    ("A train runs {a} km per hour for {b} hours, then {c} km more. How many km does it travel?",
     lambda a, b, c: a * b + c, "{a} km/h x {b} h = {ab} km; plus {c} km = {r} km"),
    ("A school has {a} classes of {b} pupils; {c} pupils are absent today. How many pupils are present?",
     lambda a, b, c: a * b - c, "{a} classes x {b} pupils = {ab}; minus {c} absent = {r}"),
    ("A shop sells {a} tickets a day for {b} days and then returns {c} tickets. How many tickets were sold in total?",
     lambda a, b, c: a * b - c, "{a} tickets x {b} days = {ab}; minus {c} returned = {r}"),
    ("What is {a} * {b} + {c}?", lambda a, b, c: a * b + c, "{a} * {b} = {ab}; {ab} + {c} = {r}"),
    ("What is {a} * {b} - {c}?", lambda a, b, c: a * b - c, "{a} * {b} = {ab}; {ab} - {c} = {r}"),
)


def generate_tasks(seed: int, count: int) -> list[dict]:
    """Word problems with a claimed answer (correct for about half of them)."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        template, solve, steps = TEMPLATES[rng.randrange(len(TEMPLATES))]
        a, b, c = rng.randint(3, 29), rng.randint(3, 19), rng.randint(2, 40)
        answer = solve(a, b, c)
        slip = rng.choice((10, -10, c, -c, a, b, 1, -1))  # the kind of slip a hasty solver makes
        claimed = answer if rng.random() < 0.5 else answer + slip
        question = template.format(a=a, b=b, c=c)
        tasks.append({
            "id": f"debate-{index}",
            "prompt": f"{question} Someone claims the answer is {claimed}.",
            "answer": str(answer),
            "metadata": {"claimed": claimed, "steps": steps.format(a=a, b=b, c=c, ab=a * b, r=answer)},
            "difficulty": float(a * b > 200),
            "variants": [f"{question} A friend says it is {claimed}."],
        })
    return tasks


def expert(agent: str, observation: str, task) -> str:
    """Work the problem out, say whether the claim holds, and give the answer."""
    claimed, answer = str(task.metadata["claimed"]), task.answer
    verdict = "The claim is right" if claimed == answer else f"The claim of {claimed} is wrong"
    if "ANSWER:" in observation.split(task.prompt, 1)[-1]:  # the opponent has spoken: respond to it
        return f"I checked again: {task.metadata['steps']}. {verdict}. ANSWER: {answer}"
    return f"{task.metadata['steps']}. {verdict}. ANSWER: {answer}"
