"""Scripted policies for tests (agents.N.policy=helpers.scripted:NAME): what they say never depends on
what a model samples, so a test can count on the rewards they earn on every machine."""

from __future__ import annotations

from collections import Counter

_plays: Counter = Counter()


def every_other_play(agent: str, observation: str, task) -> str:
    """The task's answer on every other call for that task, nothing in between: the G plays of a task in a
    step (called one after another, whatever order the tasks come in) score differently, so every group
    has a reward spread (credit replays call it too; they shift the parity, never the alternation)."""
    _plays[task.id] += 1
    return task.answer if _plays[task.id] % 2 else ""
