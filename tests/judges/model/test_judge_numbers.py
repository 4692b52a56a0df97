"""Numbers or nothing (issue 10): a judge answer that is not a usable number never becomes a score.

Every case goes through the real openai client to a real OpenAI-compatible server on 127.0.0.1
(tests/judge_server.py): NaN / infinite / overflowing logprobs, a rating off its scale, answers above
the size cap (announced, or streamed chunked with no length). Each becomes a failed Judgment with
its reason, is never cached, and a rerun calls the endpoint again.
"""

from __future__ import annotations

import json
import math
import sqlite3

import pytest

from helpers.judge_server import JudgeServer
from judges.model.backend import ChatRequest, ChatResponse, checked_response
from judges.model.cache import CacheMiss, JudgeCache
from judges.model.prompted import PairwiseJudge, PointwiseJudge
from judges.model.openai_backend import OpenAIBackend, run_sync
from judges.types import Candidate, Item

ITEM = Item(prompt="What is 2+2?", answer="4")


@pytest.fixture
def backends():
    """OpenAIBackends over real openai clients, closed after the test."""
    made: list[OpenAIBackend] = []

    def make(url: str, **options) -> OpenAIBackend:
        backend = OpenAIBackend(base_url=url, **{"model": "judge-model", "backoff_s": 0.01, "max_retries": 0,
                                                 **options})
        made.append(backend)
        return backend

    yield make
    for backend in made:
        run_sync(backend.aclose())


def _rating(logprob: float) -> tuple:
    """A pointwise answer `Rating: [[7]]` whose rating token carries `logprob`."""
    return ("ok", "Fine. Rating: [[7]]", [("Rating", {"Rating": 0.0}), ("7", {"7": logprob, "8": -2.0})])


@pytest.mark.parametrize("logprob, reason", [
    (math.nan, "logprob nan of token '7' at position 1 is not a finite number"),
    (math.inf, "logprob inf of token '7' at position 1 is not a finite number"),
    (-math.inf, "logprob -inf of token '7' at position 1 is not a finite number"),
    (800.0, "logprob 800.0 of token '7' at position 1 is above 0 (a probability above 1)"),
])
def test_non_finite_or_overflowing_logprobs_fail_and_are_asked_again(backends, tmp_path, logprob, reason):
    cache_path = tmp_path / "cache.sqlite"
    with JudgeServer(default=_rating(logprob)) as server:
        judge = PointwiseJudge(backends(server.url, cache=JudgeCache(cache_path)))
        first = judge.score(ITEM, [Candidate("4")])[0]
        rerun = PointwiseJudge(backends(server.url, cache=JudgeCache(cache_path))).score(ITEM, [Candidate("4")])[0]
        assert server.requests == 2  # nothing was cached: the rerun called the endpoint again
    for judgment in (first, rerun):
        assert judgment.status == "api_error" and judgment.score is None and not judgment.cached
        assert judgment.rationale == f"invalid response: {reason}"
    assert len(JudgeCache(cache_path)) == 0


def test_pairwise_with_a_nan_logprob_is_a_failed_pair_never_a_probability(backends):
    answer = ("ok", "[[A]]", [("A", {"A": math.nan, "B": -1.0, "C": -3.0})])
    with JudgeServer(default=answer) as server:
        judgments = PairwiseJudge(backends(server.url)).score(ITEM, [Candidate("4"), Candidate("5")])
    assert [j.status for j in judgments] == ["api_error", "api_error"]
    assert all(j.score is None and "logprob nan of token 'A'" in j.rationale for j in judgments)


def test_a_rating_off_its_scale_is_a_parse_error(backends):
    with JudgeServer(default=("ok", "Rating: [[11]]", [("11", {"11": -0.1})])) as server:
        judgment = PointwiseJudge(backends(server.url)).score(ITEM, [Candidate("4")])[0]
    assert judgment.status == "parse_error" and judgment.score is None
    assert judgment.rationale == "no 'Rating: [[N]]' with N in 1..10 at the end of the reply"


def test_a_valid_answer_still_scores_and_is_cached(backends, tmp_path):
    with JudgeServer(default=_rating(math.log(0.75))) as server:
        judge = PointwiseJudge(backends(server.url, cache=JudgeCache(tmp_path / "c.sqlite")))
        judgment = judge.score(ITEM, [Candidate("4")])[0]
    expected = (0.75 / (0.75 + math.exp(-2.0)) * 7 + math.exp(-2.0) / (0.75 + math.exp(-2.0)) * 8 - 1) / 9
    assert judgment.ok and judgment.score == pytest.approx(expected)
    assert len(JudgeCache(tmp_path / "c.sqlite")) == 1


@pytest.mark.parametrize("kind, message", [
    ("ok", "response too large: Content-Length"),  # refused from the header, before the body is read
    ("chunked", "response too large: more than 100000 bytes (max_response_bytes); the download was stopped"),
])
def test_an_answer_above_the_size_cap_is_refused_once_and_never_cached(backends, tmp_path, kind, message):
    huge = "x" * 300_000 + " [[A]]"
    cache = JudgeCache(tmp_path / "c.sqlite")
    with JudgeServer(default=(kind, huge)) as server:
        backend = backends(server.url, cache=cache, max_response_bytes=100_000, max_retries=3)
        response = run_sync(backend.complete(ChatRequest(messages=({"role": "user", "content": "q"},))))
        assert server.requests == 1  # not retried: the same request would get the same answer
    assert response.status == "api_error" and response.error.startswith(message)
    assert response.text == "" and len(cache) == 0
    assert (tmp_path / "c.sqlite").stat().st_size < 100_000


def test_the_default_cap_is_one_megabyte_on_the_wire(backends):
    with JudgeServer([("ok", "y" * 1_100_000), ("ok", "y" * 900_000)]) as server:
        backend = backends(server.url)
        too_big = run_sync(backend.complete(ChatRequest(messages=({"role": "user", "content": "a"},))))
        fits = run_sync(backend.complete(ChatRequest(messages=({"role": "user", "content": "b"},))))
    assert backend.max_response_bytes == 1_000_000
    assert too_big.status == "api_error" and "> the cap of 1000000 bytes" in too_big.error
    assert fits.status == "ok" and len(fits.text) == 900_000


class _BigAnswerClient:
    """Shaped like openai.AsyncOpenAI: every create() returns a 5 000-character answer."""

    base_url = "big://client"

    def __init__(self):
        async def create(**_):
            return {"choices": [{"finish_reason": "stop", "message": {"content": "z" * 5_000}}]}

        self.chat = type("Chat", (), {"completions": type("Completions", (), {"create": staticmethod(create)})})


def test_any_client_is_capped_on_the_parsed_answer():
    """A client passed in (not built here) has no capped transport: the parsed answer is checked."""
    backend = OpenAIBackend(_BigAnswerClient(), model="big", max_response_bytes=1_000)
    response = run_sync(backend.complete(ChatRequest(messages=({"role": "user", "content": "q"},))))
    assert response.status == "api_error"
    assert response.error == "response too large: 5000 bytes > the cap of 1000 bytes (max_response_bytes)"


def test_the_cache_refuses_unusable_answers_and_forgets_old_ones(tmp_path):
    path = tmp_path / "c.sqlite"
    cache = JudgeCache(path, max_entry_bytes=1_000)
    request = ChatRequest(messages=({"role": "user", "content": "q"},))
    assert not cache.store(request, "b", ChatResponse("ok", "x", token_logprobs=({"x": math.nan},)))
    assert not cache.store(request, "b", ChatResponse("ok", "x" * 2_000))
    assert cache.refused == 2 and len(cache) == 0
    assert cache.store(request, "b", ChatResponse("ok", "fine", token_logprobs=({"fine": -0.5},)))
    # an entry with a NaN logprob written by an older version: a miss, deleted, asked again
    poisoned = {**ChatResponse("ok", "bad").to_json(), "token_logprobs": [{"bad": math.nan}]}
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE responses SET response = ?", (json.dumps(poisoned),))
    assert cache.lookup(request, "b") is None and len(cache) == 0
    cache.close()
    strict = JudgeCache(path, mode="replay_strict")
    with pytest.raises(CacheMiss, match="has no response for backend 'b'"):
        strict.lookup(request, "b")


def test_checked_response_keeps_failures_and_good_answers_as_they_are():
    good = ChatResponse("ok", "[[A]]", token_logprobs=({"A": -0.0001, "B": -9.0},))
    tiny_positive = ChatResponse("ok", "[[A]]", token_logprobs=({"A": 0.0005},))  # rounding noise
    timeout = ChatResponse("timeout", error="timeout: slow")
    assert checked_response(good) is good and checked_response(tiny_positive) is tiny_positive
    assert checked_response(timeout) is timeout


def test_one_nan_answer_in_ten_fails_its_pair_and_the_report_still_finishes(backends, tmp_path):
    """The case of issue 10: one NaN answer in a hundred killed the whole report after all calls."""
    import threading

    from judges.stats.bias_report import ReportItem, run_bias_report

    lock, count = threading.Lock(), {"n": 0, "nan": 0}

    def answer(body):  # runs in the server's handler threads
        with lock:
            count["n"] += 1
            bad = count["n"] % 10 == 0
            count["nan"] += bad
        return ("ok", "[[A]]", [("A", {"A": math.nan if bad else -0.1, "B": -2.5, "C": -4.0})])

    items = [ReportItem(id=str(i), prompt=f"Explain {i}.", candidates=(f"good {i}", f"bad {i}"), gold=0)
             for i in range(10)]
    cache = JudgeCache(tmp_path / "c.sqlite")
    with JudgeServer(default=answer) as server:
        report = run_bias_report(PairwiseJudge(backends(server.url, cache=cache)), items, per_kind=5)
        calls = server.requests
    assert calls == report["n_calls"] and count["nan"] == calls // 10 > 0
    assert 0 < report["n_failed"] <= count["nan"]  # a NaN answer fails its pair, and only its pair
    assert len(cache) == calls - count["nan"]  # every answer but the NaN ones was cached
    json.dumps(report, allow_nan=False)
