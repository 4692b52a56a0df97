"""Tasks, scoring and scripted players of the debate scenario.

Each task is a two-step arithmetic word problem (a two-digit number times a one- or two-digit one,
plus or minus a third) with a claimed answer that is right about half of the time (off by a typical
slip otherwise). Both debaters answer at once (their first answers are independent), then each sees
the other's argument and answers again; every message ends with `ANSWER: <number>`.

Score (rule-verified, `debate_score`): 1.0 when a debater's last answer is right and its first one was
too; 0.5 when only the last is right (a correction, which may be a copy of the other's answer); 0
otherwise. Zero-sum, so being right on one's own beats being corrected, which beats being wrong; two
debaters right from the start tie. Scripted opponents of graded strength: `random_player` (a random
number), `claim_player` (trusts the claim: right about half of the time) and the expert (always right
from the start: it can only be tied).
"""

from __future__ import annotations

import random
import re

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
        a, b, c = rng.randint(12, 99), rng.randint(3, 29), rng.randint(2, 99)  # hard enough that a tiny model errs
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


# -- scoring ----------------------------------------------------------------------------------------

_ANSWER = re.compile(r"ANSWER:\s*(-?[0-9]{1,12})")


def answers(transcript, agent: str) -> list[int | None]:
    """The number each of `agent`'s messages ends on (its last `ANSWER: n`), None for a message without one."""
    found = []
    for message in transcript:
        if message["agent"] == agent:
            numbers = _ANSWER.findall(message["text"])
            found.append(int(numbers[-1]) if numbers else None)
    return found


def debate_score(item, candidate) -> float:
    """1.0 right from the first message to the last, 0.5 right only at the last (corrected), else 0."""
    from judges.types import candidate_input

    with candidate_input("the answers"):
        said = answers(candidate.transcript, candidate.agent)
    truth = int(item.answer)
    if not said or said[-1] != truth:
        return 0.0
    return 1.0 if said[0] == truth else 0.5


# -- scripted opponents of graded strength (evaluation only) ----------------------------------------

def random_player(agent: str, observation: str, task) -> str:
    """A number of the answer's size, at random (seeded by the task and the turn)."""
    rng = random.Random(f"{task.id}:{agent}:{observation.count(chr(10))}")
    size = abs(int(task.answer)) or 10
    return f"I guess. ANSWER: {rng.randint(size // 2, size * 3 // 2)}"


def claim_player(agent: str, observation: str, task) -> str:
    """Trusts the claim every time: right about half of the time, and never changes its mind."""
    return f"The claim looks right. ANSWER: {task.metadata['claimed']}"
