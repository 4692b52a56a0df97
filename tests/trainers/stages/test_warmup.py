"""The warm-up SFT stage (trainers/stages/warmup.py) per learner, for the tiny model and pretrained weights.

A learner that meets the format target skips SFT (its weights unchanged); each learner stops on its
own agents' compliance; with LoRA only adapter weights move and the base stays bit-identical; the
tiny model keeps its settings (1e-3, 300 steps, checked every 25) and pretrained weights get theirs
(1e-5, or 1e-4 with LoRA, at most 50 steps) unless the scenario sets them. Compliance is scripted
(`Schedule`) where a test is about when SFT stops, so no test depends on sampled tokens; the measure
itself is tested with scripted agents.
"""

from __future__ import annotations

import math

import pytest
import torch

from marl.scenario.load import load_scenario
from marl.scenario.spec import WARMUP_DEFAULTS, WarmupSpec
from trainers.grpo.config import GRPOConfig
from trainers.policy import tinylm
from trainers.policy.actors import build_actors
from trainers.policy.tinylm import TinyLMRecipe
from trainers.stages import warmup

# accuracy_target 0: the format alone decides (the accuracy probe is tested on its own, below)
RELAY = ["tasks.count=40", "tasks.eval_count=4", "credit.absent=null_message", "train.warmup.accuracy_target=0"]
FINAL_OWN = ["agents.2.policy=own"]  # two learners: 'shared' (left, right) and 'final'


class Schedule:
    """Stands in for learner_compliance: each learner's compliance at its successive measurements (the
    last value repeats). Measurements: the start (every learner), each SFT check of one learner, the end."""

    def __init__(self, **values):
        self.values = {name: list(sequence) for name, sequence in values.items()}

    def __call__(self, player, tasks, agents_of, seed=0):
        own = {name: self.values[name].pop(0) if len(self.values[name]) > 1 else self.values[name][0]
               for name in agents_of}
        return 0.5, own


@pytest.fixture
def micro_dir(micro_policy, tmp_path):
    """A saved micro character model (a stand-in for the tiny one: train.model stays 'tiny')."""
    model, tokenizer = micro_policy()
    model.save_pretrained(tmp_path / "micro")
    tokenizer.save_pretrained(tmp_path / "micro")
    return tmp_path / "micro"


def _trainer(scenario, model_dir):
    from trainers.config import resolve_config
    from trainers.team.trainer import MultiAgentTrainer

    actors, seats = build_actors(scenario, model_dir, seed=0, lora=scenario.spec.train.lora)
    config = GRPOConfig(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=4, seed=0)
    return MultiAgentTrainer(scenario, actors, seats, scenario.split()[0], resolve_config(scenario, grpo=config), log=lambda line: None)


def _weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _same(before: dict, model) -> bool:
    return all(torch.equal(before[name], p) for name, p in model.named_parameters())


def _stage(trainer, scenario, lines=None):
    log = lines.append if lines is not None else (lambda line: None)
    return warmup.sft_warmup_stage(trainer, scenario, scenario.split()[0], scenario.spec.train.warmup, log)


def test_defaults_are_the_tiny_models_unless_pretrained_and_explicit_values_win():
    assert WarmupSpec().sft_lr is None and WarmupSpec().sft_max_steps is None  # None: the model decides
    tiny, full, lora = (WarmupSpec().resolved(pretrained=p, lora=l) for p, l in ((False, False), (True, False),
                                                                                    (True, True)))
    assert (tiny.sft_lr, tiny.sft_max_steps) == (1e-3, 300) == WARMUP_DEFAULTS["tiny"]
    assert (full.sft_lr, full.sft_max_steps) == (1e-5, 50) and (lora.sft_lr, lora.sft_max_steps) == (1e-4, 50)
    assert WarmupSpec().resolved(lora=True).sft_lr == 1e-3  # LoRA on the tiny model keeps the tiny settings
    explicit = WarmupSpec(sft_lr=3e-5, sft_max_steps=0).resolved(pretrained=True, lora=True)
    assert (explicit.sft_lr, explicit.sft_max_steps) == (3e-5, 0)
    # the tiny model's schedule is exactly what the stage always used
    assert warmup.sft_recipe(tiny, pretrained=False) == TinyLMRecipe(
        sft_lr=1e-3, sft_batch_size=32, sft_max_steps=300, sft_eval_every=25, sft_warmup_steps=50,
        sft_target_accuracy=0.9)
    assert warmup.sft_recipe(full, pretrained=True).sft_eval_every == 10
    assert warmup.sft_recipe(full, pretrained=True).sft_warmup_steps == 5


def test_a_pretrained_model_gets_the_pretrained_defaults_and_the_tiny_one_todays(micro_dir, real_model_dirs,
                                                                                monkeypatch):
    seen = {}
    monkeypatch.setattr(warmup, "learner_compliance", Schedule(shared=[0.0]))
    monkeypatch.setattr(tinylm, "sft_warmup", lambda model, tokenizer, demonstrations, recipe, *a, **k:
                        seen.setdefault(len(seen), recipe) and {"steps": 1})
    qwen2 = real_model_dirs["qwen2"]
    for overrides, model_dir in (([], micro_dir), ([f"train.model={qwen2}"], qwen2),
                                 ([f"train.model={qwen2}", "train.lora.r=4"], qwen2),
                                 ([f"train.model={qwen2}", "train.warmup.sft_lr=3e-6", "train.warmup.sft_max_steps=7"],
                                  qwen2)):
        scenario = load_scenario("relay", RELAY + overrides)
        report = _stage(_trainer(scenario, model_dir), scenario)
        assert report["learners"]["shared"]["sft_steps"] == 1
    assert [(r.sft_lr, r.sft_max_steps, r.sft_eval_every) for r in seen.values()] == [
        (1e-3, 300, 25), (1e-5, 50, 10), (1e-4, 50, 10), (3e-6, 7, 10)]


def test_an_agents_own_model_directory_is_pretrained_even_with_the_tiny_base(real_model_dirs):
    scenario = load_scenario("relay", RELAY + [f"agents.2.policy={real_model_dirs['gpt2']}"])
    base = scenario.spec.train.model
    assert not warmup.is_pretrained(scenario, "shared", base) and warmup.is_pretrained(scenario, "final", base)


def test_a_learner_that_meets_the_target_does_not_train(micro_dir):
    scenario = load_scenario("relay", RELAY + ["train.warmup.format_target=0.0"])  # any compliance meets it
    trainer = _trainer(scenario, micro_dir)
    before, lines = _weights(trainer.actors["shared"].model), []
    report = _stage(trainer, scenario, lines)
    assert report["sft_steps"] == 0 and report["learners"]["shared"]["sft_steps"] == 0
    assert _same(before, trainer.actors["shared"].model)
    assert len(lines) == 1 and lines[0].endswith("no SFT needed")  # one tiny learner: the line it always printed


def test_two_learners_stop_on_their_own_compliance(micro_dir, monkeypatch):
    scenario = load_scenario("relay", RELAY + FINAL_OWN)
    trainer = _trainer(scenario, micro_dir)
    assert set(trainer.learners) == {"shared", "final"}
    # shared reaches the target at its first check (step 25), final at its third (step 75)
    monkeypatch.setattr(warmup, "learner_compliance", Schedule(shared=[0.2, 0.95], final=[0.1, 0.3, 0.6, 0.92]))
    before = {name: _weights(trainer.actors[name].model) for name in trainer.learners}
    lines = []
    report = _stage(trainer, scenario, lines)
    assert {name: row["sft_steps"] for name, row in report["learners"].items()} == {"shared": 25, "final": 75}
    assert report["sft_steps"] == 100
    assert not any(_same(before[name], trainer.actors[name].model) for name in trainer.learners)
    assert "  learner shared: format compliance 0.20 -> 0.95 after 25 SFT steps (lr 0.001, at most 300)" in lines
    assert "  learner final: format compliance 0.10 -> 0.92 after 75 SFT steps (lr 0.001, at most 300)" in lines
    assert any(line.endswith("after 100 SFT steps in all, over 2 learners") for line in lines)  # a sum, said so


def test_one_learner_skips_while_the_other_trains(micro_dir, monkeypatch):
    scenario = load_scenario("relay", RELAY + FINAL_OWN + ["train.warmup.sft_max_steps=30"])
    trainer = _trainer(scenario, micro_dir)
    monkeypatch.setattr(warmup, "learner_compliance", Schedule(shared=[0.95], final=[0.1]))  # final never gets there
    before = {name: _weights(trainer.actors[name].model) for name in trainer.learners}
    lines = []
    report = _stage(trainer, scenario, lines)
    assert {name: row["sft_steps"] for name, row in report["learners"].items()} == {"shared": 0, "final": 30}
    assert _same(before["shared"], trainer.actors["shared"].model)
    assert not _same(before["final"], trainer.actors["final"].model)
    assert "  learner shared: format compliance 0.95 (meets the targets); no SFT" in lines


def _scripted_player(*policies, overrides=()):
    from marl.rollout import EpisodePlayer

    seats = [f"agents.{index}.policy={policy}" for index, policy in enumerate(policies)]
    scenario = load_scenario("relay", RELAY + seats + list(overrides))
    return EpisodePlayer(scenario, *build_actors(scenario, None, seed=0)), scenario.split()[0][:6]


def test_each_learner_is_measured_on_its_own_agents_answers():
    """left is the expert, right and final say nothing (failing the format): the cooperative team answer is
    final's, so a learner of final is measured on it, a learner of left or right on its own messages."""
    player, tasks = _scripted_player("expert", "'null'", "'null'")
    team, own = warmup.learner_compliance(player, tasks, {"L": ["left"], "F": ["final"], "LR": ["left", "right"]})
    assert team == 0.0 == own["F"] and own["L"] == 1.0 and own["LR"] == 0.5
    assert warmup.format_compliance(player, tasks) == team
    player, tasks = _scripted_player("'null'", "expert", "expert")  # final answers '' (it sees no sum of left)
    team, own = warmup.learner_compliance(player, tasks, {"F": ["final"], "R": ["right"],
                                                          "all": ["left", "right", "final"]})
    assert team == 0.0 == own["F"] == own["all"] and own["R"] == 1.0  # a learner with the answerer is scored on it
    player, tasks = _scripted_player("expert", "expert", "expert", overrides=["rewards.format=[]"])
    team, own = warmup.learner_compliance(player, tasks, {"F": ["final"]})
    assert math.isnan(team) and math.isnan(own["F"])  # no format scorers: nothing to measure, no SFT


@pytest.mark.parametrize("architecture", ["qwen2", "llama", "gpt2"])
def test_with_lora_sft_trains_the_adapters_only(real_model_dirs, architecture, monkeypatch):
    directory = real_model_dirs[architecture]
    scenario = load_scenario("relay", RELAY + [f"train.model={directory}", "train.lora.r=4",
                                               "train.warmup.sft_max_steps=2", "train.warmup.sft_batch_size=4"])
    trainer = _trainer(scenario, directory)
    policy = trainer.actors["shared"].model
    base = {n: p.detach().clone() for n, p in policy.owner.base_model.named_parameters() if "lora_" not in n}
    adapter = _weights(policy)
    assert adapter and all("lora_" in name for name in adapter)
    monkeypatch.setattr(warmup, "learner_compliance", Schedule(shared=[0.0]))
    report = _stage(trainer, scenario)
    assert report["learners"]["shared"]["sft_steps"] == 2 and report["learners"]["shared"]["sft_lr"] == 1e-4
    assert all(torch.equal(base[n], p) for n, p in policy.owner.base_model.named_parameters() if "lora_" not in n)
    assert not _same(adapter, policy)


def test_full_fine_tuning_of_a_pretrained_model_trains_every_weight(real_model_dirs, monkeypatch):
    directory = real_model_dirs["qwen2"]
    scenario = load_scenario("relay", RELAY + [f"train.model={directory}", "train.warmup.sft_max_steps=2",
                                               "train.warmup.sft_batch_size=4", "train.warmup.sft_lr=1e-3"])
    trainer = _trainer(scenario, directory)
    before = _weights(trainer.actors["shared"].model)
    monkeypatch.setattr(warmup, "learner_compliance", Schedule(shared=[0.0]))
    lines = []
    report = _stage(trainer, scenario, lines)
    assert report["sft_steps"] == 2
    changed = [n for n, p in trainer.actors["shared"].model.named_parameters() if not torch.equal(before[n], p)]
    assert "model.layers.0.self_attn.q_proj.weight" in changed
    assert any(line.startswith("  learner shared:") for line in lines)  # a pretrained learner says what it used


def test_a_scenario_without_format_scorers_says_so_instead_of_nan(micro_dir):
    scenario = load_scenario("relay", RELAY + ["rewards.format=[]"])
    trainer = _trainer(scenario, micro_dir)
    before, lines = _weights(trainer.actors["shared"].model), []
    report = _stage(trainer, scenario, lines)
    assert report["sft_steps"] == 0 and _same(before, trainer.actors["shared"].model)
    assert lines == ["warm-up: the scenario has no format scorers (rewards.format), so format compliance is not "
                     "measured; no SFT"]
    assert not any("nan" in line for line in lines)


class AccuracySchedule:
    """Stands in for agent_accuracy: every agent's accuracy at successive measurements (the last repeats)."""

    def __init__(self, values):
        self.values, self.calls = list(values), 0

    def __call__(self, player, tasks, agents, seed=0):
        self.calls += 1
        value = self.values.pop(0) if len(self.values) > 1 else self.values[0]
        return {agent: value for agent in agents}


def test_accuracy_among_experts_is_each_agents_own_play_with_expert_teammates():
    """left plays the expert, right says nothing, final plays the expert: with experts in the other seats,
    left's and final's teams succeed every time and right's never (its silence breaks the sum)."""
    player, tasks = _scripted_player("expert", "'null'", "expert")
    assert warmup.agent_accuracy(player, tasks, ["left", "right", "final"]) == {"left": 1.0, "right": 0.0,
                                                                                  "final": 1.0}
    assert warmup.PROBE_EXPERT not in player.actors  # the probe's expert seat is gone afterwards


def test_sft_goes_on_until_every_agent_succeeds_among_experts(micro_dir, monkeypatch):
    """The format is met from the start, but the agents succeed 0.0, then 0.1, then 0.3 of the time among
    experts: with accuracy_target 0.2 SFT runs to its second check (step 50) and stops there."""
    scenario = load_scenario("relay", RELAY + ["train.warmup.accuracy_target=0.2"])
    trainer = _trainer(scenario, micro_dir)
    monkeypatch.setattr(warmup, "learner_compliance", Schedule(shared=[0.95]))
    monkeypatch.setattr(warmup, "agent_accuracy", AccuracySchedule([0.0, 0.1, 0.3]))
    lines = []
    report = _stage(trainer, scenario, lines)
    assert report["learners"]["shared"]["sft_steps"] == 50
    assert report["learners"]["shared"]["accuracy_before"] == {"left": 0.0, "right": 0.0, "final": 0.0}
    assert report["learners"]["shared"]["accuracy_after"] == {"left": 0.3, "right": 0.3, "final": 0.3}
    assert lines[0].startswith("warm-up: format compliance 0.50, accuracy among experts left 0.00, right 0.00, "
                               "final 0.00 (target 0.2); SFT on ") and lines[0].endswith(" expert demonstrations")
    assert any("accuracy among experts left 0.10" in line for line in lines)  # the first check's probe


def test_the_time_budget_stops_sft_at_the_first_check_past_it(micro_dir, monkeypatch):
    scenario = load_scenario("relay", RELAY + ["train.warmup.accuracy_target=0.2", "train.warmup.sft_time_budget_s=0.001"])
    trainer = _trainer(scenario, micro_dir)
    monkeypatch.setattr(warmup, "learner_compliance", Schedule(shared=[0.95]))
    monkeypatch.setattr(warmup, "agent_accuracy", AccuracySchedule([0.0]))  # never reaches the target
    lines = []
    report = _stage(trainer, scenario, lines)
    assert report["learners"]["shared"]["sft_steps"] == 25 and report["learners"]["shared"]["out_of_time"]
    assert any("time budget (0.001 s, train.warmup.sft_time_budget_s) ran out" in line for line in lines)
