"""The HTTP rollout engine against a real `marl serve --enable-lora` on 127.0.0.1 (trainers/engine/http.py).

The server runs marl's own sampler on the same base, so for the same keys the HTTP engine must give the
same tokens as the in-process engine, adapter and all; an adapter is published under a new versioned
name whenever its weights change, and an answer from any other version is refused.
"""

from __future__ import annotations

import math
import threading

import httpx
import pytest
import torch

from marl.scenario.spec import LoraSpec
from marl.types import Task
from trainers.engine.base import EngineError, SamplingSettings, StaleAdapterError
from trainers.engine.http import HttpEngine
from trainers.engine.inprocess import InProcessEngine
from trainers.policy.actors import ModelActor
from trainers.policy.adapters import AdapterBase
from trainers.policy.generation import encode_prompts, full_sequence_logprobs
from trainers.policy.tinylm import load_policy

PROMPTS = ["12+35=", "You are the solver. 47+19=", "SELECT name FROM users;", "7*8="]


@pytest.fixture
def server(real_model_dirs):
    """A live `marl serve --enable-lora` of the random Qwen2 base: (base url, http server)."""
    from trainers.engine.server import make_http_server

    httpd = make_http_server(real_model_dirs["qwen2"], port=0, name="base", enable_lora=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def trained_adapter(real_model_dirs):
    """(AdapterPolicy 'solver', tokenizer): a LoRA adapter on the same base, nudged off zero so it matters."""
    model, tokenizer = load_policy(real_model_dirs["qwen2"])
    policy = AdapterBase(model, real_model_dirs["qwen2"], tokenizer, seed=1).add("solver", LoraSpec(r=4, alpha=8.0))
    _nudge(policy, 0.5)
    return policy, tokenizer


def _nudge(policy, scale: float, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def _settings(tokenizer, greedy=False, max_new_tokens=6) -> SamplingSettings:
    from common.chat import stop_token_ids

    return SamplingSettings(max_new_tokens=max_new_tokens, temperature=1.0, greedy=greedy,
                            stop_ids=tuple(stop_token_ids(None, tokenizer)), pad_id=tokenizer.pad_token_id)


def _both(engine, policy, tokenizer, greedy: bool):
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    keys = [1000 + i for i in range(len(PROMPTS))]
    settings = _settings(tokenizer, greedy)
    return (InProcessEngine().generate("solver", policy, ids, mask, settings, keys),
            engine.generate("solver", policy, ids, mask, settings, keys))


@pytest.mark.parametrize("greedy", [True, False])
def test_the_http_engine_gives_the_in_process_tokens_for_the_same_keys(server, trained_adapter, tmp_path, greedy):
    url, _ = server
    policy, tokenizer = trained_adapter
    engine = HttpEngine(url, tmp_path / "adapters", tag="t")
    local, remote = _both(engine, policy, tokenizer, greedy)
    assert torch.equal(local.completion_mask, remote.completion_mask)
    assert torch.equal(local.completion_ids * local.completion_mask, remote.completion_ids * remote.completion_mask)
    assert torch.equal(local.truncated, remote.truncated)
    known = remote.completion_mask.bool()
    assert torch.allclose(local.logprobs[known], remote.logprobs[known], atol=1e-5)
    assert remote.version.tolist() == [0] * len(PROMPTS)
    # the adapter mattered: the base's logprobs of the same tokens differ from the adapter's
    with policy.owner.peft.disable_adapter():
        plain = full_sequence_logprobs(policy.owner.peft, remote)
    assert not torch.allclose(plain[known], remote.logprobs[known], atol=1e-3)
    engine.close()


def test_a_changed_adapter_is_published_under_a_new_version_and_the_old_one_unloaded(server, trained_adapter, tmp_path):
    url, httpd = server
    policy, tokenizer = trained_adapter
    engine = HttpEngine(url, tmp_path / "adapters", tag="run1")
    ids, mask = encode_prompts(tokenizer, PROMPTS[:2])
    settings = _settings(tokenizer, greedy=True)
    first = engine.generate("solver", policy, ids, mask, settings)
    again = engine.generate("solver", policy, ids, mask, settings)  # unchanged weights: no new version
    assert first.version.tolist() == again.version.tolist() == [0, 0]
    _nudge(policy, 0.5, seed=7)  # what an optimizer step does: the weights change in place
    after = engine.generate("solver", policy, ids, mask, settings)
    assert after.version.tolist() == [1, 1]
    served = [m["id"] for m in httpd.service.models()["data"]]
    assert served == ["base", "solver-run1-v1"]  # v0 unloaded, its directory removed
    assert [p.name for p in (tmp_path / "adapters").iterdir()] == ["solver-run1-v1"]
    # and v1 is what answered: its greedy tokens equal the in-process engine's on the changed weights
    local = InProcessEngine().generate("solver", policy, ids, mask, settings)
    assert torch.equal(local.completion_ids * local.completion_mask, after.completion_ids * after.completion_mask)
    engine.close()
    assert [m["id"] for m in httpd.service.models()["data"]] == ["base"]


def test_a_version_the_server_does_not_hold_is_refused_not_sampled(server, trained_adapter, tmp_path):
    url, _ = server
    policy, tokenizer = trained_adapter
    engine = HttpEngine(url, tmp_path / "adapters", tag="s")
    ids, mask = encode_prompts(tokenizer, PROMPTS[:1])
    engine.generate("solver", policy, ids, mask, _settings(tokenizer, greedy=True))
    # someone unloads the adapter behind the engine's back: the next step must not get other weights
    httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "solver-s-v0"}).raise_for_status()
    with pytest.raises(StaleAdapterError, match="solver-s-v0"):
        engine.generate("solver", policy, ids, mask, _settings(tokenizer, greedy=True))


def test_a_reply_from_another_model_is_refused(trained_adapter, tmp_path):
    """A server that answers for another model than the one asked (a proxy that falls back to the base)."""
    import json

    reply = {"model": "base", "choices": [{"logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-1.0]},
                                           "finish_reason": "length"}]}
    with pytest.raises(StaleAdapterError, match="came from 'base'"):
        _ask_fake_server(json.dumps(reply).encode(), trained_adapter, tmp_path, tag="x")


def test_no_server_is_one_line_saying_how_to_start_one(tmp_path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(EngineError, match="no OpenAI-compatible server answers there.*marl serve MODEL --enable-lora"):
        HttpEngine(f"http://127.0.0.1:{port}/v1", tmp_path, timeout=5)


def test_a_full_weight_policy_is_refused(server, real_model_dirs, tmp_path):
    url, _ = server
    model, tokenizer = load_policy(real_model_dirs["qwen2"])
    engine = HttpEngine(url, tmp_path / "adapters")
    ids, mask = encode_prompts(tokenizer, PROMPTS[:1])
    with pytest.raises(EngineError, match="LoRA adapters only.*full-weight sync"):
        engine.generate("solver", model, ids, mask, _settings(tokenizer))


def test_runtime_adapters_are_off_unless_enabled_and_never_read_a_pickle(real_model_dirs, trained_adapter, tmp_path):
    from trainers.engine.server import make_http_server

    policy, _ = trained_adapter
    policy.save_pretrained(tmp_path / "ok")
    httpd = make_http_server(real_model_dirs["qwen2"], port=0, name="base")  # no enable_lora
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        reply = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path / "ok")})
        assert reply.status_code == 400 and "--enable-lora" in reply.json()["error"]["message"]
    finally:
        httpd.shutdown()
        httpd.server_close()
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text((tmp_path / "ok" / "adapter_config.json").read_text())
    torch.save(policy.state_dict(), pickled / "adapter_model.bin")
    httpd = make_http_server(real_model_dirs["qwen2"], port=0, name="base", enable_lora=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        reply = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "p", "lora_path": str(pickled)})
        assert reply.status_code == 400 and "never a pickle" in reply.json()["error"]["message"]
        ok = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path / "ok")})
        twice = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path / "ok")})
        assert ok.status_code == 200 and twice.status_code == 400 and "already loaded" in twice.text
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_an_adapter_of_another_base_is_refused(server, real_model_dirs, tmp_path):
    url, _ = server
    model, tokenizer = load_policy(real_model_dirs["llama"])
    other = AdapterBase(model, real_model_dirs["llama"], tokenizer).add("x", LoraSpec(r=4))
    other.save_pretrained(tmp_path / "llama-adapter")
    reply = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path / "llama-adapter")})
    assert reply.status_code == 400 and "was trained on base" in reply.json()["error"]["message"]


def test_chat_requests_stay_on_the_base_while_adapters_are_loaded(server, trained_adapter, tmp_path):
    """Loading an adapter changes nothing for a chat client of the base model (the judge endpoint)."""
    url, _ = server
    ask = {"model": "base", "messages": [{"role": "user", "content": "12+35="}], "max_tokens": 5, "temperature": 0,
           "logprobs": True, "top_logprobs": 2}
    before = httpx.post(f"{url}/chat/completions", json=ask).json()
    policy, tokenizer = trained_adapter
    engine = HttpEngine(url, tmp_path / "adapters")
    ids, mask = encode_prompts(tokenizer, PROMPTS[:1])
    engine.generate("solver", policy, ids, mask, _settings(tokenizer, greedy=True))
    after = httpx.post(f"{url}/chat/completions", json=ask).json()
    assert after["choices"][0]["message"] == before["choices"][0]["message"]
    assert [t["logprob"] for t in after["choices"][0]["logprobs"]["content"]] == pytest.approx(
        [t["logprob"] for t in before["choices"][0]["logprobs"]["content"]], abs=1e-6)


def test_concurrent_completion_requests_share_forwards_and_keep_their_tokens(server, trained_adapter, tmp_path):
    """Keyed rows do not depend on their batch: the engine's concurrent requests, batched by the server,
    give each row the tokens it gets alone."""
    url, httpd = server
    policy, tokenizer = trained_adapter
    engine = HttpEngine(url, tmp_path / "adapters")
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    settings = _settings(tokenizer)
    together = engine.generate("solver", policy, ids, mask, settings, keys=[5, 6, 7, 8])
    for row in range(len(PROMPTS)):
        alone = engine.generate("solver", policy, ids[row:row + 1], mask[row:row + 1], settings, keys=[5 + row])
        width = int(alone.completion_mask.sum())
        assert together.completion_ids[row, :width].tolist() == alone.completion_ids[0, :width].tolist()
    assert not math.isnan(float(together.logprobs[together.completion_mask.bool()].sum()))


def test_a_model_actor_generates_through_its_engine(server, trained_adapter, tmp_path):
    url, _ = server
    policy, tokenizer = trained_adapter
    local = ModelActor("solver", policy, tokenizer)
    remote = ModelActor("solver", policy, tokenizer, engine=HttpEngine(url, tmp_path / "adapters"))
    requests = [("solver", p, Task(id=f"t{i}", prompt=p)) for i, p in enumerate(PROMPTS)]
    a = local.act(requests, max_new_tokens=6, keys=[11, 12, 13, 14])
    b = remote.act(requests, max_new_tokens=6, keys=[11, 12, 13, 14])
    assert a.texts == b.texts and b.completions.version is not None


def test_a_failed_first_adapter_load_leaves_the_base_served(server, real_model_dirs, tmp_path):
    """An adapter of another base is refused; the chat endpoint (the judge's) keeps answering afterwards."""
    url, _ = server
    model, tokenizer = load_policy(real_model_dirs["llama"])
    AdapterBase(model, real_model_dirs["llama"], tokenizer).add("x", LoraSpec(r=4)).save_pretrained(tmp_path / "other")
    refused = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path / "other")})
    assert refused.status_code == 400
    chat = httpx.post(f"{url}/chat/completions", json={"model": "base", "max_tokens": 2, "temperature": 0,
                                                       "messages": [{"role": "user", "content": "1+1="}]})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["role"] == "assistant"


def test_the_server_refuses_oversized_bodies_and_prompts_past_the_context(server):
    import socket

    url, httpd = server
    too_long = [5] * int(httpd.local_model.model.config.max_position_embeddings)
    reply = httpx.post(f"{url}/completions", json={"model": "base", "prompt": too_long, "max_tokens": 4})
    assert reply.status_code == 400 and "context" in reply.json()["error"]["message"]
    port = httpd.server_address[1]
    for length, status in (("-1", 400), (str(64 * 2 ** 20), 413)):  # nothing of the body is read
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
            assert connection.recv(200).split(b" ")[1] == str(status).encode()


def _fake_server(answer: bytes):
    """A server answering every completion with `answer` (raw bytes): (url, server)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Fake(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _reply(self, data: bytes):
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._reply(b'{"data": [{"id": "base"}]}')

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self._reply(answer if self.path.endswith("/completions") else b"ok")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_address[1]}/v1", httpd


def _ask_fake_server(answer: bytes, trained_adapter, tmp_path, *, tag: str, greedy: bool = True):
    """One HttpEngine.generate of the first prompt against a server that answers `answer`."""
    url, httpd = _fake_server(answer)
    try:
        policy, tokenizer = trained_adapter
        engine = HttpEngine(url, tmp_path / "a", tag=tag)
        ids, mask = encode_prompts(tokenizer, PROMPTS[:1])
        return engine.generate("solver", policy, ids, mask, _settings(tokenizer, greedy=greedy))
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("answer", [b"not json", b'{"model": "solver-f-v0"}', b'{"model": "solver-f-v0", "choices": []}'])
def test_a_reply_marl_cannot_read_is_one_engine_error(trained_adapter, tmp_path, answer):
    with pytest.raises(EngineError, match="a reply marl cannot read"):
        _ask_fake_server(answer, trained_adapter, tmp_path, tag="f")


def test_floored_or_missing_logprobs_are_unknown_never_infinite(trained_adapter, tmp_path):
    """vLLM and OpenAI send -9999 for a probability they rounded to 0: that is no ratio to weigh a token by."""
    import json

    reply = {"model": "solver-f-v0", "choices": [{"finish_reason": "length", "logprobs": {
        "tokens": ["token_id:5", "token_id:6", "token_id:7"], "token_logprobs": [-0.5, -9999.0, None]}}]}
    out = _ask_fake_server(json.dumps(reply).encode(), trained_adapter, tmp_path, tag="f", greedy=False)
    assert out.completion_ids[0].tolist() == [5, 6, 7]
    assert out.logprobs[0, 0].item() == -0.5 and torch.isnan(out.logprobs[0, 1:]).all()
