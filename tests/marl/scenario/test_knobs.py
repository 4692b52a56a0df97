"""One definition of every GRPO knob: the scenario's `train` section holds each under its own name, and
`--set` reads KEY=VALUE by one grammar."""

import typing

import pytest

from marl import options
from marl.scenario.load import ScenarioError, load_scenario
from marl.scenario.overrides import split_override
from marl.scenario.spec import DERIVED_KNOBS, CreditSpec, TrainKnobs, TrainSpec
from trainers.grpo.config import GRPOConfig, KnobError


def test_the_train_section_holds_every_knob_but_the_derived_ones_with_the_same_field():
    assert set(TrainKnobs.model_fields) == set(GRPOConfig.model_fields) - set(DERIVED_KNOBS)
    assert set(DERIVED_KNOBS) == {"steps", "max_new_tokens"}
    assert set(TrainKnobs.model_fields) <= set(TrainSpec.model_fields)
    for name, knob in TrainKnobs.model_fields.items():
        original = GRPOConfig.model_fields[name]
        assert (knob.annotation, knob.default, knob.metadata) == (original.annotation, original.default,
                                                                    original.metadata), name
        assert original.description, f"{name} has no one-line doc"
    assert TrainSpec.model_fields["steps"].default == 100  # main-stage steps: not the GRPO total


def test_option_lists_are_the_schemas_choices():
    assert typing.get_args(GRPOConfig.model_fields["loss_type"].annotation) == options.LOSS_TYPES
    assert typing.get_args(GRPOConfig.model_fields["scale_rewards"].annotation) == options.SCALE_MODES
    assert typing.get_args(GRPOConfig.model_fields["lr_schedule"].annotation) == options.LR_SCHEDULES
    assert typing.get_args(CreditSpec.model_fields["absent"].annotation) == options.ABSENT_MODES
    assert options.one_of(("a", "b", "c")) == "a, b or c"


def test_the_relay_defaults_of_the_train_section_are_unchanged():
    train = load_scenario("relay").spec.train
    assert train.grpo_knobs() == {**GRPOConfig().model_dump(exclude=set(DERIVED_KNOBS))}
    assert (train.lr, train.loss_type, train.epsilon_high, train.group_size) == (5e-5, "dapo", 0.2, 8)


def test_a_new_knob_is_settable_from_the_train_section():
    scenario = load_scenario("relay", ["train.epsilon_high=0.28", "train.adam_betas=[0.8, 0.99]",
                                       "train.lr_schedule=cosine", "train.spike_on_loss=true"])
    train = scenario.spec.train
    assert (train.epsilon_high, train.adam_betas, train.lr_schedule, train.spike_on_loss) == (
        0.28, (0.8, 0.99), "cosine", True)


@pytest.mark.parametrize("setting,message", [
    ("train.loss_type=foo", "train.loss_type: Input should be 'dapo', 'grpo', 'dr_grpo' or 'bnpo' (got 'foo')"),
    ("train.epsilon_high=-1", "train.epsilon_high: Input should be greater than or equal to 0 (got -1)"),
    ("train.adam_betas=[0.9, 1.5]", "train.adam_betas.1: Input should be less than 1 (got 1.5)"),
    ("train.max_new_tokens=9", "train.max_new_tokens: unknown key 'max_new_tokens'"),
])
def test_a_bad_knob_is_one_problem_located_at_its_set(setting, message):
    with pytest.raises(ScenarioError) as caught:
        load_scenario("relay", [setting])
    (problem,) = caught.value.problems
    key = setting.partition("=")[0]
    assert str(problem).startswith(f"{problem.file}:0:0: {message}") and problem.file.endswith(f"(--set {key})")


def test_grpo_knobs_refuse_what_the_trainer_cannot_use():
    for bad in (dict(group_size=1), dict(lr=0), dict(top_p=1.5), dict(bucket_ema=0), dict(lr_schedule="step")):
        with pytest.raises(KnobError, match=f"GRPOConfig: {next(iter(bad))}="):
            GRPOConfig(**bad)


def test_split_override_reads_the_one_grammar():
    assert split_override("agents.0.name=x", "e.g.") == ("agents.0.name", ("agents", 0, "name"))
    for bad in ("lr", "a..b=1", "=1"):
        with pytest.raises(ValueError, match="expected KEY=VALUE, e.g. e.g."):
            split_override(bad, "e.g.")
