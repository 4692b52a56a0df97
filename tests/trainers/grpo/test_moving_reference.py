"""`train.ref_update_every`: the KL reference moves to the current policy every N steps.

With a full model the reference's weights become the policy's at every N-th step (and stay put between),
so the KL measured right after a move is 0; under LoRA the reference moves from the base (adapters
off) to a frozen copy of the adapter, and a checkpoint restores the moved reference. Without a KL
term, or with --init-from (whose reference is the earlier policy), the setting is refused in one line.
"""

from __future__ import annotations

import copy

import pytest
import torch

from marl.scenario.spec import LoraSpec
from marl.types import Task
from trainers.cli.main import main
from trainers.grpo.config import GRPOConfig
from trainers.grpo.learner import PolicyLearner
from trainers.policy.actors import ModelActor
from trainers.policy.adapters import AdapterBase, AdapterPolicy, BaseReference
from trainers.policy.tinylm import load_policy
from trainers.team.trainer import StepPlan
from helpers.scenario_files import race_yaml
from helpers.signal import by_seed

RACE = ["train.prompts_per_step=2", "train.group_size=4",
        "train.beta=0.04", "train.lr=5e-3"]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _copy(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _race_trainer(tmp_path, *settings):
    from trainers.run import RunOptions, prepare

    path = tmp_path / "race.yaml"
    path.write_text(race_yaml(8, train="  stages: [main]\n"))
    _, _, _, trainer, _ = prepare(RunOptions(str(path), [*RACE, *settings]), log=lambda *_: None)
    return trainer


def test_the_reference_moves_to_the_policy_every_n_steps_and_stays_between(demo_model_dir, tmp_path):
    trainer = _race_trainer(tmp_path, "train.ref_update_every=2")
    model, learner = trainer.actors["shared"].model, trainer.learners["shared"]
    start, kls = _copy(model), []
    for step in range(1, 5):
        kls.append(trainer.step(StepPlan(reward_transform=by_seed))["train/kl"])  # a spread: every step updates
        reference = _copy(learner.reference)
        if step % 2:  # between moves: the reference is where the last move (or the start) left it
            assert _same(reference, start if step == 1 else moved) and not _same(reference, _copy(model))
        else:
            assert _same(reference, _copy(model))
            moved = reference
    # the KL is measured before each step's update: 0 after a move (steps 1 and 3), > 0 a step later
    assert kls[0] == pytest.approx(0, abs=1e-6) and kls[2] == pytest.approx(0, abs=1e-6)
    assert kls[1] > 1e-6 and kls[3] > 1e-6


def test_without_the_setting_the_reference_stays_the_start(demo_model_dir, tmp_path):
    trainer = _race_trainer(tmp_path)
    start = _copy(trainer.actors["shared"].model)
    for _ in range(3):
        trainer.step()
    assert _same(_copy(trainer.learners["shared"].reference), start)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def test_under_lora_the_reference_moves_to_a_frozen_copy_of_the_adapter_and_a_checkpoint_keeps_it(
        real_model_dirs):
    model, tokenizer = load_policy(real_model_dirs["qwen2"])
    owner = AdapterBase(model, real_model_dirs["qwen2"], tokenizer)
    policy = owner.add("alice", LoraSpec(r=4, alpha=8.0))
    config = GRPOConfig(steps=4, prompts_per_step=2, group_size=2, max_new_tokens=6, lr=5e-2, beta=0.04,
                        ref_update_every=1, seed=0, floor_reward=0.0, diversity_penalty=0.0)
    learner = PolicyLearner(policy, config)
    with torch.no_grad():  # a trained-looking adapter
        for parameter in policy.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    ids = torch.tensor([tokenizer("You are the solver. 12+35=")["input_ids"]])
    assert isinstance(learner.reference, BaseReference)
    learner.move_reference()
    assert isinstance(learner.reference, AdapterPolicy) and not learner.reference.trainable
    assert torch.equal(_logits(learner.reference, ids), _logits(policy, ids))
    moved = _logits(learner.reference, ids)
    requests = [("solver", p, Task(id=f"t{i}", prompt=p)) for i, p in enumerate(["12+35=", "47+19="])]
    completions = ModelActor("alice", policy, tokenizer, seed=0).act(requests, max_new_tokens=6).completions
    learner.update(completions, torch.tensor([1.0, -1.0]))
    assert torch.equal(_logits(learner.reference, ids), moved)  # the copy is frozen: the update moved the policy
    assert not torch.equal(_logits(policy, ids), moved)
    state = copy.deepcopy(learner.state_dict())  # as read back from disk: no tensor shared with the live models
    fresh = PolicyLearner(policy, config)  # as a resumed run builds it: the base until the checkpoint loads
    assert isinstance(fresh.reference, BaseReference)
    fresh.load_state_dict(state)
    assert isinstance(fresh.reference, AdapterPolicy) and torch.equal(_logits(fresh.reference, ids), moved)


def test_a_moving_reference_without_a_kl_term_is_one_line(capsys):
    assert main(["validate", "relay", "--set", "train.ref_update_every=5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "ref_update_every=5" in err and "set train.beta > 0" in err


def test_a_moving_reference_with_init_from_is_refused(tmp_path):
    from marl.scenario.spec import TrainSpec
    from trainers.continual import ContinualError, continual_beta

    with pytest.raises(ContinualError, match="set ref_update_every: 0"):
        continual_beta(TrainSpec(beta=0.1, ref_update_every=10))
    assert continual_beta(TrainSpec(beta=0.1)) == 0.1


def test_the_one_agent_addition_scenario_moves_its_reference_too(micro_policy):
    from marl.scenario.load import load_scenario
    from trainers.config import resolve_config
    from trainers.team.trainer import MultiAgentTrainer

    spec = load_scenario("addition")
    model, tokenizer = micro_policy()
    actors = {"shared": ModelActor("shared", model, tokenizer, trainable=True, seed=0)}
    config = GRPOConfig(prompts_per_step=2, group_size=4, max_new_tokens=4, lr=1e-3, beta=0.04, ref_update_every=3)
    trainer = MultiAgentTrainer(spec, actors, {"solver": "shared"}, spec.split()[0], resolve_config(spec, grpo=config),
                                log=lambda *_: None)
    start = _copy(model)
    for step in range(1, 4):
        trainer.step(StepPlan(reward_transform=by_seed))  # a spread: every step updates
        reference, now = _copy(trainer.learners["shared"].reference), _copy(model)
        assert _same(reference, now if step == 3 else start)  # it moves at step 3, not before
        assert step == 3 or not _same(reference, now)  # the policy did move away from it
