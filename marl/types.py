"""Core plain-data types shared by every layer (no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One task an agent (or a team) is asked to solve.

    id: stable identifier (used for caching, pass-rate tracking and checkpoints).
    prompt: the text the policy sees.
    answer: the reference answer, when the task can be checked by rule.
    metadata: free-form task data (operands, expected tool calls, ...).
    difficulty: an optional heuristic difficulty (larger is harder).
    variants: paraphrases of the prompt, for robustness evaluation.
    """

    id: str
    prompt: str
    answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    difficulty: float | None = None
    variants: tuple[str, ...] = ()
