"""A judge endpoint's words are shown as text (issue 31, item 6): a real OpenAI-compatible server on
127.0.0.1 answers with ANSI escape sequences (clear the screen, red, a window title) and 100 KB on one
"line"; what reaches a response's error, the terminal of `marl judges report` and of `marl rollout`, and
the ledger's health line has no ESC byte and is bounded."""

from __future__ import annotations

import shutil

import pytest

from helpers.inprocess import marl_in_process
from helpers.judge_items import write_items
from helpers.judge_server import JudgeServer, write_judged_relay
from helpers.paths import SCENARIOS
from judges.model.backend import ChatRequest
from judges.model.ledger import JudgeLedger
from judges.model.openai_backend import OpenAIBackend, run_sync
from judges.model.openai_wire import ERROR_CHARS

HOSTILE = "\x1b[2J\x1b[H\x1b[31m\x1b]0;pwned\x07boom\r\n" + "A" * 100_000 + "\x1b[0m\n"
REQUEST = ChatRequest(messages=({"role": "user", "content": "Which answer is better?"},))


@pytest.fixture
def backend():
    """A factory of OpenAIBackends (real openai clients, no retries), closed after the test."""
    made: list[OpenAIBackend] = []

    def make(url: str) -> OpenAIBackend:
        made.append(OpenAIBackend(base_url=url, model="judge", max_retries=0))
        return made[-1]

    yield make
    for one in made:
        run_sync(one.aclose())


def _plain(text: str, limit: int) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "\n" not in text
    assert len(text) <= limit


@pytest.mark.parametrize("behaviour, start", [
    (("status", 400, {}, HOSTILE), "400: boom | AAAA"),  # an OpenAI-style JSON error body
    (("raw", 400, HOSTILE.encode()), "400: "),  # a body that is not JSON at all
    (("refusal", HOSTILE), "refusal: boom | AAAA"),  # the model's own refusal text
])
def test_an_endpoint_error_is_one_bounded_line_of_plain_text(backend, behaviour, start):
    with JudgeServer(default=behaviour) as server:
        response = run_sync(backend(server.url).complete(REQUEST))
    assert response.status in ("api_error", "refusal") and response.error.startswith(start)
    _plain(response.error, ERROR_CHARS)


def test_a_probe_answered_with_escapes_is_one_bounded_line(backend):
    with JudgeServer() as server:
        server.models_failure = ("raw", 401, HOSTILE.encode())
        error = run_sync(backend(server.url).probe())
    assert error.startswith("401: ")
    _plain(error, ERROR_CHARS)


def test_the_ledger_health_line_is_plain_text_whatever_the_backend_says():
    from judges.model.backend import ChatResponse

    lines = []
    ledger = JudgeLedger(log=lines.append)
    response = ChatResponse("api_error", error="503: " + HOSTILE, attempts=1)
    run_sync(ledger.record(REQUEST, "openai:judge@http://127.0.0.1:9/v1", "critic", response))
    [line] = lines
    assert line.startswith("judge endpoint http://127.0.0.1:9/v1 is failing: 503: boom | AAAA")
    _plain(line, 600)


def test_marl_judges_report_prints_the_endpoint_error_as_one_plain_line(tmp_path):
    items = write_items(tmp_path / "items.jsonl", 4)
    with JudgeServer(default=("status", 400, {}, HOSTILE)) as server:
        result = marl_in_process("judges", "report", "--base-url", server.url, "--model", "judge", "--items",
                                 str(items), "--out", str(tmp_path / "r.json"), "--retries", "0",
                                 "--cache", str(tmp_path / "cache.sqlite"))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("marl: error: cannot judge with model") and "400: boom | AAAA" in line
    _plain(line, 1000)


def test_marl_rollout_prints_judge_failures_as_plain_bounded_text(tmp_path):
    """401 is an endpoint failure: the ledger's health line and the episode's rationale both show it."""
    shutil.copy(SCENARIOS / "relay_lib.py", tmp_path / "relay_lib.py")
    with JudgeServer(default=("status", 401, {}, HOSTILE)) as server:
        path = write_judged_relay(SCENARIOS, server.url, tmp_path)
        result = marl_in_process("rollout", str(path), "--episodes", "1", "--policy", "expert",
                                 "--judge-cache", "off", env={"NO_SUCH_KEY": "x"})
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "\x1b" not in output and max(len(line) for line in output.splitlines()) < 1000
    assert any("critic" in line and "failed  401: boom | AAAA" in line for line in result.stdout.splitlines())
    assert any(line.startswith("judge endpoint") and "is failing: 401: boom | AAAA" in line
               for line in result.stderr.splitlines())
