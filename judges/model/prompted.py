"""Model judges: pointwise, pairwise (both orders), listwise (cyclic permutations) and panels.

Every judge is a `Scorer` (`score(item, candidates) -> list[Judgment]`, or `await ascore(...)`), so a
model judge and a rule verifier are interchangeable in a reward spec. Judges talk to a `ChatBackend`
(judges.model.backend) and never raise for an endpoint failure: a failed call, an unparseable verdict or
an out-of-range rating becomes a failed Judgment (status api_error, timeout, truncated, refusal,
parse_error) without a score. Whatever the backend, every answer is checked first
(`judges.model.backend.checked_response`): logprobs that are NaN, infinite or above 0, or an answer above
the size cap, fail the judgment ("invalid response: ..."); and a score that comes out non-finite or
outside [0, 1] is a failed judgment (status error), never a number.

- Pointwise: a rating on an integer scale, mapped to [0, 1]. With logprobs, the score is the
  probability-weighted rating (G-Eval); without, the parsed label. Which one was used is recorded in
  `details["scoring"]`, and `on_no_logprobs="error"` refuses the fallback.
- Pairwise: each pair is judged in both orders; P(a better) averages the two orders (ties count
  half), so position bias cancels in aggregate. Without logprobs the two verdicts vote and a
  conflict is a tie.
- Listwise: candidates are ranked `permutations` times in cyclically shifted orders, so each sits in
  each position equally often (with permutations = n); score = mean normalised rank.
- Panel: several judges, mean of their ok scores (failures left out; all failed = failed).

`verdict="logprobs"` (pointwise and pairwise judges) swaps the MT-Bench prompt for a one-token question
read from the first token's probabilities (judges.model.verdict): P(Yes) for one answer, P(A better) per
order for a pair; labels holding under half the probability fail the judgment.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from judges.model.backend import ChatBackend, ChatRequest, ChatResponse, checked_response, run_sync
from judges.model.prompts import (DEFAULT_RUBRIC, LISTWISE_SYSTEM, PAIRWISE_SYSTEM, POINTWISE_SYSTEM, listwise_messages,
                            pairwise_messages, parse_pairwise, parse_ranking, parse_rating, pointwise_messages,
                            template_hash)
from judges.model.verdict import PAIRWISE_LABELS, POINTWISE_LABELS, label_verdict
from judges.types import Candidate, Item, Judgment, failed


class ModelJudge:
    """Shared plumbing: the backend, sampling settings, identity, and the sync wrapper."""

    kind = "model"
    templates: tuple[str, ...] = ()
    labels: tuple[str, ...] | None = None  # the labels of the logprobs verdict (None: the kind has none)

    def __init__(self, backend: ChatBackend, *, name: str | None = None, rubric: str = DEFAULT_RUBRIC,
                 max_tokens: int = 512, temperature: float = 0.0, seed: int = 0, logprobs: bool = True,
                 top_logprobs: int = 5, verdict="text"):
        self.backend, self.rubric = backend, rubric
        self.name = name or f"{self.kind}-judge"
        # 'text' (None here) or the logprobs plug-in; a local backend's tokenizer checks the labels now
        self.verdict = label_verdict(verdict, self.labels, backend, self.kind)
        if self.verdict is None:
            self.settings = dict(max_tokens=max_tokens, temperature=temperature, seed=seed, logprobs=logprobs,
                                 top_logprobs=top_logprobs if logprobs else 0)
        else:  # one greedy token and its top alternatives, whatever the text mode's settings say
            self.settings = dict(seed=seed, **self.verdict.settings())
            self.templates = self.verdict.templates()

    @property
    def identity(self) -> str:
        """Names the model, endpoint, mode, prompts and settings: calibrators are bound to it."""
        settings = ",".join(f"{k}={v}" for k, v in sorted(self.settings.items()))
        return f"{self.kind}|{self.backend.identity}|{template_hash(self.rubric, *self.templates)}|{settings}"

    async def _ask(self, messages: tuple) -> ChatResponse:
        """The backend's answer, or an api_error when it cannot be used (see checked_response)."""
        response = await self.backend.complete(ChatRequest(messages=tuple(messages), **self.settings))
        limit = getattr(self.backend, "max_response_bytes", None)
        return checked_response(response, limit) if limit else checked_response(response)

    def score(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        """One Judgment per candidate (sync wrapper of `ascore`)."""
        return run_sync(self.ascore(item, candidates))

    async def ascore(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        raise NotImplementedError


def _failed_response(response: ChatResponse) -> Judgment | None:
    if response.status == "ok":
        return None
    return Judgment(response.status, None, rationale=response.error or f"the endpoint answered {response.status}",
                    latency=response.latency, cached=response.cached)


def _label_distribution(response: ChatResponse, labels: Sequence[str]) -> dict[str, float] | None:
    """Normalised probabilities of `labels` at the last generated position where they appear.

    Logprobs are clipped at 0 (checked_response already refused any clearly above it); a position whose
    labels all have probability 0 (logprobs of -1e9) carries no distribution.
    """
    for alternatives in reversed(response.token_logprobs or ()):
        found = {label: math.exp(min(lp, 0.0)) for token, lp in alternatives.items()
                 if (label := token.strip()) in labels}
        total = sum(found.values())
        if found and total > 0 and math.isfinite(total):
            return {label: found.get(label, 0.0) / total for label in labels}
    return None


def _bounded(judgment: Judgment) -> Judgment:
    """The judgment, or a failed one when its score is not a finite number in [0, 1]."""
    if judgment.ok and not (math.isfinite(judgment.score) and 0.0 <= judgment.score <= 1.0):
        return failed("error", f"the judge's score {judgment.score!r} is not a finite number in [0, 1]",
                      raw_label=judgment.label)
    return judgment


class PointwiseJudge(ModelJudge):
    """Rates each candidate alone on an integer scale (default 1-10); score in [0, 1]."""

    kind = "pointwise"
    templates = (POINTWISE_SYSTEM,)
    labels = POINTWISE_LABELS

    def __init__(self, backend: ChatBackend, *, scale: tuple[int, int] = (1, 10), on_no_logprobs: str = "label",
                 use_reference: bool = False, **options):
        super().__init__(backend, **options)
        if on_no_logprobs not in ("label", "error"):
            raise ValueError(f"on_no_logprobs={on_no_logprobs!r} must be 'label' or 'error'")
        if not (isinstance(scale, tuple | list) and len(scale) == 2 and scale[0] < scale[1]):
            raise ValueError(f"scale={scale!r} must be (low, high) with low < high")
        self.scale, self.on_no_logprobs, self.use_reference = tuple(scale), on_no_logprobs, use_reference

    async def ascore(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        reference = item.answer if self.use_reference else None
        if self.verdict is not None:
            responses = await asyncio.gather(*(self._ask(self.verdict.pointwise_messages(
                item.prompt, c.text, self.rubric, reference)) for c in candidates))
            return [_bounded(self.verdict.pointwise_judgment(response)) for response in responses]
        responses = await asyncio.gather(*(self._ask(pointwise_messages(item.prompt, c.text, self.scale, self.rubric,
                                                                         reference)) for c in candidates))
        return [_bounded(self._judgment(response)) for response in responses]

    def _judgment(self, response: ChatResponse) -> Judgment:
        if (failure := _failed_response(response)) is not None:
            return failure
        low, high = self.scale
        rating = parse_rating(response.text, self.scale)
        if rating is None:
            return failed("parse_error", f"no 'Rating: [[N]]' with N in {low}..{high} at the end of the reply")
        labels = [str(v) for v in range(low, high + 1)]
        distribution = _label_distribution(response, labels) if self.settings["logprobs"] else None
        if distribution is None and self.on_no_logprobs == "error":
            return failed("parse_error", "the endpoint returned no logprobs for the rating and on_no_logprobs='error'")
        if distribution is not None:
            value, scoring = sum(int(label) * p for label, p in distribution.items()), "logprob_expectation"
        else:
            value, scoring = float(rating), "label"
        return Judgment("ok", (value - low) / (high - low), label=str(rating), probabilities=distribution,
                        rationale=response.text[-400:], details={"scoring": scoring, "rating": rating},
                        usage=response.usage, latency=response.latency, cached=response.cached)


@dataclass(frozen=True)
class PairJudgment:
    """A pair judged in both orders: p_a = P(a better), position-balanced; None when a call failed."""

    p_a: float | None
    verdicts: tuple[str | None, ...]  # per order, in the frame of (a, b): "a", "b", "tie" or None
    consistent: bool | None
    status: str
    rationale: str = ""
    # per order, P(the candidate in slot 1 is better), when the judge gives exact probabilities per order (a
    # reward model's Bradley-Terry ones, a logprobs verdict's); the bias report then fits its slopes on them
    slot1_probabilities: tuple[float, ...] | None = None
    details: dict = field(default_factory=dict)  # evidence (a logprobs verdict's label mass), failures too


class PairwiseJudge(ModelJudge):
    """Compares two candidates, in both orders by default; scores are P(better), summing to 1."""

    kind = "pairwise"
    templates = (PAIRWISE_SYSTEM,)
    labels = PAIRWISE_LABELS

    def __init__(self, backend: ChatBackend, *, orders: str = "both", **options):
        super().__init__(backend, **options)
        if orders not in ("both", "fixed"):
            raise ValueError(f"orders={orders!r} must be 'both' or 'fixed'")
        self.orders = orders

    async def compare(self, item: Item, a: Candidate, b: Candidate) -> PairJudgment:
        """Judge a against b (and b against a when orders='both')."""
        frames = [(a.text, b.text, False)] + ([(b.text, a.text, True)] if self.orders == "both" else [])
        if self.verdict is not None:
            return await self._compare_by_labels(item, frames)
        responses = await asyncio.gather(*(self._ask(pairwise_messages(item.prompt, x, y, self.rubric))
                                           for x, y, _ in frames))
        probabilities, verdicts = [], []
        for (_, _, swapped), response in zip(frames, responses):
            if (failure := _failed_response(response)) is not None:
                return PairJudgment(None, (), None, failure.status, failure.rationale)
            label = parse_pairwise(response.text)
            if label is None:
                return PairJudgment(None, (), None, "parse_error", "no [[A]], [[B]] or [[C]] at the end of the reply")
            distribution = _label_distribution(response, "ABC") if self.settings["logprobs"] else None
            distribution = distribution or {x: float(x == label) for x in "ABC"}
            first, second = ("B", "A") if swapped else ("A", "B")
            probabilities.append(distribution[first] + 0.5 * distribution["C"])
            verdicts.append({first: "a", second: "b", "C": "tie"}[label])
        if self.orders == "both" and not self.settings["logprobs"] and verdicts[0] != verdicts[1]:
            probabilities = [0.5, 0.5]  # two votes that disagree are a tie (MT-Bench rule)
        consistent = verdicts[0] == verdicts[1] if len(verdicts) == 2 else None
        p_a = sum(probabilities) / len(probabilities)
        if not (math.isfinite(p_a) and -1e-9 <= p_a <= 1 + 1e-9):
            return PairJudgment(None, (), None, "error", f"P(first better) {p_a!r} is not a finite number in [0, 1]")
        return PairJudgment(min(max(p_a, 0.0), 1.0), tuple(verdicts), consistent, "ok")

    async def _compare_by_labels(self, item: Item, frames: list) -> PairJudgment:
        """The logprobs verdict: P(slot 1 better) read from the first token in each order, averaged in the
        frame of (a, b); a reading that fails fails the pair (with its label mass in the details)."""
        responses = await asyncio.gather(*(self._ask(self.verdict.pairwise_messages(item.prompt, x, y, self.rubric))
                                           for x, y, _ in frames))
        readings = [self.verdict.read(response) for response in responses]
        masses = [reading.mass for reading in readings]
        if (failure := next((r for r in readings if not r.ok), None)) is not None:
            return PairJudgment(None, (), None, failure.status, failure.why,
                                details={**failure.details(), "label_mass_per_order": masses})
        slot1 = tuple(reading.probabilities[self.verdict.labels[0]] for reading in readings)
        p_orders = [1.0 - p if swapped else p for p, (_, _, swapped) in zip(slot1, frames)]
        verdicts = tuple("a" if p > 0.5 else "b" if p < 0.5 else "tie" for p in p_orders)
        p_a = min(max(sum(p_orders) / len(p_orders), 0.0), 1.0)
        return PairJudgment(p_a, verdicts, verdicts[0] == verdicts[1] if len(verdicts) == 2 else None, "ok",
                            slot1_probabilities=slot1,
                            details={"scoring": "label_probability", "label_mass_per_order": masses})

    async def ascore(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        if len(candidates) != 2:
            raise ValueError(f"a pairwise judge scores exactly 2 candidates, got {len(candidates)}")
        pair = await self.compare(item, candidates[0], candidates[1])
        if pair.p_a is None:
            return [failed(pair.status, pair.rationale, **pair.details)] * 2
        details = {"verdicts": pair.verdicts, "consistent": pair.consistent, **pair.details}
        return [Judgment("ok", pair.p_a, label="better" if pair.p_a > 0.5 else "worse", details=details),
                Judgment("ok", 1 - pair.p_a, label="better" if pair.p_a < 0.5 else "worse", details=details)]


class ListwiseJudge(ModelJudge):
    """Ranks a group of candidates in cyclically shifted orders; score = mean normalised rank."""

    kind = "listwise"
    templates = (LISTWISE_SYSTEM,)

    def __init__(self, backend: ChatBackend, *, permutations: int | None = None, **options):
        super().__init__(backend, **options)
        self.permutations = permutations

    async def ascore(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        n = len(candidates)
        if n < 2:
            raise ValueError("a listwise judge needs at least 2 candidates")
        shifts = range(self.permutations or n)
        orders = [[(start + i) % n for i in range(n)] for start in shifts]
        responses = await asyncio.gather(*(self._ask(listwise_messages(item.prompt, [candidates[i].text for i in order],
                                                                       self.rubric)) for order in orders))
        totals = [0.0] * n
        for order, response in zip(orders, responses):
            if (failure := _failed_response(response)) is not None:
                return [failure] * n
            ranking = parse_ranking(response.text, n)
            if ranking is None:
                return [failed("parse_error", f"no ranking of 1..{n} like [[2, 1, 3]] at the end of the reply")] * n
            for rank, shown in enumerate(ranking):
                totals[order[shown - 1]] += (n - 1 - rank) / (n - 1)
        return [_bounded(Judgment("ok", total / len(orders), details={"permutations": len(orders)}))
                for total in totals]


class Panel:
    """Several judges scoring the same candidates.

    `score` gives the mean of the ok scores per candidate. `score_batch` over many items can instead
    aggregate with Dawid-Skene: each judge's verdict (score > 0.5) is a noisy label, the EM fit learns
    every judge's sensitivity and specificity without gold, and the score is the posterior P(good),
    so a reliable judge counts for more than an erratic one. Failed verdicts are missing labels.
    """

    kind = "panel"

    def __init__(self, judges: Sequence, *, name: str = "panel"):
        if not judges:
            raise ValueError("a panel needs at least one judge")
        self.judges, self.name = list(judges), name
        self.last_fit = None

    @property
    def identity(self) -> str:
        return "panel[" + ";".join(judge.identity for judge in self.judges) + "]"

    def score(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        return run_sync(self.ascore(item, candidates))

    async def ascore(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        per_judge = await asyncio.gather(*(judge.ascore(item, candidates) for judge in self.judges))
        results = []
        for index in range(len(candidates)):
            verdicts = [judgments[index] for judgments in per_judge]
            scores = [v.score for v in verdicts if v.ok]
            if not scores:
                results.append(failed(verdicts[0].status, "every judge of the panel failed"))
                continue
            results.append(Judgment("ok", sum(scores) / len(scores),
                                    details={"judges": len(verdicts), "ok": len(scores)}))
        return results

    def score_batch(self, batch: Sequence[tuple[Item, Sequence[Candidate]]],
                    aggregate: str = "dawid_skene") -> list[list[Judgment]]:
        """Judgments for many (item, candidates); `aggregate` is 'mean' or 'dawid_skene'."""
        if aggregate not in ("mean", "dawid_skene"):
            raise ValueError(f"aggregate={aggregate!r} must be 'mean' or 'dawid_skene'")
        if aggregate == "mean" or len(self.judges) < 2:
            return [self.score(item, candidates) for item, candidates in batch]
        import numpy as np

        from judges.stats.inference import dawid_skene

        per_judge = [[judge.score(item, candidates) for item, candidates in batch] for judge in self.judges]
        units = [(b, c) for b, (_, candidates) in enumerate(batch) for c in range(len(candidates))]
        labels = np.array([[float(per_judge[j][b][c].score > 0.5) if per_judge[j][b][c].ok else np.nan
                            for j in range(len(self.judges))] for b, c in units])
        rated = ~np.all(np.isnan(labels), axis=1)
        fit = dawid_skene(labels[rated]) if rated.any() else None
        self.last_fit = fit
        posterior = iter(fit.posterior if fit is not None else ())
        results = [[None] * len(candidates) for _, candidates in batch]
        for (b, c), has_label in zip(units, rated):
            results[b][c] = Judgment("ok", float(next(posterior)), details={"aggregate": "dawid_skene"}) \
                if has_label else failed(per_judge[0][b][c].status, "every judge of the panel failed")
        return results
