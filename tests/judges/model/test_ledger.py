"""The judge ledger against a real loopback server with the real openai client: an answer already paid for
is read back, never asked again; failures are counted and never cached; an endpoint that goes down and
comes back is one line each way; a probe fails fast on a port where nothing listens."""

from __future__ import annotations

import socket

import pytest

from helpers.judge_server import JudgeServer
from judges.model.backend import ChatRequest
from judges.model.cache import JudgeCache
from judges.model.ledger import JudgeLedger, installed
from judges.model.openai_backend import OpenAIBackend, run_sync

MODEL = "judge-model"


def request(text: str = "Rate this answer.", **options) -> ChatRequest:
    return ChatRequest(messages=({"role": "user", "content": text},), **options)


@pytest.fixture
def backend_at():
    """OpenAIBackends labelled as a judge's (so they use the installed ledger), closed after the test."""
    made = []

    def make(url: str, **options) -> OpenAIBackend:
        backend = OpenAIBackend(base_url=url, model=MODEL, label="critic", backoff_s=0.01, **options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        run_sync(backend.aclose())


def free_port() -> int:
    """A loopback port where nothing listens (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_answer_already_paid_for_is_read_back_from_the_ledger_cache(tmp_path, backend_at):
    with JudgeServer(default=("ok", "Rating: [[7]]")) as server, \
            installed(JudgeLedger(JudgeCache(tmp_path / "cache.sqlite"))) as ledger:
        backend = backend_at(server.url)
        first = run_sync(backend.complete(request()))
        again = run_sync(OpenAIBackend(base_url=server.url, model=MODEL, label="critic").complete(request()))
        other = run_sync(backend.complete(request("Rate another answer.")))
        assert server.requests == 2  # the repeated request was not sent
        assert (first.text, again.text, again.cached) == ("Rating: [[7]]", "Rating: [[7]]", True)
        assert other.status == "ok" and not other.cached
        assert ledger.counts() == {"critic": {"calls": 2, "cache_hits": 1, "failures": 0, "retries": 0}}


def test_the_same_request_asked_at_once_is_sent_once(backend_at):
    with JudgeServer(default=("ok", "Rating: [[6]]")) as server, installed(JudgeLedger()) as ledger:
        answers = run_sync(backend_at(server.url).complete_many([request()] * 4))
        assert server.requests == 1
        assert [answer.text for answer in answers] == ["Rating: [[6]]"] * 4
        assert ledger.counts()["critic"] == {"calls": 1, "cache_hits": 3, "failures": 0, "retries": 0}


def test_a_backend_without_a_label_does_not_use_the_ledger(tmp_path):
    """An agent played by an endpoint samples: its answers are not judgments to read back."""
    with JudgeServer() as server, installed(JudgeLedger(JudgeCache(tmp_path / "cache.sqlite"))) as ledger:
        agent = OpenAIBackend(base_url=server.url, model=MODEL)
        run_sync(agent.complete(request()))
        run_sync(agent.complete(request()))
        run_sync(agent.aclose())
        assert server.requests == 2 and ledger.counts() == {}


def test_a_failure_is_counted_and_never_cached(tmp_path, backend_at):
    with JudgeServer([("status", 400, {}, "bad request")], default=("ok", "Rating: [[3]]")) as server, \
            installed(JudgeLedger(JudgeCache(tmp_path / "cache.sqlite"))) as ledger:
        backend = backend_at(server.url)
        assert run_sync(backend.complete(request())).status == "api_error"
        assert run_sync(backend.complete(request())).status == "ok"  # asked again: the failure was not kept
        assert run_sync(backend.complete(request())).cached
        assert server.requests == 2
        assert ledger.counts()["critic"] == {"calls": 2, "cache_hits": 1, "failures": 1, "retries": 0}
        assert ledger.drain() == []  # a 400 refuses one request: the endpoint itself is fine


def test_an_endpoint_that_fails_and_recovers_is_one_line_each_way(backend_at):
    with JudgeServer(default=("ok", "Rating: [[5]]")) as server, installed(JudgeLedger()) as ledger:
        backend = backend_at(server.url, max_retries=2)
        server.fail(("status", 503, {"Retry-After": "0"}, "overloaded"))
        assert run_sync(backend.complete(request("one"))).status == "api_error"
        assert run_sync(backend.complete(request("two"))).status == "api_error"
        assert ledger.counts()["critic"] == {"calls": 6, "cache_hits": 0, "failures": 2, "retries": 4}
        [failing] = ledger.drain()  # the second failure adds no line
        assert failing.startswith(f"judge endpoint {server.url} is failing: 503: overloaded (after 3 tries)")
        server.fail(None)
        assert run_sync(backend.complete(request("three"))).status == "ok"
        [recovered] = ledger.drain()
        assert recovered.startswith(f"judge endpoint {server.url} recovered after ")
        assert "lost to retries over 2 failed calls" in recovered
        assert ledger.failing() == {}


def test_samples_of_one_prompt_are_separate_entries_only_when_sampled():
    assert request(temperature=0.7, sample=1).key("x") != request(temperature=0.7).key("x")
    assert request(temperature=0.0, sample=1).key("x") == request(temperature=0.0).key("x")  # greedy: one answer
    assert request(temperature=0.7, sample=0).key("x") == request(temperature=0.7).key("x")  # old keys stay valid


def test_a_probe_names_a_dead_endpoint_and_passes_a_live_one(backend_at):
    dead = backend_at(f"http://127.0.0.1:{free_port()}/v1")
    error = run_sync(dead.probe())
    assert error.startswith("connection:") and "\n" not in error
    with JudgeServer() as server:
        assert run_sync(backend_at(server.url).probe()) is None
        assert server.requests == 0  # it listed the models: no chat request, no tokens


def test_a_probe_names_a_model_the_endpoint_does_not_serve(backend_at):
    with JudgeServer(models=("qwen-judge", "llama-judge")) as server:
        error = run_sync(backend_at(server.url).probe())
        assert error == f"404: model {MODEL!r} is not served there (it serves qwen-judge, llama-judge)"
        assert server.requests == 0
    with JudgeServer(models=(MODEL,)) as server:
        assert run_sync(backend_at(server.url).probe()) is None
