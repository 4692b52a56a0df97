"""Verdict modes: how a model judge's answer becomes a verdict (a plug-in of the judges in prompted.py).

    text      the default: MT-Bench prompts, an explanation, then `[[A]]` or `Rating: [[N]]`
              (judges.model.prompts). For strong judges, whose reasoning helps them decide.
    logprobs  a short prompt asking for one label, ONE generated token, and the verdict read from that
              first token's probabilities. For small judges: their explanations are noise and their
              bracketed verdicts often never come, but their first-token probabilities still rank answers.

In `logprobs` mode P(label) is the sum of the probabilities of every token that spells the label: "A"
and " A" for a letter (not "a": that is the article), "Yes", " Yes", "yes", " yes", "YES", ... for a
word. A pointwise judge asks "Yes or No" and scores P(Yes) / (P(Yes) + P(No)); a pairwise judge asks
"A or B" and reads P(A better) = P(A) / (P(A) + P(B)) in each order. When the labels hold less than
half of the first token's probability, the judge did not answer with a label: the judgment fails
(status parse_error, with the label mass in its details), it never becomes a number.

Endpoints list at most the top 20 alternatives of a token (`top_logprobs: 20`), so a label may be
missing. Where the label token ids are known (a local model: its tokenizer, `LogprobVerdict.for_tokenizer`)
every spelling is boosted into the top 20 with `logit_bias` and read back un-boosted: a bias b on the
label tokens S turns p into p', and p_t = p'_t e^(-b [t in S]) / (e^-b P'(S) + 1 - P'(S)). That is
exact when the endpoint reports the logprobs of the distribution it drew from (OpenAI, `marl serve`,
LocalBackend); vLLM's default `raw_logprobs` are not, so give such an endpoint no token ids. Where the
ids are not known, a label none of whose spellings is listed counts 0 (`details["unseen"]`); each of its
tokens is less likely than the last one listed (`details["unseen_at_most"]`).

Bad input, before any call: a label the judge's tokenizer splits into several tokens (its first token
would not spell it) is a `LabelError` naming it and the fix. A reply that carries no logprobs fails its
judgment with `NO_LOGPROBS`, which names the setting to change; the commands probe for it first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.model_files import model_folder_problem
from judges.model.backend import ChatRequest, ChatResponse
from judges.model.prompts import DEFAULT_RUBRIC, defuse
from judges.types import Judgment

VERDICT_MODES = ("text", "logprobs")
POINTWISE_LABELS = ("Yes", "No")  # the first is the good verdict: the score is its probability
PAIRWISE_LABELS = ("A", "B")  # the label of the answer shown first, then of the one shown second
TOP_LOGPROBS = 20  # the most alternatives OpenAI-compatible endpoints list
MIN_LABEL_MASS = 0.5  # labels holding less of the first token's probability: no verdict
LABEL_BIAS = 10.0  # enough to lift a label of probability 1e-6 above most of a 150k vocabulary's tail
NO_LOGPROBS = ("the judge's reply carries no logprobs, and verdict 'logprobs' reads its verdict from them: use an "
               "endpoint that returns logprobs (vLLM, SGLang, OpenAI, marl serve), or verdict 'text'")

POINTWISE_VERDICT_SYSTEM = (
    "You are an impartial judge of the answer an AI assistant gave to the user question below. {rubric} "
    "Reply with one word: {positive} if the answer is correct and good, {negative} if it is not.")
PAIRWISE_VERDICT_SYSTEM = (
    "You are an impartial judge comparing the answers two AI assistants gave to the user question below. "
    "{rubric} Neither the order of the answers nor their length may influence you. Reply with one letter: "
    "{first} if assistant A's answer is better, {second} if assistant B's answer is better.")


class LabelError(ValueError):
    """A verdict label that is not one token of the judge's tokenizer (the message is one line)."""


def check_verdict_mode(verdict) -> None:
    """ValueError (one line) unless `verdict` is one of VERDICT_MODES or a LogprobVerdict."""
    if not isinstance(verdict, LogprobVerdict) and verdict not in VERDICT_MODES:
        raise ValueError(f"verdict={verdict!r} must be one of {', '.join(VERDICT_MODES)}")


def spellings(label: str) -> tuple[str, ...]:
    """The token texts that spell `label`: with and without a leading space; a word in any case too (a
    single letter keeps its case: lowercase "a" is an article, not a verdict)."""
    forms = [label] if len(label) == 1 else list(dict.fromkeys([label, label.lower(), label.upper(),
                                                                label.capitalize()]))
    return tuple(prefix + form for form in forms for prefix in ("", " "))


@dataclass(frozen=True)
class Reading:
    """What the first token's probabilities say: status ok with `probabilities` (normalised over the
    labels), or the failed judgment's status and why. `mass`: the labels' share of the probability."""

    status: str
    probabilities: dict[str, float] | None = None
    mass: float | None = None
    label_probabilities: dict[str, float] = field(default_factory=dict)
    unseen: tuple[str, ...] = ()
    unseen_at_most: float | None = None
    why: str = ""

    @property
    def ok(self) -> bool:
        """True when the labels held enough probability to give a verdict."""
        return self.status == "ok"

    def details(self) -> dict:
        """The evidence, for a Judgment's details (failed ones too: a failure says how close it was)."""
        details: dict = {"scoring": "label_probability"}
        if self.mass is not None:
            details.update(label_mass=self.mass, label_probabilities=dict(self.label_probabilities))
        if self.unseen:
            details.update(unseen=list(self.unseen), unseen_at_most=self.unseen_at_most)
        return details


class LogprobVerdict:
    """The `logprobs` verdict for one set of labels (see the module docstring).

    boosted: {token text: token id} of the label spellings that are one token, when the judge's tokenizer
    is known; they get `bias` through logit_bias and are read back un-boosted. Empty: no logit_bias.
    """

    mode = "logprobs"

    def __init__(self, labels: Sequence[str], *, boosted: Mapping[str, int] | None = None, bias: float = LABEL_BIAS):
        labels = tuple(labels)
        if len(labels) < 2 or len(set(labels)) != len(labels) or not all(
                isinstance(x, str) and x and x == x.strip() for x in labels):
            raise ValueError(f"verdict labels {labels!r}: need at least 2 different non-empty labels without "
                             "surrounding spaces, e.g. ('Yes', 'No')")
        self.labels = labels
        self._label_of = {form.strip(): label for label in labels for form in spellings(label)}
        if len(self._label_of) != sum(len({f.strip() for f in spellings(label)}) for label in labels):
            raise ValueError(f"verdict labels {labels!r}: two labels are spelled alike; choose distinct words")
        self.boosted = dict(boosted or {})
        self.bias = float(bias) if self.boosted else 0.0

    @classmethod
    def for_tokenizer(cls, tokenizer, labels: Sequence[str], *, bias: float = LABEL_BIAS,
                      name: str = "the judge's model") -> "LogprobVerdict":
        """The verdict with every one-token spelling of each label boosted; LabelError (one line) when the
        tokenizer splits a label itself into several tokens (its first token would not spell it)."""
        boosted = {}
        for label in labels:
            for spelling in spellings(label):
                ids = tokenizer(spelling, add_special_tokens=False)["input_ids"]
                text = tokenizer.decode(ids) if len(ids) == 1 else ""
                if len(ids) == 1 and text.strip() in {f.strip() for f in spellings(label)}:
                    boosted[text] = int(ids[0])  # keyed by the text the server sends back for that token
                elif spelling == label:
                    pieces = " + ".join(repr(tokenizer.decode([i])) for i in ids) or "nothing"
                    raise LabelError(f"verdict label {label!r} is {len(ids)} tokens for {name}'s tokenizer ({pieces}); "
                                     "the logprobs verdict reads one token: use a model whose tokenizer has it as "
                                     "one token, or verdict 'text'")
        return cls(labels, boosted=boosted, bias=bias)

    def settings(self) -> dict:
        """The ChatRequest fields of a verdict request: one greedy token with the top 20 alternatives."""
        bias = tuple(sorted((token, self.bias) for token in set(self.boosted.values())))
        return dict(max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=TOP_LOGPROBS, logit_bias=bias,
                    verdict=self.mode)

    def templates(self) -> tuple[str, ...]:
        """The prompt templates and labels (part of the judge's identity)."""
        return (POINTWISE_VERDICT_SYSTEM, PAIRWISE_VERDICT_SYSTEM, "|".join(self.labels))

    # -- prompts ---------------------------------------------------------------------------------------------
    def pointwise_messages(self, question: str, answer: str, rubric: str = DEFAULT_RUBRIC,
                           reference: str | None = None) -> tuple:
        """Messages asking whether one answer is good, to be answered with labels[0] or labels[1]."""
        positive, negative = self.labels[:2]
        reference_block = (f"[The Start of Reference Answer]\n{defuse(reference)}\n[The End of Reference Answer]\n\n"
                           if reference else "")
        user = (f"[Question]\n{question}\n\n{reference_block}"
                f"[The Start of Assistant's Answer]\n{defuse(answer)}\n[The End of Assistant's Answer]\n\n"
                f"Is the answer correct and good? Reply {positive} or {negative}.")
        system = POINTWISE_VERDICT_SYSTEM.format(rubric=rubric, positive=positive, negative=negative)
        return ({"role": "system", "content": system}, {"role": "user", "content": user})

    def pairwise_messages(self, question: str, answer_a: str, answer_b: str, rubric: str = DEFAULT_RUBRIC) -> tuple:
        """Messages asking which of two answers is better (A shown first), answered with labels[0] or [1]."""
        first, second = self.labels[:2]
        user = (f"[User Question]\n{question}\n\n"
                f"[The Start of Assistant A's Answer]\n{defuse(answer_a)}\n[The End of Assistant A's Answer]\n\n"
                f"[The Start of Assistant B's Answer]\n{defuse(answer_b)}\n[The End of Assistant B's Answer]\n\n"
                f"Which answer is better? Reply {first} or {second}.")
        system = PAIRWISE_VERDICT_SYSTEM.format(rubric=rubric, first=first, second=second)
        return ({"role": "system", "content": system}, {"role": "user", "content": user})

    # -- reading -----------------------------------------------------------------------------------------------
    def read(self, response: ChatResponse) -> Reading:
        """The labels' probabilities at the first generated token (see the module docstring)."""
        if response.status not in ("ok", "truncated"):  # one token is "truncated" by design (finish_reason length)
            return Reading(response.status, why=response.error or f"the endpoint answered {response.status}")
        if response.token_logprobs is None:
            return Reading("error", why=NO_LOGPROBS)
        if not response.token_logprobs:
            return Reading("parse_error", mass=0.0, label_probabilities={label: 0.0 for label in self.labels},
                           why="the judge ended its reply before any token, so before any label")
        return self._reading(response.token_logprobs[0])

    def _reading(self, alternatives: Mapping[str, float]) -> Reading:
        found = {label: 0.0 for label in self.labels}
        seen, boosted_mass, unboost = set(), 0.0, math.exp(-self.bias)
        for token, logprob in alternatives.items():
            p = math.exp(min(logprob, 0.0))  # checked_response refused logprobs clearly above 0
            boosted = token in self.boosted
            boosted_mass += p if boosted else 0.0
            if (label := self._label_of.get(token.strip())) is not None:
                found[label] += p * unboost if boosted else p
                seen.add(label)
        # the boosted tokens' share, given back: what every probability is divided by once they are un-boosted
        norm = unboost * min(boosted_mass, 1.0) + max(1.0 - boosted_mass, 0.0) if self.boosted else 1.0
        label_probabilities = {label: p / norm for label, p in found.items()} if norm > 0 else found
        mass = sum(label_probabilities.values())
        unseen = tuple(label for label in self.labels if label not in seen)
        at_most = math.exp(min(min(alternatives.values(), default=0.0), 0.0)) if unseen else None
        common = dict(mass=mass, label_probabilities=label_probabilities, unseen=unseen, unseen_at_most=at_most)
        if not (math.isfinite(mass) and mass >= MIN_LABEL_MASS):
            return Reading("parse_error", why=f"the labels {'/'.join(self.labels)} hold {mass:.3f} of the first "
                                             f"token's probability, under {MIN_LABEL_MASS:g}: the judge did not "
                                             "answer with a label", **common)
        return Reading("ok", probabilities={label: p / mass for label, p in label_probabilities.items()}, **common)

    def pointwise_judgment(self, response: ChatResponse) -> Judgment:
        """The judgment of one answer: score P(labels[0]) over the labels, or a failed judgment."""
        reading = self.read(response)
        cost = dict(usage=response.usage, latency=response.latency, cached=response.cached)
        if not reading.ok:
            return Judgment(reading.status, None, rationale=reading.why, details=reading.details(), **cost)
        probabilities = reading.probabilities
        return Judgment("ok", min(max(probabilities[self.labels[0]], 0.0), 1.0),
                        label=max(self.labels, key=probabilities.get), probabilities=probabilities,
                        rationale=response.text, details=reading.details(), **cost)


def label_verdict(verdict, labels: Sequence[str] | None, backend, kind: str) -> LogprobVerdict | None:
    """The verdict plug-in a judge of `kind` uses: None for 'text'; for 'logprobs', a LogprobVerdict over
    `labels`, with the label tokens checked and boosted when the backend has a tokenizer (a local model);
    a LogprobVerdict given is used as it is. ValueError (one line) for an unknown mode or a judge kind
    without labels, LabelError for a label its tokenizer splits."""
    check_verdict_mode(verdict)
    if verdict == "text":
        return None
    if labels is None:
        raise ValueError(f"a {kind} judge has no logprobs verdict (it answers with a ranking); use verdict 'text'")
    if isinstance(verdict, LogprobVerdict):
        return verdict
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        return LogprobVerdict(labels)
    name = getattr(getattr(backend, "model", None), "name", None) or getattr(backend, "identity", "the judge's model")
    return LogprobVerdict.for_tokenizer(tokenizer, labels, name=name)


def local_label_problem(model_dir, labels: Sequence[str] = POINTWISE_LABELS) -> str | None:
    """Why a local model directory cannot be a logprobs judge over `labels` (its tokenizer splits one), or
    None; None too when the directory has no loadable tokenizer (the model checks say so). For `marl
    validate`: it reads the tokenizer only, never the weights."""
    path = Path(model_dir)
    if not (path / "config.json").is_file() or model_folder_problem(path, require_weights=False) is not None:
        return None  # a FIFO in the tokenizer's place would hang the read: the model checks say what is wrong
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception:  # noqa: BLE001 - an unloadable directory is the model checks' to report
        return None
    try:
        LogprobVerdict.for_tokenizer(tokenizer, labels, name=path.name)
    except LabelError as error:
        return str(error)
    return None


PROBE_MESSAGES = ({"role": "user", "content": "Is 2 + 2 = 4? Reply Yes or No."},)


async def logprobs_problem(backend) -> str | None:
    """Ask `backend` one verdict-shaped token (no cache: give a backend without a ledger label) and say
    what stops the logprobs verdict: None when its reply carries logprobs, "its reply carries no logprobs"
    when it does not, or the failure ("api_error: 400: ...") when it does not answer."""
    request = ChatRequest(messages=PROBE_MESSAGES, max_tokens=1, temperature=0.0, logprobs=True,
                          top_logprobs=TOP_LOGPROBS, verdict="logprobs")
    response = await backend.complete(request)
    if response.status not in ("ok", "truncated"):
        return f"{response.status}: {response.error or 'no answer'}"
    return "its reply carries no logprobs" if response.token_logprobs is None else None
