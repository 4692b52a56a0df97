"""`marl serve` and the local backend as logprobs judges: the verdict read over HTTP equals the model's own
softmax summed over the label tokens, logit_bias is honoured, and concurrent requests share forwards."""

import threading
import time

import pytest

ITEM_PROMPT, ANSWER_A, ANSWER_B = "What is 12+35?", "47", "It is 48."


@pytest.fixture(scope="module")
def server(real_model_dirs):
    """A real OpenAI-compatible server on 127.0.0.1 over the tiny Qwen2 model (the `marl serve` library)."""
    from trainers.engine.server import make_http_server

    httpd = make_http_server(real_model_dirs["qwen2"], port=0, name="tiny")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _label_ids(tokenizer, label):
    """Every token id whose text spells `label` (as the verdict counts them: surrounding spaces stripped)."""
    return [i for i in range(len(tokenizer)) if tokenizer.decode([i]).strip() == label]


def _softmax(model, messages):
    """The model's own next-token distribution after the rendered prompt (float64)."""
    import torch

    from common.chat import render_chat

    ids = model.tokenizer(render_chat(model.tokenizer, list(messages)), add_special_tokens=False,
                          return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return torch.softmax(model.model(input_ids=ids).logits[0, -1].double(), dim=-1)


def _count_forwards(model):
    """(calls, hook handle): every forward of the served model appends to calls."""
    calls = []
    return calls, model.model.register_forward_hook(lambda module, inputs, output: calls.append(1))


def test_the_verdict_read_through_marl_serve_equals_the_models_softmax_over_the_label_tokens(server):
    import torch

    from judges.model.prompted import PairwiseJudge
    from judges.model.openai_backend import OpenAIBackend
    from judges.types import Candidate, Item

    httpd, url = server
    model = httpd.local_model
    a_ids, b_ids = _label_ids(model.tokenizer, "A"), _label_ids(model.tokenizer, "B")
    lean = torch.zeros(model.model.config.vocab_size)  # the untrained model leans toward the labels, unevenly
    lean[a_ids[0]], lean[a_ids[-1]], lean[b_ids[0]], lean[b_ids[-1]] = 6.0, 4.5, 5.5, 4.0
    handle = model.model.get_output_embeddings().register_forward_hook(lambda module, inputs, output: output + lean)
    try:
        judge = PairwiseJudge(OpenAIBackend(model="tiny", base_url=url, max_retries=0), verdict="logprobs",
                              orders="fixed")
        judgment = judge.score(Item(prompt=ITEM_PROMPT), [Candidate(ANSWER_A), Candidate(ANSWER_B)])[0]
        probabilities = _softmax(model, judge.verdict.pairwise_messages(ITEM_PROMPT, ANSWER_A, ANSWER_B, judge.rubric))
    finally:
        handle.remove()
    p_a, p_b = probabilities[a_ids].sum().item(), probabilities[b_ids].sum().item()
    assert judgment.ok and judgment.score == pytest.approx(p_a / (p_a + p_b), abs=1e-4)
    assert judgment.details["label_mass_per_order"][0] == pytest.approx(p_a + p_b, abs=1e-4)


def test_logit_bias_is_honoured_and_the_logprobs_are_those_drawn_from(server):
    import math

    import openai
    import torch

    httpd, url = server
    model = httpd.local_model
    client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Reply A or B."}]
    token = _label_ids(model.tokenizer, "B")[0]
    answer = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, temperature=0,
                                            logprobs=True, top_logprobs=20, logit_bias={str(token): 30})
    first = answer.choices[0].logprobs.content[0]
    assert answer.choices[0].finish_reason == "length" and len(first.top_logprobs) == 20
    expected = _softmax(model, messages).log()
    expected = torch.log_softmax(expected + 30.0 * (torch.arange(expected.numel()) == token), dim=-1)
    assert first.token == model.tokenizer.decode([token])  # the boost wins the greedy pick
    assert first.logprob == pytest.approx(expected[token].item(), abs=1e-4)
    assert math.exp(first.top_logprobs[1].logprob) == pytest.approx(expected.sort(descending=True).values[1].exp().item(),
                                                                    abs=1e-4)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, logit_bias={"999999": 1})
    assert refused.value.body["message"].startswith("logit_bias: '999999' is not a token id of this model")


def test_concurrent_requests_arriving_while_the_model_is_busy_share_one_forward(server):
    import openai

    httpd, url = server
    model = httpd.local_model
    prompts = ["1+1=", "What is 12+35? Reply with the number.", "Name a colour.", "2*3=", "Say A or B.", "Hello"]
    ask = dict(model="tiny", max_tokens=1, temperature=0, logprobs=True, top_logprobs=5)
    client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=120)
    alone = [client.chat.completions.create(messages=[{"role": "user", "content": p}], **ask) for p in prompts]
    answers = [None] * len(prompts)

    def request(index):
        answers[index] = client.chat.completions.create(messages=[{"role": "user", "content": prompts[index]}], **ask)

    calls, handle = _count_forwards(model)
    try:
        with model.lock:  # the model is busy: every request that arrives now waits in the queue
            threads = [threading.Thread(target=request, args=(i,)) for i in range(len(prompts))]
            for thread in threads:
                thread.start()
            waited = 0
            while model.queued() < len(prompts) and waited < 6000:  # until all wait (a guard, not a measure)
                time.sleep(0.01)
                waited += 1
            assert model.queued() == len(prompts)
        for thread in threads:
            thread.join()
    finally:
        handle.remove()
    assert len(calls) == 1  # one left-padded batch, one token: one forward for six requests
    for batched, single in zip(answers, alone):  # and each row answers as it does alone
        row, solo = batched.choices[0].logprobs.content[0], single.choices[0].logprobs.content[0]
        assert row.token == solo.token and [t.token for t in row.top_logprobs] == [t.token for t in solo.top_logprobs]
        assert [t.logprob for t in row.top_logprobs] == pytest.approx([t.logprob for t in solo.top_logprobs], abs=1e-4)


def test_a_local_judge_batches_its_requests_and_fails_when_the_labels_hold_under_half(real_model_dirs):
    from judges.model.prompted import PairwiseJudge
    from judges.model.local_backend import LocalBackend
    from judges.types import Candidate, Item

    backend = LocalBackend(real_model_dirs["qwen2"])
    judge = PairwiseJudge(backend, verdict="logprobs")  # both orders: two requests in one gather
    assert set(judge.verdict.boosted) == {"A", " A", "B", " B"}  # checked with the tokenizer, boosted into the top 20
    calls, handle = _count_forwards(backend.model)
    try:
        judgments = judge.score(Item(prompt=ITEM_PROMPT), [Candidate(ANSWER_A), Candidate(ANSWER_B)])
    finally:
        handle.remove()
    assert len(calls) == 1
    # an untrained 400-token model puts ~1% on A and B: a failed judgment, with the un-boosted label mass
    assert all(j.status == "parse_error" and j.score is None for j in judgments)
    messages = judge.verdict.pairwise_messages(ITEM_PROMPT, ANSWER_A, ANSWER_B, judge.rubric)
    probabilities = _softmax(backend.model, messages)
    tokenizer = backend.tokenizer
    p_a = probabilities[_label_ids(tokenizer, "A")].sum().item()
    p_b = probabilities[_label_ids(tokenizer, "B")].sum().item()
    assert judgments[0].details["label_probabilities"] == pytest.approx({"A": p_a, "B": p_b}, abs=1e-6)
    assert judgments[0].details["label_mass"] == pytest.approx(p_a + p_b, abs=1e-6) and p_a + p_b < 0.5


def test_a_local_judge_whose_tokenizer_splits_a_label_is_refused_before_any_call(real_model_dirs):
    from judges.model.prompted import PointwiseJudge
    from judges.model.local_backend import LocalBackend
    from judges.model.verdict import LabelError

    backend = LocalBackend(real_model_dirs["qwen2"])
    calls, handle = _count_forwards(backend.model)
    try:
        with pytest.raises(LabelError, match=r"^verdict label 'Yes' is 2 tokens for .*\('Y' \+ 'es'\)"):
            PointwiseJudge(backend, verdict="logprobs")
    finally:
        handle.remove()
    assert calls == []
