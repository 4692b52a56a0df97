"""The logprobs verdict (judges/model/verdict.py): labels read from the first token's probabilities, summed over
their spellings, un-boosted after logit_bias; a failed judgment when the labels hold under half; the mode in
the cache key; the simulated judge answering in one token."""

import math

import pytest

from judges.model.backend import ChatRequest, ChatResponse
from judges.model.prompted import ListwiseJudge, PairwiseJudge, PointwiseJudge
from judges.model.verdict import NO_LOGPROBS, LogprobVerdict, spellings
from judges.types import Candidate, Item

ITEM = Item(prompt="What is 2+2?", answer="4")


class OneToken:
    """A ChatBackend answering every request with one token whose alternatives are `alternatives`."""

    identity = "one-token"

    def __init__(self, alternatives, logprobs=True):
        self.alternatives, self.logprobs, self.requests = alternatives, logprobs, []

    async def complete(self, request):
        self.requests.append(request)
        table = ({t: math.log(p) for t, p in self.alternatives.items()},) if self.logprobs else None
        return ChatResponse("truncated", max(self.alternatives, key=self.alternatives.get), finish_reason="length",
                            token_logprobs=table)


def test_a_label_is_every_token_that_spells_it_a_letter_keeps_its_case():
    assert spellings("A") == ("A", " A")
    assert set(spellings("Yes")) == {"Yes", " Yes", "yes", " yes", "YES", " YES"}
    judge = PointwiseJudge(OneToken({"Yes": 0.3, " yes": 0.2, "\nYes": 0.1, "No": 0.2, "maybe": 0.2}),
                           verdict="logprobs")
    judgment = judge.score(ITEM, [Candidate("4")])[0]
    assert judgment.ok and judgment.label == "Yes"
    assert judgment.score == pytest.approx(0.6 / 0.8) and judgment.details["label_mass"] == pytest.approx(0.8)
    pair = PairwiseJudge(OneToken({"A": 0.4, " a": 0.3, " B": 0.3}), verdict="logprobs", orders="fixed")
    assert pair.score(ITEM, [Candidate("4"), Candidate("5")])[0].score == pytest.approx(0.4 / 0.7)  # " a" is no A


def test_the_request_is_one_greedy_token_with_the_top_20_and_the_mode_is_in_the_cache_key():
    backend = OneToken({"Yes": 0.9, "No": 0.1})
    judge = PointwiseJudge(backend, verdict="logprobs", max_tokens=512, temperature=0.7)
    judge.score(ITEM, [Candidate("4")])
    request = backend.requests[0]
    assert (request.max_tokens, request.temperature, request.logprobs, request.top_logprobs) == (1, 0.0, True, 20)
    assert request.verdict == "logprobs" and "Reply Yes or No." in request.messages[-1]["content"]
    text_twin = ChatRequest(**{**request.__dict__, "verdict": "text"})
    assert request.key("m") != text_twin.key("m")  # one mode never reads an answer asked for the other
    plain = ChatRequest(messages=request.messages)
    assert plain.key("m") == ChatRequest(messages=request.messages, verdict="text", logit_bias=()).key("m")
    assert judge.identity != PointwiseJudge(backend).identity  # a calibrator binds to the mode too


def test_labels_holding_under_half_the_probability_are_a_failed_judgment_never_a_number():
    judge = PairwiseJudge(OneToken({"A": 0.2, "B": 0.2, "The": 0.6}), verdict="logprobs")
    judgments = judge.score(ITEM, [Candidate("4"), Candidate("5")])
    assert all(j.status == "parse_error" and j.score is None for j in judgments)
    assert judgments[0].details["label_mass"] == pytest.approx(0.4)
    assert "hold 0.400 of the first token's probability, under 0.5" in judgments[0].rationale
    silent = PointwiseJudge(OneToken({"Y": 0.9, "N": 0.1}), verdict="logprobs").score(ITEM, [Candidate("4")])[0]
    assert silent.status == "parse_error" and silent.details["label_mass"] == 0.0


def test_a_reply_without_logprobs_fails_saying_which_setting_to_change():
    judgment = PointwiseJudge(OneToken({"Yes": 1.0}, logprobs=False), verdict="logprobs").score(ITEM, [Candidate("4")])[0]
    assert judgment.status == "error" and judgment.score is None and judgment.rationale == NO_LOGPROBS
    assert "verdict 'text'" in NO_LOGPROBS and "returns logprobs" in NO_LOGPROBS


def test_boosted_labels_are_read_back_unboosted_exactly():
    # a distribution over five tokens; the labels A, " A", B get bias 10 as an endpoint would apply it
    logits = {"A": 0.5, " A": -1.0, "B": 0.2, "x": 3.0, "y": 2.5}
    boosted = {"A": 1, " A": 2, "B": 3}

    def softmax(values):
        top = max(values.values())
        total = sum(math.exp(v - top) for v in values.values())
        return {t: math.exp(v - top) / total for t, v in values.items()}

    truth = softmax(logits)
    seen = softmax({t: v + (10.0 if t in boosted else 0.0) for t, v in logits.items()})
    verdict = LogprobVerdict(("A", "B"), boosted=boosted, bias=10.0)
    reading = verdict.read(ChatResponse("ok", "A", token_logprobs=({t: math.log(p) for t, p in seen.items()},)))
    assert reading.label_probabilities["A"] == pytest.approx(truth["A"] + truth[" A"], abs=1e-12)
    assert reading.label_probabilities["B"] == pytest.approx(truth["B"], abs=1e-12)
    assert reading.status == "parse_error"  # the labels hold ~0.2 before the boost: no verdict, boost or not
    assert verdict.settings()["logit_bias"] == ((1, 10.0), (2, 10.0), (3, 10.0))


def test_an_unseen_label_counts_zero_and_its_bound_is_recorded():
    alternatives = {"A": 0.9, **{f"t{i}": 0.004 for i in range(19)}}  # the top 20, B not among them
    judgment = PointwiseJudge(OneToken({"Yes": 0.9, **{f"t{i}": 0.004 for i in range(19)}}),
                              verdict="logprobs").score(ITEM, [Candidate("4")])[0]
    assert judgment.ok and judgment.score == 1.0
    assert judgment.details["unseen"] == ["No"] and judgment.details["unseen_at_most"] == pytest.approx(0.004)
    assert PairwiseJudge(OneToken(alternatives), verdict="logprobs", orders="fixed").score(
        ITEM, [Candidate("4"), Candidate("5")])[0].score == 1.0


def test_the_simulated_judge_answers_in_one_token_and_the_verdict_reads_its_exact_probability():
    from judges.model.openai_backend import OpenAIBackend
    from judges.model.simulated import SimulatedClient

    client = SimulatedClient(lambda text: 1.0 if "four" in text else 0.0, sharpness=3.0, position=0.4)
    backend = OpenAIBackend(client, model="sim")
    pair = PairwiseJudge(backend, verdict="logprobs")
    good, bad = Candidate("four"), Candidate("five")
    judgment = pair.score(ITEM, [good, bad])[0]
    slot1 = [1 / (1 + math.exp(-(3.0 + 0.4))), 1 / (1 + math.exp(-(-3.0 + 0.4)))]  # P(slot 1 better) per order
    assert judgment.score == pytest.approx((slot1[0] + 1 - slot1[1]) / 2)  # position bias cancels in the average
    assert judgment.details["verdicts"] == ("a", "a") and judgment.details["label_mass_per_order"] == pytest.approx([1.0, 1.0])
    single = PointwiseJudge(backend, verdict="logprobs").score(ITEM, [good])[0]
    assert single.score == pytest.approx(1 / (1 + math.exp(-3.0)))


def test_unknown_modes_and_kinds_without_labels_are_refused_in_one_line():
    with pytest.raises(ValueError, match="verdict='logprob' must be one of text, logprobs"):
        PointwiseJudge(OneToken({"Yes": 1.0}), verdict="logprob")
    with pytest.raises(ValueError, match="a listwise judge has no logprobs verdict"):
        ListwiseJudge(OneToken({"Yes": 1.0}), verdict="logprobs")
    with pytest.raises(ValueError, match="spelled alike"):
        LogprobVerdict(("Yes", "yes"))


def test_a_label_the_tokenizer_splits_is_one_line_naming_it(real_model_dirs):
    from transformers import AutoTokenizer

    from judges.model.verdict import LabelError, local_label_problem

    tokenizer = AutoTokenizer.from_pretrained(real_model_dirs["qwen2"])  # a 400-token BPE: "Yes" is Y + es
    with pytest.raises(LabelError) as split:
        LogprobVerdict.for_tokenizer(tokenizer, ("Yes", "No"), name="tiny")
    assert str(split.value).startswith("verdict label 'Yes' is 2 tokens for tiny's tokenizer ('Y' + 'es')")
    assert "\n" not in str(split.value) and "verdict 'text'" in str(split.value)
    letters = LogprobVerdict.for_tokenizer(tokenizer, ("A", "B"))
    assert set(letters.boosted) == {"A", " A", "B", " B"}
    assert local_label_problem(real_model_dirs["qwen2"]) == str(split.value).replace("tiny", "qwen2")
    assert local_label_problem(real_model_dirs["qwen2"], ("A", "B")) is None
