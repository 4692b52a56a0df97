"""Prompts as chat (issue 12, item 2): every turn a model sees is rendered by one function.

On the real-architecture fixtures (random Qwen2 / Llama / GPT-2, BPE tokenizer, ChatML template, an
eos list): RL acting and the SFT warm-up carry the template (role = system, observation = user),
`chat_template: none` gives plain text, and generation stops at every listed end token, which the
text never contains. The embedded character model has no template: its prompts are the raw observation.
"""

from types import SimpleNamespace

import pytest

from helpers.real_models import ARCHITECTURES

OBSERVATION = "Task: 12+35="
ROLE = "You are the solver."
CHATML = f"<|im_start|>system\n{ROLE}<|im_end|>\n<|im_start|>user\n{OBSERVATION}<|im_end|>\n<|im_start|>assistant\n"


def _load(directory):
    from trainers.policy.tinylm import load_policy

    return load_policy(directory)


def _scenario(*overrides):
    from marl.scenario.load import load_scenario

    return load_scenario("relay", [f"agents.0.role={ROLE}", *overrides])


def _prompt_texts(tokenizer, completions) -> list[str]:
    """The prompts the model was given, decoded back (special tokens kept)."""
    return [tokenizer.decode([t for t, m in zip(ids, mask) if m])
            for ids, mask in zip(completions.prompt_ids.tolist(), completions.prompt_mask.tolist())]


class ForcedTokens:
    """A forward hook on the LM head that makes the model emit `tokens` in order, one per forward (the
    prefill, then one step each): a test pins what the model says and where it stops."""

    def __init__(self, model, tokens):
        self.tokens, self.calls = list(tokens), 0
        self.handle = model.get_output_embeddings().register_forward_hook(self)

    def __call__(self, module, inputs, output):
        token = self.tokens[min(self.calls, len(self.tokens) - 1)]
        self.calls += 1
        output = output.clone()
        output[..., token] += 1e4
        return output


def test_a_tokenizer_without_a_template_gets_the_raw_observation(micro_policy):
    from trainers.policy.prompts import TurnStyle, turn_prompt

    _, tokenizer = micro_policy()
    assert not getattr(tokenizer, "chat_template", None)
    assert turn_prompt(tokenizer, "12+35=", TurnStyle(ROLE, "auto")) == "12+35="
    assert turn_prompt(tokenizer, "", TurnStyle(ROLE)) == " "  # an empty observation is one space


def test_the_embedded_default_model_has_a_chatml_template_and_renders_relays_turns_with_it(demo_model_dir):
    from transformers import AutoTokenizer

    from trainers.policy.prompts import TurnStyle, turn_prompt

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)  # plain transformers reads the template
    assert "<|im_start|>" in tokenizer.chat_template
    assert turn_prompt(tokenizer, "12+35=") == "<|im_start|>user\n12+35=<|im_end|>\n<|im_start|>assistant\n"
    assert turn_prompt(tokenizer, "12+35=", TurnStyle(ROLE)).startswith(f"<|im_start|>system\n{ROLE}<|im_end|>")
    assert turn_prompt(tokenizer, "12+35=", TurnStyle(ROLE, "none")) == "12+35="


def test_the_char_model_acts_on_the_raw_observation_and_stops_at_its_eos(micro_policy):
    import torch

    from trainers.policy.actors import ModelActor
    from trainers.policy.generation import encode_prompts
    from trainers.policy.prompts import TurnStyle, stop_token_ids

    model, tokenizer = micro_policy()
    assert stop_token_ids(model, tokenizer) == [tokenizer.eos_token_id]
    actor = ModelActor("shared", model, tokenizer, styles={"a": TurnStyle(ROLE)})
    generation = actor.act([("a", "12+35=", None), ("b", "", None)], max_new_tokens=4)
    ids, mask = encode_prompts(tokenizer, ["12+35=", " "])  # exactly what it was given before prompts.py
    assert torch.equal(generation.completions.prompt_ids, ids) and torch.equal(generation.completions.prompt_mask, mask)


def test_agent_styles_take_the_agents_mode_else_the_scenarios():
    from trainers.policy.prompts import TurnStyle, agent_styles

    spec = _scenario("chat_template=none", "agents.1.chat_template=auto").spec
    assert agent_styles(spec) == {"left": TurnStyle(ROLE, "none"), "right": TurnStyle("", "auto"),
                                  "final": TurnStyle("", "none")}
    assert agent_styles(_scenario().spec)["left"] == TurnStyle(ROLE, "auto")  # the default is auto


def test_turn_prompts_carry_the_template_skip_an_empty_role_and_obey_none(real_model_dirs):
    from transformers import AutoTokenizer

    from common.chat import render_chat
    from trainers.policy.prompts import TurnStyle, turn_messages, turn_prompt

    tokenizer = AutoTokenizer.from_pretrained(real_model_dirs["qwen2"])
    assert turn_prompt(tokenizer, OBSERVATION, TurnStyle(ROLE)) == CHATML
    assert turn_prompt(tokenizer, OBSERVATION, TurnStyle("  ")) == \
        f"<|im_start|>user\n{OBSERVATION}<|im_end|>\n<|im_start|>assistant\n"
    assert turn_prompt(tokenizer, OBSERVATION, TurnStyle(ROLE, "none")) == OBSERVATION
    # what `marl serve` renders for the same messages is the same text
    assert render_chat(tokenizer, turn_messages(OBSERVATION, TurnStyle(ROLE))) == CHATML


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_rl_acting_renders_each_agents_turn_with_the_template(real_model_dirs, architecture):
    from trainers.policy.actors import build_actors

    scenario = _scenario("agents.2.chat_template=none")
    actors, seats = build_actors(scenario, real_model_dirs[architecture])
    actor = actors[seats["left"]]
    generation = actor.act([("left", OBSERVATION, None), ("right", OBSERVATION, None), ("final", OBSERVATION, None)],
                           max_new_tokens=3, greedy=True)
    assert _prompt_texts(actor.tokenizer, generation.completions) == [
        CHATML, f"<|im_start|>user\n{OBSERVATION}<|im_end|>\n<|im_start|>assistant\n", OBSERVATION]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("end", ["<|im_end|>", "<|endoftext|>"])
def test_generation_stops_at_every_listed_eos_and_the_text_drops_it(real_model_dirs, architecture, end):
    from trainers.policy.actors import ModelActor
    from trainers.policy.prompts import stop_token_ids

    model, tokenizer = _load(real_model_dirs[architecture])
    ends = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    assert stop_token_ids(model, tokenizer) == ends
    said = tokenizer("ANSWER: 47", add_special_tokens=False)["input_ids"]
    ForcedTokens(model, said + [tokenizer.convert_tokens_to_ids(end)])
    generation = ModelActor("shared", model, tokenizer).act([("a", OBSERVATION, None)], max_new_tokens=12, greedy=True)
    completions = generation.completions
    assert generation.texts == ["ANSWER: 47"]
    assert int(completions.completion_mask.sum()) == len(said) + 1 and not bool(completions.truncated[0])


def test_a_stop_id_that_is_not_a_special_token_is_cut_from_the_text(real_model_dirs):
    from trainers.policy.actors import ModelActor

    model, tokenizer = _load(real_model_dirs["llama"])
    said = tokenizer("ANSWER: 47", add_special_tokens=False)["input_ids"]
    stop = tokenizer(" sunny", add_special_tokens=False)["input_ids"][0]
    model.generation_config.eos_token_id = [stop]
    ForcedTokens(model, said + [stop, said[0]])
    generation = ModelActor("shared", model, tokenizer).act([("a", OBSERVATION, None)], max_new_tokens=12, greedy=True)
    assert generation.texts == ["ANSWER: 47"]


def test_sampling_accepts_one_eos_id_or_several(micro_policy):
    import torch

    from trainers.policy.generation import encode_prompts, sample_completions

    model, tokenizer = micro_policy()
    ids, mask = encode_prompts(tokenizer, ["1+2="])
    runs = [sample_completions(model, ids, mask, group_size=3, max_new_tokens=6, eos_token_id=eos,
                               pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0))
            for eos in (tokenizer.eos_token_id, [tokenizer.eos_token_id], (tokenizer.eos_token_id,))]
    assert all(torch.equal(runs[0].completion_ids, r.completion_ids) for r in runs[1:])
    first = int(runs[0].completion_ids[0, 0])
    stopped = sample_completions(model, ids, mask, max_new_tokens=6, eos_token_id=[tokenizer.eos_token_id, first],
                                 pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0))
    assert stopped.completion_mask[0].tolist() == [1] + [0] * (stopped.completion_ids.size(1) - 1)
    assert not bool(stopped.truncated[0])


def test_sft_demonstrations_are_rendered_as_acting_renders_them_and_end_with_the_end_of_turn(real_model_dirs,
                                                                                          monkeypatch):
    import trainers.policy.tinylm as tinylm
    import trainers.stages.warmup as warmup
    from trainers.policy.actors import build_actors

    scenario = _scenario("agents.1.chat_template=none", "train.warmup.accuracy_target=0")  # the format decides
    actors, _ = build_actors(scenario, real_model_dirs["qwen2"])
    seen = {}
    monkeypatch.setattr(warmup, "learner_compliance", lambda player, tasks, agents_of, seed=0:
                        (0.0, {name: 0.0 for name in agents_of}))
    monkeypatch.setattr(tinylm, "sft_warmup", lambda model, tokenizer, demonstrations, *a, **k:
                        seen.setdefault("demonstrations", demonstrations) and {"steps": 1})
    config = SimpleNamespace(model=scenario.spec.train.model)  # what the stage reads of the run's TrainConfig
    trainer = type("Trainer", (), {"learners": ["shared"], "actors": actors, "player": None, "config": config})()
    train_tasks, _ = scenario.split()
    warmup.sft_warmup_stage(trainer, scenario, train_tasks[:4], scenario.spec.train.warmup, log=lambda line: None)
    turns = warmup.expert_turns(scenario, train_tasks[:4])
    tokenizer, im_end = actors["shared"].tokenizer, actors["shared"].tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = {"left": lambda o: f"<|im_start|>system\n{ROLE}<|im_end|>\n<|im_start|>user\n{o}<|im_end|>\n"
                                  "<|im_start|>assistant\n",
                "right": lambda o: o, "final": lambda o: f"<|im_start|>user\n{o}<|im_end|>\n<|im_start|>assistant\n"}
    assert seen["demonstrations"] == [
        (expected[agent](observation), message, im_end if agent != "right" else tokenizer.eos_token_id)
        for agent, observation, message in turns]
    ids, _, labels = tinylm._sft_batch(tokenizer, seen["demonstrations"][:1])
    answer = [t for t in labels[0].tolist() if t != -100]
    assert answer == tokenizer(turns[0][2], add_special_tokens=False)["input_ids"] + [im_end]


def test_the_char_models_sft_batch_is_unchanged(micro_policy):
    import torch

    from trainers.policy.prompts import demonstration
    from trainers.policy.tinylm import _sft_batch

    _, tokenizer = micro_policy()
    pair = ("12+35=", "47")
    assert demonstration(tokenizer, *pair) == (*pair, tokenizer.eos_token_id)
    assert all(torch.equal(a, b) for a, b in zip(_sft_batch(tokenizer, [pair]),
                                                 _sft_batch(tokenizer, [demonstration(tokenizer, *pair)])))


def test_an_endpoint_agent_gets_its_role_as_the_system_message():
    from judges.model.backend import ChatResponse
    from trainers.policy.actors import EndpointActor
    from trainers.policy.prompts import TurnStyle

    class Backend:
        requests = []

        async def complete_many(self, chats):
            self.requests.extend(chats)
            return [ChatResponse("ok", text="47") for _ in chats]

    actor = EndpointActor("solver", Backend(), styles={"solver": TurnStyle(ROLE)})
    assert actor.act([("solver", OBSERVATION, None), ("other", OBSERVATION, None)], max_new_tokens=4).texts == ["47"] * 2
    assert [list(r.messages) for r in Backend.requests] == [
        [{"role": "system", "content": ROLE}, {"role": "user", "content": OBSERVATION}],
        [{"role": "user", "content": OBSERVATION}]]


def test_a_messages_probability_is_what_the_sampler_gives_its_tokens(demo_model_dir):
    """ModelActor.message_probabilities (a game's mixed strategy) is the sampler's own arithmetic: for a
    message the actor sampled, it lies between the product of the sampled tokens' probabilities with
    the stop token it drew (the model may stop at another stop id too) and without it; at max_new_tokens
    no stop is needed, and a longer message cannot be said."""
    import torch

    from marl.scenario.load import load_scenario
    from trainers.policy.actors import build_actors

    scenario = load_scenario("relay")
    actor = build_actors(scenario, demo_model_dir, seed=3)[0]["shared"]
    task = scenario.split()[1][0]
    request = ("left", task.metadata["left"], task)
    generation = actor.act([request] * 12, max_new_tokens=4)
    rows, checked = generation.completions, 0
    for text, logprobs, mask, cut in zip(generation.texts, rows.logprobs, rows.completion_mask, rows.truncated):
        if cut:
            continue
        kept = logprobs[mask.bool()]
        with_stop, without_stop = float(torch.exp(kept.sum())), float(torch.exp(kept[:-1].sum()))
        (probability,) = actor.message_probabilities(*request, [text])
        assert with_stop * (1 - 1e-4) <= probability <= without_stop * (1 + 1e-4)
        tokens = len(actor.tokenizer(text, add_special_tokens=False)["input_ids"])
        assert actor.message_probabilities(*request, [text], max_new_tokens=tokens) == \
            [pytest.approx(without_stop, rel=1e-4)]
        assert actor.message_probabilities(*request, [text], max_new_tokens=tokens - 1) == [0.0]
        checked += 1
    assert checked >= 6
    texts = sorted(set(generation.texts))
    probabilities = actor.message_probabilities(*request, texts)
    assert all(0 < p <= 1 for p in probabilities) and sum(probabilities) <= 1 + 1e-6
