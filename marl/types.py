"""Core plain-data types shared by every layer (no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Task:
    """One task an agent (or a team) is asked to solve.

    id: stable identifier (used for caching, pass-rate tracking and checkpoints).
    prompt: the text the policy sees.
    answer: the reference answer, when the task can be checked by rule.
    metadata: free-form task data (operands, expected tool calls, ...).
    difficulty: an optional heuristic difficulty (larger is harder).
    variants: other wordings of the same task, for robustness evaluation: a string replaces the prompt;
        a mapping {"prompt": ..., "metadata": {...}} replaces the prompt and/or updates metadata
        (for scenarios whose observations are built from metadata). See `Task.variant`.
    """

    id: str
    prompt: str
    answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    difficulty: float | None = None
    variants: tuple[str | dict[str, Any], ...] = ()

    def variant(self, index: int) -> Task:
        """The task as its `index`-th variant words it (same id and answer, no variants of its own)."""
        wording = self.variants[index]
        if isinstance(wording, str):
            return replace(self, prompt=wording, variants=())
        return replace(self, prompt=wording.get("prompt", self.prompt),
                       metadata={**self.metadata, **wording.get("metadata", {})}, variants=())
