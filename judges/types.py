"""The scoring interface shared by rule verifiers and model judges (plain data, no heavy imports).

A scorer looks at one item (the task: prompt, reference answer, metadata) and its candidates (what
the agents produced) and returns one `Judgment` per candidate. A judgment has a status; only an `ok`
judgment carries a score. A failed judgment never becomes a number: downstream it is masked, never
scored 0. Rule verifiers and model judges implement the same `Scorer` protocol, so either can stand
in a scenario's reward spec.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

STATUSES = ("ok", "parse_error", "refusal", "truncated", "api_error", "timeout", "error")


@dataclass(frozen=True)
class Judgment:
    """The verdict on one candidate.

    status: one of STATUSES; `ok` is the only status with a score.
    score: in [0, 1] for rule verifiers (1 = fully correct); None unless status is ok.
    label: a short verdict ("correct", "wrong", "A", ...), when the scorer has one.
    probabilities: label -> probability, when the scorer has them (model judges with logprobs).
    rationale: why (a rule's explanation or a judge's reasoning).
    details: structured evidence (rows compared, tests passed, markers found, ...).
    usage / latency / cached: cost bookkeeping for model judges.
    """

    status: str
    score: float | None = None
    label: str | None = None
    probabilities: dict[str, float] | None = None
    rationale: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] | None = None
    latency: float | None = None
    cached: bool = False

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"Judgment status {self.status!r} is not one of {STATUSES}")
        if (self.status == "ok") != (self.score is not None):
            raise ValueError(f"a Judgment has a score exactly when its status is ok (status={self.status!r}, "
                             f"score={self.score!r})")

    @property
    def ok(self) -> bool:
        """True when the judgment carries a score."""
        return self.status == "ok"


def passed(score: float, rationale: str = "", **details) -> Judgment:
    """An ok judgment with `score`, labelled correct when score >= 1 else wrong."""
    return Judgment("ok", float(score), label="correct" if score >= 1 else "wrong", rationale=rationale,
                    details=details)


def failed(status: str, rationale: str, **details) -> Judgment:
    """A judgment without a score (the scorer could not decide)."""
    return Judgment(status, None, rationale=rationale, details=details)


class ScorerError(RuntimeError):
    """A failure of the scorer itself (a sandbox that cannot start, an endpoint down), not of the
    candidate: the judgment is failed and masked downstream. `candidate_input` lets it through."""


class CandidateError(Exception):
    """Scoring failed because of what the candidate produced (text no parser survives, a value no
    comparison survives): the candidate's own failure, scored 0 with this reason, never masked.
    Rule verifiers turn it into `passed(0.0, reason)`; a scenario's callable scorer may raise it."""


@contextmanager
def candidate_input(what: str) -> Iterator[None]:
    """Treat any exception raised inside as the candidate's failure: a CandidateError naming `what`
    and the exception's class (never its message, which may quote the candidate's text).

    Wrap the parsing and comparison of candidate-derived data in it: a candidate must not turn its
    own 0 into a masked reward by producing input that makes a parser raise (RecursionError on deep
    nesting, OverflowError on huge numbers, ValueError on int's digit limit, ...). A ScorerError
    (the scorer's own failure) and a CandidateError pass through unchanged.
    """
    try:
        yield
    except (ScorerError, CandidateError):
        raise
    except Exception as error:  # whatever the candidate's data made our parsing raise
        raise CandidateError(f"{what} could not be scored ({type(error).__name__})") from error


@dataclass(frozen=True)
class ToolCallRecord:
    """A tool call an agent made: name, parsed arguments, whether it ran, what it returned, and the
    turn of the message it was made in (environments set it; None outside an episode)."""

    agent: str
    name: str
    arguments: dict[str, Any]
    ok: bool
    result: str = ""
    turn: int | None = None


@dataclass(frozen=True)
class Item:
    """What is being solved: the prompt, the reference answer (if any) and task metadata."""

    prompt: str
    answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Candidate:
    """What an agent (or a team) produced.

    text: the final answer text to verify.
    reasoning: the text in which process markers are looked for (default: the whole transcript).
    transcript: every message of the episode as {"agent": name, "text": text, "turn": n}.
    tool_calls: the tool calls made, in order.
    agent: who produced `text` (None for a team answer).
    """

    text: str
    reasoning: str = ""
    transcript: tuple[dict[str, str], ...] = ()
    tool_calls: tuple[ToolCallRecord, ...] = ()
    agent: str | None = None


@runtime_checkable
class Scorer(Protocol):
    """Anything that judges candidates: rule verifiers now, model judges later."""

    name: str

    def score(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        """One judgment per candidate, in order."""
        ...
