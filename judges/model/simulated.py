"""A simulated LLM judge: an object shaped like `openai.AsyncOpenAI` answering judge prompts from a
logit-additive model with known, injectable biases (for tests and documentation; no network).

Prompt formats it understands (build them with `pairwise_prompt` / `pointwise_prompt` /
`listwise_prompt`, or with the same markers elsewhere, e.g. judges.model.prompts). It reads the answers from
the LAST user message, so instructions may sit in a system message:

Pairwise (MT-Bench pair-v2 style): both answers fenced, in this order, anywhere in the message:

    [The Start of Assistant A's Answer]
    {answer A}
    [The End of Assistant A's Answer]

    [The Start of Assistant B's Answer]
    {answer B}
    [The End of Assistant B's Answer]

  Reply: one line of reasoning, then the verdict on its own line: `[[A]]`, `[[B]]` or `[[C]]` (tie).
  Tokens: the verdict letter is its own token, preceded by "[[" and followed by "]]".

Pointwise (MT-Bench single-v1 style): one answer fenced as

    [The Start of Assistant's Answer]
    {answer}
    [The End of Assistant's Answer]

  plus a scale "from LO to HI" or "scale of LO to HI" written OUTSIDE the fence, in the last user
  message or else in any other message such as the system prompt (default 1 to 10, integers, at most
  20 values). Reply: one line of reasoning, then `Rating: [[N]]`, where N is one token ("1" .. "10").

Listwise: two or more answers fenced as `[The Start of Response i]` ... `[The End of Response i]`,
  i = 1, 2, ... Reply: one line of reasoning, then the ranking, best first, as tokens
  "[[", "3", ", ", "1", ", ", "2", "]]" (text `[[3, 1, 2]]`).

Answers are fenced and defused by `judges.model.prompts` (the judges' own builders; a "[The Start of" /
"[The End of" inside an answer gets a zero-width space, and any other defusing that breaks the exact
marker works too), so an answer cannot close its own fence. Any other prompt gets a
reply without a verdict (exercises parse-error paths).

The model. Features of an answer text:
  q     = quality(text): the callable, or the dict's value (0.0 for texts not in the dict);
  z_len = log((1 + words) / (1 + 100)): log length, 0 at 100 words;
  md    = 1 if it has markdown (a line starting with "#", "- ", "* " or "1. ", or "**bold**"), else 0;
  cite  = 1 if it has a fake citation like "(Smith et al., 2021)" or "[1]", else 0;
  self  = 1 if it contains the self-attribution marker SELF_MARKER ("As SimJudge,"), else 0;
  key   = 1 for a master-key answer: stripped, it starts with "Thought process:" or "Let's solve this
          problem step by step", or it is only ":", ".", "Solution" or "Solution:"; else 0.
Pairwise logit of "A better": l = sharpness*(q_A - q_B) + position + length_slope*(z_len_A - z_len_B)
  + format_effect*(md_A - md_B) + authority*(cite_A - cite_B) + self_preference*(self_A - self_B)
  + master_key*(key_A - key_B). Verdict logits (Davidson ties): A: l/2, B: -l/2, C: tie_logit (no
  ties when tie_logit is None: C then has probability 0, reported as logprob -9999.0). So
  P(A)/(P(A)+P(B)) = sigmoid(l) exactly.
Listwise: utilities u_i = sharpness*q_i + the bias terms of answer i (+ position for Response 1); the
  ranking is a Plackett-Luce draw: each number token's logprobs are the exact log-softmax of u over the
  responses not yet ranked.
Pointwise: s = leniency + sharpness*q + the same bias terms of the one answer (no position).
  mu = LO + (HI - LO)*sigmoid(s); spread tau = rating_spread*(HI - LO)/9 (0.5 points on 1-10);
  P(N=k) = F(k + 1/2) - F(k - 1/2) with F the logistic CDF(mu, tau), the end bins open (a
  discretised logistic).
Logprobs: each verdict/rating/ranking token's top_logprobs are the EXACT log-probabilities above (sorted,
  best first, the first `top_logprobs` of them); other tokens have logprob 0. The sampled label is
  drawn from p^(1/temperature) (argmax at temperature 0) with a random.Random keyed on (seed, the
  request's messages and seed), so the same request always gets the same answer (cache replays match).
  The request's own temperature is ignored: `temperature` is the judge's intrinsic decision noise.
If the reply has more tokens than max_tokens it is cut there with finish_reason "length"; asked for one
token (max_tokens 1: the logprobs verdict, judges.model.verdict), the reply is the verdict token itself:
"A" / "B" (/ "C") for a pair, "Yes" / "No" for one answer with P(Yes) = sigmoid(s).
`fail(request_index)` may return None (answer normally), an exception (raised), an int HTTP status
(raises SimulatedAPIError), or "refusal" / "length" / "timeout" / "malformed".
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from judges.model.prompts import defuse, listwise_messages, pairwise_messages, pointwise_messages

PAIRWISE_LABELS = ("A", "B", "C")
SELF_MARKER = "As SimJudge,"
MASTER_KEY_PREFIXES = ("Thought process:", "Let's solve this problem step by step")
MASTER_KEY_ANSWERS = (":", ".", "Solution", "Solution:")
REFERENCE_WORDS = 100
FLOOR_LOGPROB = -9999.0
DEFAULT_SCALE = (1, 10)
START = "[The Start of Assistant{slot}'s Answer]"
END = "[The End of Assistant{slot}'s Answer]"
LIST_START = "[The Start of Response {i}]"
LIST_END = "[The End of Response {i}]"
LISTWISE_INSTRUCTIONS = (
    "Please act as an impartial judge and rank the {n} responses to the user question displayed below from "
    "best to worst. After a short explanation, output the ranking by strictly following this format: "
    "\"[[i, j, ...]]\" with every response number exactly once, best first.")
PAIRWISE_INSTRUCTIONS = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two AI "
    "assistants to the user question displayed below. Avoid any position biases and do not let the length "
    "of the responses influence your evaluation. After providing your explanation, output your final "
    "verdict by strictly following this format: \"[[A]]\" if assistant A is better, \"[[B]]\" if "
    "assistant B is better, and \"[[C]]\" for a tie.")
POINTWISE_INSTRUCTIONS = (
    "Please act as an impartial judge and evaluate the quality of the response provided by an AI "
    "assistant to the user question displayed below. After providing your explanation, you must rate the "
    "response on a scale of {lo} to {hi} by strictly following this format: \"[[rating]]\", for example: "
    "\"Rating: [[{example}]]\".")

_MARKDOWN = re.compile(r"(?m)^\s*(#{1,6}\s|[-*]\s|\d+\.\s)|\*\*[^*\n]+\*\*")
_CITATION = re.compile(r"\([A-Z][A-Za-z'-]+ et al\.,? \d{4}\)|\[\d+\]")
_SCALE = re.compile(r"(?:from|scale of)\s+(-?\d+)\s+to\s+(-?\d+)", re.IGNORECASE)
_WORD = re.compile(r"\S+")


# -- prompt building and parsing -------------------------------------------------------------------------
# The answers are fenced and defused by judges.model.prompts, the judges' own prompt builders, so the simulator
# reads exactly what a real judge is sent; these helpers only put other instructions in front.
def escape_answer(text: str) -> str:
    """Neutralise fence markers inside a candidate answer (judges.model.prompts.defuse)."""
    return defuse(text)


def pairwise_prompt(question: str, answer_a: str, answer_b: str, *,
                    instructions: str = PAIRWISE_INSTRUCTIONS) -> str:
    """A pairwise judge prompt (instructions, question, both fenced answers)."""
    return f"{instructions}\n\n{pairwise_messages(question, answer_a, answer_b)[-1]['content']}"


def pointwise_prompt(question: str, answer: str, *, scale: tuple[int, int] = DEFAULT_SCALE,
                     instructions: str = POINTWISE_INSTRUCTIONS) -> str:
    """A pointwise judge prompt; `instructions` may use {lo}, {hi} and {example}."""
    lo, hi = scale
    text = instructions.format(lo=lo, hi=hi, example=(lo + hi) // 2)
    return f"{text}\n\n{pointwise_messages(question, answer, scale)[-1]['content']}"


def _fenced(prompt: str, start_marker: str, end_marker: str) -> tuple[str, int, int] | None:
    """(text, start, end) of the first text fenced by the two markers, or None."""
    start = prompt.find(start_marker)
    if start < 0:
        return None
    end = prompt.find(end_marker, start + len(start_marker))
    if end < 0:
        return None
    answer = prompt[start + len(start_marker):end]
    answer = answer[1:] if answer.startswith("\n") else answer
    answer = answer[:-1] if answer.endswith("\n") else answer
    return answer, start, end + len(end_marker)


def _between(prompt: str, slot: str) -> tuple[str, int, int] | None:
    """(answer, start, end) of the fenced answer of `slot` ("A", "B", or "" for a single answer), or None."""
    name = f" {slot}" if slot else ""
    return _fenced(prompt, START.format(slot=name), END.format(slot=name))


def listwise_prompt(question: str, answers: Sequence[str], *, instructions: str = LISTWISE_INSTRUCTIONS) -> str:
    """A listwise judge prompt: the answers fenced as Response 1..n; `instructions` may use {n}."""
    return f"{instructions.format(n=len(answers))}\n\n{listwise_messages(question, list(answers))[-1]['content']}"


def parse_listwise_prompt(prompt: str) -> list[str] | None:
    """The answers fenced as Response 1, 2, ... (at least two), or None."""
    answers = []
    while (found := _fenced(prompt, LIST_START.format(i=len(answers) + 1), LIST_END.format(i=len(answers) + 1))):
        answers.append(found[0])
    return answers if len(answers) >= 2 else None


def parse_pairwise_prompt(prompt: str) -> tuple[str, str] | None:
    """(answer A, answer B) of a pairwise prompt, or None."""
    a, b = _between(prompt, "A"), _between(prompt, "B")
    return (a[0], b[0]) if a and b else None


def parse_pointwise_prompt(prompt: str, context: str = "") -> tuple[str, tuple[int, int]] | None:
    """(answer, (lo, hi)) of a pointwise prompt, or None. The scale is read outside the fence, in the
    prompt first, then in `context` (the other messages, e.g. a system prompt)."""
    found = _between(prompt, "")
    if found is None:
        return None
    answer, start, end = found
    match = _SCALE.search(prompt[:start] + "\n" + prompt[end:]) or _SCALE.search(context)
    scale = (int(match.group(1)), int(match.group(2))) if match else DEFAULT_SCALE
    if not 1 <= scale[1] - scale[0] <= 19:
        scale = DEFAULT_SCALE
    return answer, scale


@dataclass(frozen=True)
class StyleFeatures:
    """The simulator's view of an answer's style (see the module docstring)."""

    z_len: float
    markdown: int
    citation: int
    self_attribution: int
    master_key: int


def style_features(text: str) -> StyleFeatures:
    """Length, markdown, fake-citation, self-attribution and master-key features of `text`."""
    words = len(_WORD.findall(text))
    stripped = text.strip()
    key = stripped.startswith(MASTER_KEY_PREFIXES) or stripped in MASTER_KEY_ANSWERS
    return StyleFeatures(z_len=math.log((1 + words) / (1 + REFERENCE_WORDS)),
                         markdown=int(bool(_MARKDOWN.search(text))), citation=int(bool(_CITATION.search(text))),
                         self_attribution=int(SELF_MARKER in text), master_key=int(key))


def _log_softmax(logits: Mapping[str, float]) -> dict[str, float]:
    finite = [v for v in logits.values() if v != -math.inf]
    top = max(finite)
    total = top + math.log(sum(math.exp(v - top) for v in finite))
    return {k: (v - total if v != -math.inf else FLOOR_LOGPROB) for k, v in logits.items()}


def _log_sigmoid(x: float) -> float:
    """log(sigmoid(x)), without overflow at either end."""
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _logistic_cdf(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


class SimulatedAPIError(Exception):
    """An HTTP-style error from the simulated endpoint (status_code and headers, like openai's)."""

    def __init__(self, status_code: int, message: str = "", headers: Mapping[str, str] | None = None):
        super().__init__(message or f"simulated error {status_code}")
        self.status_code = status_code
        self.message = message or f"simulated error {status_code}"
        self.headers = dict(headers or {})
        self.response = SimpleNamespace(status_code=status_code, headers=self.headers)


class SimulatedTimeout(TimeoutError):
    """The simulated endpoint did not answer in time."""


def _tokens(text: str) -> list[str]:
    """Whitespace-led word tokens whose concatenation is `text`."""
    return re.findall(r"\s*\S+", text)


def _ns_logprob(token: str, logprob: float, top: Sequence[tuple[str, float]]) -> SimpleNamespace:
    return SimpleNamespace(token=token, logprob=logprob, bytes=list(token.encode()),
                           top_logprobs=[SimpleNamespace(token=t, logprob=lp, bytes=list(t.encode())) for t, lp in top])


class SimulatedClient:
    """Looks like `openai.AsyncOpenAI` to OpenAIBackend: `await client.chat.completions.create(...)`.

    See the module docstring for the prompt formats and the model. `calls` counts create() calls;
    `base_url` ("sim://judge-<fingerprint of the parameters>") makes backend identities differ between
    differently biased simulators.
    """

    def __init__(self, quality: Callable[[str], float] | Mapping[str, float], *, position: float = 0.0,
                 length_slope: float = 0.0, format_effect: float = 0.0, authority: float = 0.0,
                 self_preference: float = 0.0, master_key: float = 0.0, leniency: float = 0.0,
                 sharpness: float = 2.0, temperature: float = 1.0, tie_logit: float | None = None,
                 rating_spread: float = 0.5, seed: int = 0, latency_s: float = 0.0,
                 fail: Callable[[int], Any] | None = None):
        self.quality = quality
        self.position, self.length_slope, self.format_effect = position, length_slope, format_effect
        self.authority, self.self_preference, self.master_key = authority, self_preference, master_key
        self.leniency, self.sharpness, self.temperature = leniency, sharpness, temperature
        self.tie_logit, self.rating_spread, self.seed = tie_logit, rating_spread, seed
        self.latency_s = latency_s
        self.fail = fail
        self.calls = 0
        self.base_url = f"sim://judge-{self._fingerprint()}"
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def _fingerprint(self) -> str:
        quality = (sorted(self.quality.items()) if isinstance(self.quality, Mapping)
                   else f"{getattr(self.quality, '__module__', '')}.{getattr(self.quality, '__qualname__', '')}")
        blob = json.dumps([quality, self.position, self.length_slope, self.format_effect, self.authority,
                           self.self_preference, self.master_key, self.leniency, self.sharpness, self.temperature,
                           self.tie_logit, self.rating_spread, self.seed], default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    # -- the model ---------------------------------------------------------------------------------------
    def quality_of(self, text: str) -> float:
        """q(text): the callable's value, or the dict's (0.0 when absent)."""
        if isinstance(self.quality, Mapping):
            return float(self.quality.get(text, 0.0))
        return float(self.quality(text))

    def bias_of(self, text: str) -> float:
        """The style terms of one answer: length, markdown, citation, self-attribution, master key."""
        f = style_features(text)
        return (self.length_slope * f.z_len + self.format_effect * f.markdown + self.authority * f.citation
                + self.self_preference * f.self_attribution + self.master_key * f.master_key)

    def pairwise_logit(self, answer_a: str, answer_b: str) -> float:
        """The logit of "A better than B" (position bias included)."""
        quality = self.sharpness * (self.quality_of(answer_a) - self.quality_of(answer_b))
        return quality + self.position + self.bias_of(answer_a) - self.bias_of(answer_b)

    def pairwise_logprobs(self, answer_a: str, answer_b: str) -> dict[str, float]:
        """Exact log-probabilities of the verdicts "A", "B", "C"."""
        logit = self.pairwise_logit(answer_a, answer_b)
        tie = -math.inf if self.tie_logit is None else self.tie_logit
        return _log_softmax({"A": logit / 2, "B": -logit / 2, "C": tie})

    def pointwise_logit(self, answer: str) -> float:
        """s = leniency + sharpness*q + the style terms."""
        return self.leniency + self.sharpness * self.quality_of(answer) + self.bias_of(answer)

    def rating_logprobs(self, answer: str, scale: tuple[int, int] = DEFAULT_SCALE) -> dict[str, float]:
        """Exact log-probabilities of each rating token (a discretised logistic over the scale)."""
        lo, hi = scale
        mu = lo + (hi - lo) * _logistic_cdf(self.pointwise_logit(answer))
        tau = self.rating_spread * (hi - lo) / 9
        cdf = [0.0] + [_logistic_cdf((k + 0.5 - mu) / tau) for k in range(lo, hi)] + [1.0]
        probabilities = [max(cdf[i + 1] - cdf[i], 0.0) for i in range(hi - lo + 1)]
        total = sum(probabilities)
        return {str(lo + i): (math.log(p / total) if p > 0 else FLOOR_LOGPROB) for i, p in enumerate(probabilities)}

    # -- answering ---------------------------------------------------------------------------------------
    def _rng(self, messages: Sequence[Mapping[str, str]], seed: int | None) -> random.Random:
        blob = json.dumps({"seed": self.seed, "messages": list(messages), "request_seed": seed}, sort_keys=True)
        return random.Random(int(hashlib.sha256(blob.encode()).hexdigest()[:16], 16))

    def _sample(self, logprobs: Mapping[str, float], rng: random.Random) -> str:
        """A label drawn from p^(1/temperature) (the argmax at temperature 0)."""
        labels = list(logprobs)
        if self.temperature <= 0:
            return max(labels, key=lambda label: logprobs[label])
        scaled = {label: logprobs[label] / self.temperature for label in labels}
        top = max(scaled.values())
        weights = [math.exp(scaled[label] - top) for label in labels]
        return rng.choices(labels, weights=weights)[0]

    def listwise_utilities(self, answers: Sequence[str]) -> list[float]:
        """u_i = sharpness*q_i + style terms (+ position for the first response shown)."""
        return [self.sharpness * self.quality_of(a) + self.bias_of(a) + (self.position if i == 0 else 0.0)
                for i, a in enumerate(answers)]

    def _ranking(self, answers: Sequence[str], rng: random.Random) -> tuple[list[str], dict[int, dict[str, float]]]:
        """A Plackett-Luce ranking as tokens "[[", "2", ", ", "1", "]]" and the exact logprobs at each number."""
        utilities = dict(zip((str(i) for i in range(1, len(answers) + 1)), self.listwise_utilities(answers)))
        tokens, distributions = ["[["], {}
        while utilities:
            distribution = _log_softmax(utilities)
            choice = self._sample(distribution, rng)
            if len(tokens) > 1:
                tokens.append(", ")
            distributions[len(tokens)] = distribution
            tokens.append(choice)
            del utilities[choice]
        return tokens + ["]]"], distributions

    def answer(self, prompt: str, rng: random.Random, context: str = "",
               one_token: bool = False) -> tuple[list[str], dict[int, dict[str, float]]]:
        """(reply tokens, {index of a verdict token: its exact logprobs}) for one prompt; `context` is the
        text of the other messages (where a pointwise scale may be written). Asked for `one_token` (the
        logprobs verdict: max_tokens 1), the verdict is the first token: "A" / "B" (/ "C") for a pair,
        "Yes" / "No" for one answer, P(Yes) = sigmoid(s)."""
        reasoning = _tokens("I compared the answers for helpfulness, relevance, accuracy and level of detail.")
        pair = parse_pairwise_prompt(prompt)
        if pair is not None and one_token:
            distribution = self.pairwise_logprobs(*pair)
            return [self._sample(distribution, rng)], {0: distribution}
        if pair is not None:
            distribution = self.pairwise_logprobs(*pair)
            tokens = reasoning + ["\n", "[[", self._sample(distribution, rng), "]]"]
            return tokens, {len(tokens) - 2: distribution}
        answers = parse_listwise_prompt(prompt)
        if answers is not None:
            ranking, distributions = self._ranking(answers, rng)
            offset = len(reasoning) + 1
            return reasoning + ["\n"] + ranking, {offset + i: d for i, d in distributions.items()}
        single = parse_pointwise_prompt(prompt, context)
        if single is not None and one_token:
            s = self.pointwise_logit(single[0])
            distribution = {"Yes": _log_sigmoid(s), "No": _log_sigmoid(-s)}
            return [self._sample(distribution, rng)], {0: distribution}
        if single is not None:
            distribution = self.rating_logprobs(*single)
            tokens = reasoning + ["\n", "Rating", ":", " [[", self._sample(distribution, rng), "]]"]
            return tokens, {len(tokens) - 2: distribution}
        return _tokens("I could not find an answer to evaluate in the prompt."), {}

    async def create(self, *, model: str, messages: Sequence[Mapping[str, str]], max_tokens: int | None = 512,
                     temperature: float | None = None, logprobs: bool | None = False, top_logprobs: int | None = 0,
                     seed: int | None = None, **_: Any) -> SimpleNamespace:
        """The chat.completions.create look-alike (see the module docstring)."""
        index = self.calls
        self.calls += 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        failure = self.fail(index) if self.fail is not None else None
        if isinstance(failure, BaseException):
            raise failure
        if isinstance(failure, int):
            raise SimulatedAPIError(failure)
        if failure == "timeout":
            raise SimulatedTimeout(f"simulated timeout on request {index}")
        if failure == "malformed":
            return SimpleNamespace(id=f"sim-{index}", choices=[], usage=None)
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        prompt = messages[users[-1]].get("content", "") if users else ""
        context = "\n".join(m.get("content", "") for i, m in enumerate(messages) if not users or i != users[-1])
        tokens, verdicts = self.answer(prompt, self._rng(messages, seed), context, one_token=max_tokens == 1)
        finish_reason = "stop"
        if failure == "length" or (max_tokens is not None and len(tokens) > max_tokens):
            cut = min(verdicts, default=len(tokens)) - 1 if failure == "length" else (max_tokens or 0)
            tokens, finish_reason = tokens[:cut], "length"
        content_logprobs = self._logprobs(tokens, verdicts, top_logprobs or 0) if logprobs else None
        text = "".join(tokens)
        refusal = "I'm sorry, but I can't help with that." if failure == "refusal" else None
        prompt_tokens = sum(len(_WORD.findall(m.get("content", ""))) for m in messages)
        return SimpleNamespace(
            id=f"sim-{index}", object="chat.completion", model=model,
            choices=[SimpleNamespace(index=0, finish_reason=finish_reason,
                                     message=SimpleNamespace(role="assistant", content=None if refusal else text,
                                                             refusal=refusal),
                                     logprobs=None if refusal else SimpleNamespace(content=content_logprobs))],
            usage=SimpleNamespace(prompt_tokens=prompt_tokens, completion_tokens=len(tokens),
                                  total_tokens=prompt_tokens + len(tokens)))

    @staticmethod
    def _logprobs(tokens: Sequence[str], verdicts: Mapping[int, Mapping[str, float]],
                  top_k: int) -> list[SimpleNamespace]:
        """Per-token logprobs: 0 for the fixed tokens, the exact distribution at each verdict token."""
        rows = []
        for i, token in enumerate(tokens):
            if i in verdicts:
                ranked = sorted(verdicts[i].items(), key=lambda item: -item[1])
                rows.append(_ns_logprob(token, verdicts[i][token], ranked[:top_k]))
            else:
                rows.append(_ns_logprob(token, 0.0, [(token, 0.0)][:top_k]))
        return rows
