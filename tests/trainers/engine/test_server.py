"""`marl serve`: a local model behind a real OpenAI-compatible HTTP server, called with the openai client."""

import math
import threading

import pytest


@pytest.fixture
def served(micro_policy, tmp_path):
    from trainers.engine.server import make_http_server

    model, tokenizer = micro_policy(seed=3)
    model.save_pretrained(tmp_path / "micro")
    tokenizer.save_pretrained(tmp_path / "micro")
    httpd = make_http_server(tmp_path / "micro", port=0, name="micro")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_models_and_greedy_chat_completion_with_logprobs(served):
    from openai import OpenAI

    client = OpenAI(base_url=served, api_key="EMPTY", max_retries=0, timeout=30)
    assert [m.id for m in client.models.list().data] == ["micro"]
    ask = dict(model="micro", messages=[{"role": "user", "content": "12+35="}], max_tokens=5, temperature=0,
               logprobs=True, top_logprobs=3)
    first, again = client.chat.completions.create(**ask), client.chat.completions.create(**ask)
    assert first.choices[0].message.content == again.choices[0].message.content  # greedy is deterministic
    content = first.choices[0].logprobs.content
    assert 1 <= len(content) <= 5 and first.usage.prompt_tokens == 6
    for token in content:
        alternatives = [t.logprob for t in token.top_logprobs]
        assert len(alternatives) == 3 and alternatives == sorted(alternatives, reverse=True)
        assert token.logprob == pytest.approx(alternatives[0])  # greedy takes the most likely token
        assert sum(math.exp(v) for v in alternatives) <= 1 + 1e-6


def test_unknown_model_and_bad_request_are_openai_errors(served):
    import openai

    client = openai.OpenAI(base_url=served, api_key="EMPTY", max_retries=0, timeout=30)
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "1="}])
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="micro", messages=[])


def test_sampling_with_a_seed_is_reproducible(served):
    from openai import OpenAI

    client = OpenAI(base_url=served, api_key="EMPTY", max_retries=0, timeout=30)
    ask = dict(model="micro", messages=[{"role": "user", "content": "3+4="}], max_tokens=6, temperature=1.0, seed=11)
    texts = {client.chat.completions.create(**ask).choices[0].message.content for _ in range(3)}
    assert len(texts) == 1


def test_a_local_model_is_a_judge_backend_whose_unparseable_verdicts_are_never_scores(micro_policy, tmp_path):
    from judges.model.local_backend import LocalBackend
    from judges.model.prompted import PointwiseJudge
    from judges.types import Candidate, Item

    model, tokenizer = micro_policy(seed=3)
    model.save_pretrained(tmp_path / "micro")
    tokenizer.save_pretrained(tmp_path / "micro")
    backend = LocalBackend(tmp_path / "micro")
    judge = PointwiseJudge(backend, max_tokens=6)
    judgments = judge.score(Item(prompt="1+1="), [Candidate("2"), Candidate("3")])
    # an untrained micro model rambles to max_tokens (truncated) or stops early without "[[N]]" (parse_error)
    assert all(j.status in ("truncated", "parse_error") for j in judgments)
    assert all(j.score is None for j in judgments)
    assert backend.identity.startswith("local:micro@")


@pytest.mark.parametrize("options, message", [
    ({"max_tokens": 10 ** 9}, "max_tokens must be at most 4096, got 1000000000: the cap on new tokens of this "
                              "server (marl serve --max-new-tokens)"),
    ({"temperature": -1}, "temperature must be a number in [0, 2], got -1"),
    ({"top_p": 0}, "top_p must be a number in [1e-06, 1], got 0"),
    ({"logprobs": True, "top_logprobs": 500}, "top_logprobs must be a number in [0, 20], got 500"),
    ({"seed": 2 ** 70}, f"seed must be a number in [{-2 ** 63}, {2 ** 63 - 1}], got {2 ** 70}"),
])
def test_out_of_range_sampling_is_a_400_before_any_generation(served, options, message):
    import openai

    client = openai.OpenAI(base_url=served, api_key="EMPTY", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="micro", messages=[{"role": "user", "content": "1="}], **options)
    assert refused.value.body["message"] == message
    answer = client.chat.completions.create(model="micro", messages=[{"role": "user", "content": "1="}], max_tokens=2)
    assert answer.choices[0].finish_reason in ("stop", "length")  # the server still serves


def test_a_broken_model_directory_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{")
    result = subprocess.run([sys.executable, "-m", "trainers.cli.main", "serve", str(tmp_path / "broken"), "--port", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    # what it names first (the missing weights, the broken config.json) is the loader's business
    assert result.stderr.startswith(f"marl: error: {tmp_path / 'broken'}: cannot load the model (")
    assert len(result.stderr.strip().splitlines()) == 1
