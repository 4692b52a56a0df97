"""Actors whose LoRA adapters share one base sample in one batch (peft's mixed-batch forward).

The base's matmuls then run once for every role; each row must still get exactly its own adapter's
distribution: the mixed batch's logits equal each adapter's own forward, and what the actors say
together is what each says alone (keyed rows draw from their own streams).
"""

from __future__ import annotations

import pytest
import torch

from marl.rollout import EpisodeJob, EpisodePlayer
from marl.scenario.load import load_scenario
from marl.scenario.spec import LoraSpec
from trainers.policy.actors import build_actors
from trainers.policy.adapters import AdapterBase
from trainers.policy.generation import encode_prompts
from trainers.policy.tinylm import load_policy

OWN_LORA = ["agents.0.policy=own", "agents.1.policy=own", "agents.2.policy=own", "train.lora.r=4",
            "tasks.count=16", "tasks.eval_count=4"]


def _nudge(policies, scale=0.3):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for policy in policies:
            for name, parameter in policy.named_parameters():
                if "lora_B" in name:
                    parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def test_mixed_batch_logits_equal_each_adapters_own_forward(real_model_dirs):
    model, tokenizer = load_policy(real_model_dirs["qwen2"])
    owner = AdapterBase(model, real_model_dirs["qwen2"], tokenizer)
    a, b = owner.add("solver", LoraSpec(r=4)), owner.add("critic", LoraSpec(r=4))
    _nudge([a, b])
    ids, mask = encode_prompts(tokenizer, ["12+35=", "You are the solver. 3*4=", "9+1=", "SELECT 1;"])
    owner.peft.eval()
    with torch.no_grad():
        mixed = owner.peft(input_ids=ids, attention_mask=mask, adapter_names=["solver", "critic", "solver", "critic"]).logits
        alone_a = a(input_ids=ids[0::2], attention_mask=mask[0::2]).logits
        alone_b = b(input_ids=ids[1::2], attention_mask=mask[1::2]).logits
    torch.testing.assert_close(mixed[0::2], alone_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixed[1::2], alone_b, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(alone_a, alone_b, atol=1e-3)  # the adapters differ: the test can tell them apart


@pytest.fixture
def own_team(demo_model_dir):
    """relay with three `own` LoRA agents on the demo model (relay's base), their adapters nudged apart."""
    scenario = load_scenario("relay", OWN_LORA)
    actors, seats = build_actors(scenario, demo_model_dir, seed=0, lora=scenario.spec.train.lora)
    _nudge([actors[name].model for name in ("left", "right", "final")])
    return scenario, actors, seats


@pytest.mark.parametrize("greedy", [False, True])
def test_actors_sampled_together_say_what_each_says_alone(own_team, greedy):
    scenario, actors, _ = own_team
    tasks = scenario.split()[0][:3]
    calls = [(actors[agent], [(agent, f"{task.id} {agent} 1{i}+2{i}=", task) for i, task in enumerate(tasks)],
              [100 * n + i for i in range(len(tasks))]) for n, agent in enumerate(("left", "right"))]
    assert actors["left"].batch_group == actors["right"].batch_group is not None
    together = actors["left"].act_together(calls, max_new_tokens=4, greedy=greedy)
    for (actor, requests, keys), joint in zip(calls, together):
        alone = actor.act(requests, max_new_tokens=4, greedy=greedy, keys=keys)
        assert joint.texts == alone.texts
        a, b = joint.completions, alone.completions
        width = b.completion_ids.size(1)
        assert torch.equal(a.completion_mask[:, :width], b.completion_mask) and not a.completion_mask[:, width:].any()
        assert torch.equal(a.completion_ids[:, :width] * b.completion_mask, b.completion_ids * b.completion_mask)
        torch.testing.assert_close(a.logprobs[:, :width], b.logprobs, atol=1e-5, rtol=1e-5)


def test_the_player_batches_adapters_that_act_together_and_plays_the_same_episodes(own_team, monkeypatch):
    scenario, actors, seats = own_team
    peft = actors["left"].model.peft_model
    seen: list[set] = []
    peft.register_forward_pre_hook(lambda module, args, kwargs: seen.append(set(kwargs.get("adapter_names") or ())),
                                   with_kwargs=True)
    jobs = [EpisodeJob(task, seed) for seed, task in enumerate(scenario.split()[0][:4])]
    together = EpisodePlayer(scenario, actors, seats).play(jobs)
    assert {"left", "right"} in seen  # left and right act together (topological order): one batch for both
    monkeypatch.setattr(type(actors["left"]), "batch_group", property(lambda self: None))
    alone = EpisodePlayer(scenario, actors, seats).play(jobs)
    assert [[t.text for t in e.turns] for e in together.episodes] == [[t.text for t in e.turns] for e in alone.episodes]
