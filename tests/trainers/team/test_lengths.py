"""Lengths in tokens (issue 12, item 6) on the real-architecture fixtures and the relay / debate scenarios.

- a too-long observation keeps its head (the role and the task) and its tail (the latest message) and
  drops the middle of the history, marked with CUT_MARK; one that fits is exactly the template's text;
- a prompt over its token limit is fitted the same way (and one within it is untouched);
- the context check is one line and exit 2 before anything is made (the base's and the tiny model's);
- completion tokens past action_max_chars are masked out of training;
- the guards: length/* metrics and one warning each; a tool-using agent that never calls a tool.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import marl
from marl.env import CUT_MARK, keep_ends
from marl.scenario.load import load_scenario
from trainers.policy.prompts import (TurnStyle, agent_styles, context_problem, directory_context, fit_turn_prompts,
                                     heard_tokens, model_context, prompt_limit, turn_prompt)
from trainers.team.metrics import TurnGuards

ROLE = "Debate: check the claim, argue, end with ANSWER: <number>."
TURNS = ["graph.order=round_robin", "graph.schedule=null"]  # one debater a turn: these tests count turns
SMALL = ["train.prompts_per_step=2", "train.group_size=2", "tasks.count=20", "tasks.eval_count=2"]


def _debate_observations(message: str, turns: int = 4) -> list[str]:
    """debater_a's observation at each of its turns when both debaters keep saying `message`."""
    env = marl.make_env(load_scenario("debate", TURNS))
    observations, _ = env.reset(seed=0)
    seen = []
    while env.agents:
        seen.append(observations["debater_a"]["text"])
        observations, *_ = env.step({agent: {"text": message} for agent in env.agents})
    return seen[:turns]


# -- the environment's character clip --------------------------------------------------------------


def test_a_long_observation_keeps_its_head_and_tail_and_drops_the_middle():
    messages = [f"argument {i}: " + "the train runs far. " * 14 for i in range(4)]
    env = marl.make_env(load_scenario("debate", TURNS))
    observations, _ = env.reset(seed=0)
    head = f"{ROLE}\n{env.task.prompt}\n"
    for index in range(4):
        observations, *_ = env.step({agent: {"text": messages[index]} for agent in env.agents})
    text = observations["debater_a"]["text"]
    limit = env.scenario.spec.observation_max_chars
    assert len(text) == limit and text.count(CUT_MARK) == 1
    kept_head, tail = text.split(CUT_MARK)
    assert kept_head == head  # the role and the task, whole: never an observation that begins mid-word
    assert text.endswith(f"debater_b: {messages[3][:300]}\n")  # the latest message, whole
    assert "argument 0" not in text  # the oldest history is what went


def test_an_observation_that_fits_is_exactly_the_templates_text():
    first = _debate_observations("short")[0]
    env = marl.make_env(load_scenario("debate", TURNS))
    env.reset(seed=0)
    assert first == f"{ROLE}\n{env.task.prompt}\n" and CUT_MARK not in first


def test_relay_observations_and_messages_are_never_clipped():
    """make run is unchanged: relay's observations (<= 18 characters) are far below observation_max_chars=32,
    and its 4-token answers (digits, which the tiny model's tokenizer reads one a token) below action_max_chars=8."""
    env = marl.make_env("relay")
    spec = env.scenario.spec
    assert max(a.max_tokens for a in spec.agents) <= spec.action_max_chars
    for seed in range(40):
        observations, _ = env.reset(seed=seed)
        while env.agents:
            assert all(len(o["text"]) <= 18 for o in observations.values())
            observations, *_ = env.step({agent: {"text": "9999"} for agent in env.agents})


def test_keep_ends_cuts_once_and_keeps_one_mark():
    text = "HEAD\n" + "".join(f"m{i} " for i in range(100))
    once = keep_ends(text, 60, 5)
    assert len(once) == 60 and once.startswith("HEAD\n" + CUT_MARK) and once.endswith(text[-48:])
    assert keep_ends(text, 60, 100).startswith(text[:45] + CUT_MARK)  # the head: at most three quarters
    twice = keep_ends(once, 40, 40)
    assert len(twice) == 40 and twice.count(CUT_MARK) == 1 and twice.startswith("HEAD\n" + CUT_MARK)
    assert keep_ends(text, len(text), 0) == text


# -- the token fit at prompt time ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers(real_model_dirs):
    from transformers import AutoTokenizer

    return {arch: AutoTokenizer.from_pretrained(path) for arch, path in real_model_dirs.items()}


def _tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("architecture", ["qwen2", "llama", "gpt2"])
def test_a_prompt_over_its_token_limit_drops_the_observations_middle(tokenizers, architecture):
    tokenizer = tokenizers[architecture]
    observation = _debate_observations("argue the claim again and again. " * 9)[-1]
    assert CUT_MARK in observation  # cut by the environment already: the fit cuts the same middle
    style = TurnStyle(ROLE, "auto", max_tokens=128, max_prompt_tokens=300)
    full = turn_prompt(tokenizer, observation, style)
    assert _tokens(tokenizer, full) > 300
    [prompt], [cut] = fit_turn_prompts(tokenizer, [("debater_a", observation, None)], {"debater_a": style})
    assert cut and _tokens(tokenizer, prompt) <= 300 and prompt.count(CUT_MARK) == 1
    assert prompt.startswith(full[:full.index(CUT_MARK)])  # the template, the role, the task: the head
    assert prompt.endswith(full[-40:])  # the latest message and the generation prompt: the tail
    roomy = TurnStyle(ROLE, "auto", max_tokens=128, max_prompt_tokens=4000)
    [same], [cut] = fit_turn_prompts(tokenizer, [("a", "12+35=", None)], {"a": roomy})
    assert same == turn_prompt(tokenizer, "12+35=", roomy) and not cut


def test_the_default_limit_is_what_the_context_leaves_after_max_tokens(real_model_dirs, tokenizers):
    import json

    assert directory_context(real_model_dirs["gpt2"]) == 512 == directory_context(real_model_dirs["qwen2"])
    assert model_context(SimpleNamespace(config=SimpleNamespace(n_positions=1024))) == 1024
    assert json.loads((real_model_dirs["llama"] / "config.json").read_text())["max_position_embeddings"] == 512
    style = agent_styles(load_scenario("debate").spec)["debater_a"]
    assert prompt_limit(style, 512) == 512 - 128 and prompt_limit(style, None) is None
    assert prompt_limit(TurnStyle(max_tokens=8, max_prompt_tokens=100), 512) == 100
    tokenizer = tokenizers["qwen2"]
    long = "x " * 600  # about 600 tokens: over 512 - 128
    [prompt], [cut] = fit_turn_prompts(tokenizer, [("debater_a", long, None)], {"debater_a": style}, context=512)
    assert cut and _tokens(tokenizer, prompt) <= 384


def test_relays_prompts_on_the_tiny_model_are_chat_turns_never_cut(demo_model_dir):
    from trainers.policy.loading import load_policy

    model, tokenizer = load_policy(demo_model_dir)
    styles = agent_styles(load_scenario("relay").spec)
    requests = [(agent, text, None) for agent, text in [("left", "12+35="), ("final", "47+82="), ("right", "")]]
    prompts, cut = fit_turn_prompts(tokenizer, requests, styles, model_context(model))
    assert prompts == [f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n" for text in ("12+35=", "47+82=", "")]
    assert cut == [False] * 3


# -- the context check -----------------------------------------------------------------------------


def test_the_context_check_names_the_agent_the_sum_and_the_context():
    spec = load_scenario("debate", ["max_prompt_tokens=600"]).spec
    assert context_problem(spec, 512) == (
        "agents.0.max_tokens=128 + max_prompt_tokens=600 = 728 tokens is more than the model's context of 512; "
        "lower max_prompt_tokens or agents.0.max_tokens, or use a model with a longer context")
    assert context_problem(spec, 1024) is None and context_problem(spec, None) is None
    unset = load_scenario("debate", ["agents.1.max_tokens=600"]).spec
    assert context_problem(unset, 512).startswith("agents.1.max_tokens=600 leaves no room for a prompt")
    scripted = load_scenario("debate", ["max_prompt_tokens=600", "agents.0.policy=random", "agents.1.policy=random"])
    assert context_problem(scripted.spec, 512) is None  # no agent plays the model


@pytest.mark.parametrize("command", ["run", "eval"])  # marl eval makes run's context check
def test_a_prompt_and_answer_longer_than_the_context_is_refused_with_exit_2(real_model_dirs, tmp_path, capsys,
                                                                           command):
    from trainers.cli.main import main

    out = tmp_path / command
    assert main([command, "relay", "--set", f"train.model={real_model_dirs['gpt2']}", "--set", "max_prompt_tokens=600",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert ("agents.0.max_tokens=4 + max_prompt_tokens=600 = 604 tokens is more than the model's context of 512; "
            "lower max_prompt_tokens or agents.0.max_tokens, or use a model with a longer context") in err
    assert not out.exists()  # refused before anything was made


@pytest.mark.parametrize("name", ["relay", "weather", "text_to_sql", "code_pair", "debate", "negotiation", "tictactoe",
                                  "kuhn_poker"])
def test_every_built_in_scenario_fits_the_tiny_models_context(name):
    from helpers.paths import SCENARIOS
    from marl.scenario.load import load_scenario
    from trainers.policy.tinylm import TinyLMRecipe
    from trainers.run import check_context

    check_context(load_scenario(SCENARIOS / f"{name}.yaml"), TinyLMRecipe().max_positions)  # no RunError


def test_the_tiny_model_refuses_a_prompt_past_its_context_before_building(capsys, tmp_path):
    from trainers.cli.main import main

    cache = tmp_path / "cache"
    assert main(["run", "debate", "--set", "max_prompt_tokens=2000", "--cache-dir", str(cache),
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and ("agents.0.max_tokens=128 + max_prompt_tokens=2000 = 2128 tokens is more "
                                     "than the model's context of 2048") in err
    assert not (cache / "models").exists()  # refused before the tiny model was built


# -- action tokens the environment never heard -----------------------------------------------------


def test_completion_tokens_past_action_max_chars_get_mask_0(real_model_dirs):
    from trainers.run import RunOptions, prepare

    overrides = [f"train.model={real_model_dirs['qwen2']}", "action_max_chars=3", *SMALL,
                 *(f"agents.{i}.max_tokens=8" for i in range(3))]
    _, train_tasks, _, trainer, _ = prepare(RunOptions("relay", overrides), log=lambda line: None)
    batch = trainer.player.play(trainer._jobs(train_tasks[:2], None, {}))
    rows, _ = trainer._samples(trainer.arena, batch, "shared", {a: [0.0] * len(batch.episodes) for a in trainer.agents})
    turns = [t for e in batch.episodes for t in e.turns if t.actor == "shared"]
    tokenizer, clipped = trainer.actors["shared"].tokenizer, 0
    for row, turn in enumerate(turns):
        sampled = batch.generations["shared"][turn.batch].completion_mask[turn.row]
        mask = rows.completion_mask[row][:sampled.numel()]
        if len(turn.text) <= 3:
            assert torch.equal(mask, sampled)
            continue
        clipped += 1
        kept = sampled.nonzero().flatten()
        ids = batch.generations["shared"][turn.batch].completion_ids[turn.row, kept].tolist()
        heard = int(mask.sum())
        assert 1 <= heard < len(kept) and mask[kept[:heard]].all() and not mask[kept[heard:]].any()
        assert heard == heard_tokens(tokenizer, ids, 3)
        assert len(tokenizer.decode(ids[:heard - 1], skip_special_tokens=True)) < 3  # the last heard starts within
        assert len(tokenizer.decode(ids[:heard], skip_special_tokens=True)) >= 3  # and the next never would
    assert clipped  # a random model's 8 tokens are more than 3 characters


# -- the guards --------------------------------------------------------------------------------------


def test_a_step_reports_truncated_prompts_and_completions_at_their_limit_and_warns_once(real_model_dirs):
    from trainers.run import RunOptions, prepare

    lines = []
    overrides = [f"train.model={real_model_dirs['llama']}", "max_prompt_tokens=3", *SMALL,
                 *(f"agents.{i}.max_tokens=2" for i in range(3))]
    _, _, _, trainer, _ = prepare(RunOptions("relay", overrides), log=lines.append)
    first, second = trainer.step(), trainer.step()
    assert first["length/prompts_truncated"] == 1.0 == second["length/prompts_truncated"]
    assert first["length/completions_at_limit"] > 0.5
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 2  # one line each, on the first step only
    assert "of 12 prompts were cut to fit" in warnings[0] and "train.truncation_warn_fraction=0.5" in warnings[0]
    assert "completions hit their agent's max_tokens" in warnings[1] and "raise agents[].max_tokens" in warnings[1]


def _episode(calls: list[str]):
    return SimpleNamespace(turns=[], tool_log=[SimpleNamespace(agent=agent) for agent in calls])


def test_a_tool_using_agent_with_no_parsed_call_for_n_steps_warns_once():
    spec = load_scenario("weather").spec
    lines = []
    guards = TurnGuards(spec, warn_fraction=0.5, silence_steps=3, log=lines.append)
    [agent] = [a.name for a in spec.agents if a.tools]
    silent, calling = SimpleNamespace(episodes=[_episode([])]), SimpleNamespace(episodes=[_episode([agent] * 2)])
    assert guards.update(1, silent) == {f"tools/{agent}/calls": 0.0}
    assert guards.update(2, calling)[f"tools/{agent}/calls"] == 2.0  # a call resets the count
    for step in (3, 4):
        guards.update(step, silent)
    assert not lines
    guards.update(5, silent)
    guards.update(6, silent)
    [line] = lines
    assert line.startswith(f"warning: step 5: agent {agent!r} has tools (get_weather, get_air_quality) but wrote "
                           "no tool call the parser recognises in 3 steps in a row")
    assert "{tools} in agents[].observation" in line and "train.tool_silence_steps" in line


def test_the_new_knobs_have_defaults_and_docs():
    from marl.scenario.spec import TrainSpec

    fields = TrainSpec.model_fields
    assert fields["truncation_warn_fraction"].default == 0.5 and fields["tool_silence_steps"].default == 20
    assert fields["truncation_warn_fraction"].description and fields["tool_silence_steps"].description
