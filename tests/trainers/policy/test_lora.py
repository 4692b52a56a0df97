"""LoRA via peft (trainers/policy/adapters.py) on randomly initialised Qwen2, Llama and GPT-2 models.

An update trains adapter weights only (the base stays bit-identical); 'own' agents share one base
in memory; an actor's forward runs with its adapter alone; the KL reference with adapters disabled
is the base; the self-play opponent is a frozen adapter whose snapshots hold adapter weights only.
The memory of three 'own' agents (and their KL references) with LoRA against full copies is printed.
"""

from __future__ import annotations

import pytest
import torch

from marl.scenario.load import load_scenario
from marl.scenario.spec import LoraSpec
from marl.types import Task
from trainers.grpo.config import GRPOConfig
from trainers.grpo.learner import PolicyLearner
from trainers.policy.actors import ModelActor, build_actors
from trainers.policy.adapters import AdapterBase, AdapterPolicy, BaseReference
from trainers.policy.tinylm import load_policy
from helpers.scenario_files import race_yaml

LORA = LoraSpec(r=4, alpha=8.0)
RELAY = ["tasks.count=40", "tasks.eval_count=4", "credit.absent=null_message"]
OWN = ["agents.0.policy=own", "agents.1.policy=own", "agents.2.policy=own"]
PROMPTS = ["12+35=", "You are the solver. 47+19=", "SELECT name FROM users;"]


def _config(**overrides) -> GRPOConfig:
    return GRPOConfig(**{**dict(steps=4, prompts_per_step=2, group_size=2, max_new_tokens=6, lr=5e-2, beta=0.04,
                                seed=0, floor_reward=0.0, diversity_penalty=0.0), **overrides})


def _base_weights(owner: AdapterBase) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in owner.base_model.named_parameters() if "lora_" not in n}


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def _sampled(actor: ModelActor):
    """One batched generate of the actor on PROMPTS: (completions, advantages with a signal)."""
    requests = [("solver", prompt, Task(id=f"t{i}", prompt=prompt)) for i, prompt in enumerate(PROMPTS)]
    completions = actor.act(requests, max_new_tokens=6).completions
    return completions, torch.tensor([1.0, -1.0, 0.5])


@pytest.mark.parametrize("architecture", ["qwen2", "llama", "gpt2"])
def test_an_update_trains_only_the_adapter_and_leaves_the_base_bit_identical(real_model_dirs, architecture):
    model, tokenizer = load_policy(real_model_dirs[architecture])
    owner = AdapterBase(model, real_model_dirs[architecture], tokenizer)
    alice, bob = owner.add("alice", LORA), owner.add("bob", LORA)
    before, bob_before = _base_weights(owner), {n: p.detach().clone() for n, p in bob.named_parameters()}
    learner = PolicyLearner(alice, _config())
    optimised = [p for group in learner.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in optimised} == {id(p) for p in alice.parameters()}  # the optimizer sees the adapter only
    assert optimised and all("lora_" in n and ".alice." in n for n, _ in alice.named_parameters())
    stats = learner.update(*_sampled(ModelActor("alice", alice, tokenizer, seed=0)))
    assert stats["trained_rows"] > 0 and stats["grad_norm"] > 0
    assert all(torch.equal(before[n], p) for n, p in owner.base_model.named_parameters() if "lora_" not in n)
    assert all(torch.equal(bob_before[n], p) for n, p in bob.named_parameters())  # the other adapter: untouched
    assert any(p.abs().sum() > 0 for n, p in alice.named_parameters() if "lora_B" in n)  # B left 0: it trained
    trainable = {n for n, p in owner.peft.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in alice.named_parameters()}  # requires_grad on the active adapter alone


@pytest.mark.parametrize("architecture", ["qwen2", "gpt2"])
def test_the_reference_with_adapters_disabled_is_the_base(real_model_dirs, architecture):
    plain, _ = load_policy(real_model_dirs[architecture])
    model, tokenizer = load_policy(real_model_dirs[architecture])
    owner = AdapterBase(model, real_model_dirs[architecture], tokenizer)
    policy = owner.add("alice", LORA)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():  # a trained-looking adapter: the policy is not the base
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    learner = PolicyLearner(policy, _config())
    assert isinstance(learner.reference, BaseReference) and learner.reference.state_dict() == {}
    ids = torch.tensor([tokenizer("You are the solver. 12+35=")["input_ids"]])
    assert torch.equal(_logits(learner.reference, ids), _logits(plain, ids))
    assert not torch.allclose(_logits(policy, ids), _logits(plain, ids))
    assert not PolicyLearner(policy, _config(beta=0.0)).reference  # beta 0: no reference at all


def test_each_actor_runs_with_its_own_adapter_alone(real_model_dirs):
    plain, _ = load_policy(real_model_dirs["llama"])
    model, tokenizer = load_policy(real_model_dirs["llama"])
    owner = AdapterBase(model, real_model_dirs["llama"], tokenizer)
    alice, bob = owner.add("alice", LORA), owner.add("bob", LORA)
    with torch.no_grad():
        for _, parameter in bob.named_parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    ids = torch.tensor([tokenizer("12+35=")["input_ids"]])
    bob_logits = _logits(bob, ids)
    assert torch.equal(_logits(alice, ids), _logits(plain, ids))  # alice's B = 0: bob's weights never leak in
    assert torch.equal(_logits(bob, ids), bob_logits) and not torch.equal(bob_logits, _logits(plain, ids))
    greedy = [ModelActor(n, p, tokenizer, seed=0).act([("a", "12+35=", Task(id="t", prompt="12+35="))],
                                                      max_new_tokens=6, greedy=True).texts for n, p in
              (("alice", alice), ("bob", bob), ("alice", alice))]
    assert greedy[0] == greedy[2]  # switching adapters back and forth changes nothing


def _storage_bytes(models) -> int:
    """Bytes of the distinct tensor storages behind the given models' weights (shared storage counted once)."""
    seen = {}
    for model in models:
        tensors = list(model.owner.peft.parameters()) if isinstance(model, (AdapterPolicy, BaseReference)) \
            else list(model.parameters())
        for tensor in tensors:
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def team_memory(base_dir, lora: bool) -> tuple[int, object]:
    """Parameter bytes of relay's three 'own' agents with their KL references: (bytes, trainer)."""
    from trainers.config import resolve_config
    from trainers.team.trainer import MultiAgentTrainer

    overrides = RELAY + OWN + (["train.lora.r=16"] if lora else [])
    scenario = load_scenario("relay", overrides)
    actors, seats = build_actors(scenario, base_dir, seed=0, lora=scenario.spec.train.lora)
    trainer = MultiAgentTrainer(scenario, actors, seats, scenario.split()[0], resolve_config(scenario, grpo=_config()), log=lambda message: None)
    models = [a.model for a in actors.values()] + [learner.reference for learner in trainer.learners.values()]
    return _storage_bytes(models), trainer


def test_own_agents_share_one_frozen_base_in_memory(real_model_dirs):
    full, _ = team_memory(real_model_dirs["qwen2"], lora=False)
    adapters, trainer = team_memory(real_model_dirs["qwen2"], lora=True)
    actors = [trainer.actors[name] for name in ("left", "right", "final")]
    owners = {id(a.model.owner) for a in actors}
    assert len(owners) == 1 and {a.model.name for a in actors} == {"left", "right", "final"}
    pointers = {a.model.owner.base_model.get_input_embeddings().weight.data_ptr() for a in actors}
    assert len(pointers) == 1  # one base tensor storage for all three
    learner_parameters = [{id(p) for p in learner.model.parameters()} for learner in trainer.learners.values()]
    assert all(not (a & b) for i, a in enumerate(learner_parameters) for b in learner_parameters[i + 1:])
    base = sum(p.numel() * p.element_size() for p in load_policy(real_model_dirs["qwen2"])[0].parameters())
    print(f"\nthree own agents + KL references, parameter bytes: full copies {full:,} ({full / base:.1f}x the base), "
          f"LoRA r=16 {adapters:,} ({adapters / base:.2f}x the base)")
    adapter_bytes = sum(p.numel() * p.element_size() for a in actors for p in a.model.parameters())
    assert full == 6 * base  # three copies and three frozen references
    assert adapters == base + adapter_bytes  # one base (the references are it, adapters disabled) + three adapters


def test_selfplay_opponent_is_a_frozen_adapter_and_snapshots_hold_adapter_weights(real_model_dirs, tmp_path):
    from trainers.config import resolve_config
    from trainers.team.trainer import OPPONENT, MultiAgentTrainer, StepPlan

    (tmp_path / "race.yaml").write_text(race_yaml())
    scenario = load_scenario(tmp_path / "race.yaml", ["train.lora.r=4", "train.selfplay.snapshot_every=1",
                                    "train.selfplay.self_play_fraction=0.0"])
    actors, seats = build_actors(scenario, real_model_dirs["qwen2"], seed=0, lora=scenario.spec.train.lora)
    trainer = MultiAgentTrainer(scenario, actors, seats, scenario.split()[0], resolve_config(scenario, grpo=_config()),
                                log=lambda message: None)
    shared, opponent = trainer.actors["shared"].model, trainer.actors[OPPONENT].model
    assert isinstance(opponent, AdapterPolicy) and opponent.owner is shared.owner and not opponent.trainable
    trainer.step(StepPlan(reward_transform=lambda episode, agent, reward: reward + episode.job.seed % 2))
    _, snapshot = trainer.pool.sample()
    assert snapshot and all("lora_" in key for key in snapshot)  # adapter weights only, no base copy
    assert set(snapshot) == set(shared.state_dict())


def test_adapters_on_a_bfloat16_base_keep_float32_weights(real_model_dirs):
    """build_actors loads the base straight in train.dtype, so peft makes its adapters in float32 on it
    (casting a wrapped model afterwards would turn the adapters to bfloat16 too)."""
    scenario = load_scenario("relay", RELAY + OWN + ["train.lora.r=4", "train.dtype=bfloat16"])
    actors, _ = build_actors(scenario, real_model_dirs["qwen2"], seed=0, device="cpu", dtype="bfloat16", lora=scenario.spec.train.lora)
    model = actors["left"].model
    base_dtypes = {p.dtype for name, p in model.owner.peft.named_parameters() if "lora_" not in name}
    adapter_dtypes = {p.dtype for p in model.parameters()}
    assert base_dtypes == {torch.bfloat16} and adapter_dtypes == {torch.float32}
