"""One config path: every GRPO knob set by name from a scenario's `train` section (or the demo's
`grpo.*`) reaches the GRPOConfig the trainer runs with; a bad value is one located line, exit 2."""

from __future__ import annotations


import pytest

from helpers.inprocess import marl_in_process
from marl.scenario.load import find_scenario, load_scenario
from marl.scenario.spec import DERIVED_KNOBS, TrainKnobs
from trainers.config import grpo_config, resolve_config
from trainers.demo import demo_options
from trainers.grpo.config import GRPOConfig, KnobError
from trainers.run import RunOptions

# a valid value other than the default for every knob the train section sets: (YAML for --set, expected)
NOT_DEFAULT = {
    "prompts_per_step": ("3", 3), "group_size": ("4", 4), "temperature": ("0.7", 0.7), "top_p": ("0.9", 0.9),
    "lr": ("1.0e-4", 1e-4), "lr_schedule": ("cosine", "cosine"), "warmup_steps": ("2", 2),
    "weight_decay": ("0.01", 0.01), "adam_betas": ("[0.8, 0.99]", (0.8, 0.99)), "adam_eps": ("1.0e-6", 1e-6),
    "max_grad_norm": ("0.5", 0.5), "loss_type": ("grpo", "grpo"), "scale_rewards": ("batch", "batch"),
    "beta": ("0.04", 0.04), "ref_update_every": ("5", 5), "epsilon_low": ("0.1", 0.1), "epsilon_high": ("0.28", 0.28), "mu": ("2", 2),
    "tis_cap": ("3.0", 3.0),
    "spike_factor": ("5.0", 5.0), "spike_window": ("7", 7), "spike_on_loss": ("true", True),
    "floor_reward": ("0.0", 0.0), "diversity_threshold": ("0.7", 0.7), "diversity_penalty": ("0.1", 0.1),
    "collapse_threshold": ("0.95", 0.95), "buckets": ("2", 2), "bucket_ema": ("0.2", 0.2), "seed": ("5", 5),
    "threads": ("2", 2), "device": ("cpu", "cpu"), "dtype": ("float32", "float32"),
    "gradient_checkpointing": ("true", True), "max_tokens_per_microbatch": ("512", 512),
    "attention": ("eager", "eager"), "packing": ("per_row", "per_row"),
}
SETS = [f"train.{name}={raw}" for name, (raw, _) in NOT_DEFAULT.items()]


def test_the_table_covers_every_grpo_config_field_but_the_derived_ones():
    fields = set(GRPOConfig.model_fields)
    assert set(NOT_DEFAULT) == fields - set(DERIVED_KNOBS) == set(TrainKnobs.model_fields)
    assert all(GRPOConfig.model_fields[name].default != expected for name, (_, expected) in NOT_DEFAULT.items())


def test_every_knob_set_by_name_reaches_the_runs_grpo_config():
    config = grpo_config(load_scenario("relay", SETS))
    assert {name: getattr(config, name) for name in NOT_DEFAULT} == {k: v for k, (_, v) in NOT_DEFAULT.items()}


def test_marl_validate_accepts_every_knob_by_name():
    result = marl_in_process("validate", "relay", *[arg for item in SETS for arg in ("--set", item)])
    assert result.returncode == 0 and "relay: ok" in result.stdout, result.stderr


def test_the_derived_knobs_come_from_the_stages_and_the_agents():
    scenario = load_scenario("relay", ["train.steps=7", "train.stages=[main, reflection]", "train.reflection.steps=3",
                                       "agents.1.max_tokens=11"])
    config = grpo_config(scenario)
    assert (config.steps, config.max_new_tokens) == (10, 11)


def test_the_relay_runs_config_is_what_the_hand_copy_gave():
    """Before one config path, trainers.run copied 16 fields by hand; the rest kept GRPOConfig's defaults."""
    scenario = load_scenario("relay")
    train = scenario.spec.train
    copied = {name: getattr(train, name) for name in (
        "prompts_per_step", "group_size", "temperature", "top_p", "lr", "beta", "loss_type", "scale_rewards", "mu",
        "buckets", "floor_reward", "diversity_penalty", "seed", "threads")}
    assert grpo_config(scenario) == GRPOConfig(steps=203, max_new_tokens=4, **copied)


@pytest.mark.parametrize("setting,message", [
    ("train.loss_type=foo", "train.loss_type: Input should be 'dapo', 'grpo', 'dr_grpo' or 'bnpo' (got 'foo')"),
    ("train.epsilon_high=-1", "train.epsilon_high: Input should be greater than or equal to 0 (got -1)"),
])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_bad_knob_is_one_located_line_and_exit_2(command, setting, message, tmp_path):
    extra = ["--out", str(tmp_path / "run")] if command == "run" else []
    result = marl_in_process(command, "relay", "--set", setting, *extra)
    key = setting.partition("=")[0]
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"{find_scenario('relay')} (--set {key}):0:0: {message}"
    assert not (tmp_path / "run").exists()


def test_the_demos_flags_are_sets_of_the_addition_scenario_and_an_explicit_set_wins():
    options = demo_options(["train.seed=9", "train.lr=1e-4"], steps=3, seed=1, out="runs/x")
    assert (options.scenario, options.out) == ("addition", "runs/x")
    train = load_scenario(options.scenario, options.overrides).spec.train
    assert (train.steps, train.seed, train.lr) == (3, 9, 1e-4)  # --set comes after the flags
    default = resolve_config(load_scenario("addition", demo_options().overrides))
    assert default.grpo.steps == 200 and default.stages.names == ("main",) and default.selfplay is None


@pytest.mark.parametrize("args,message", [
    (["--set", "train.loss_type=foo"], "(--set train.loss_type):0:0: train.loss_type: Input should be 'dapo', "
                                        "'grpo', 'dr_grpo' or 'bnpo' (got 'foo')"),
    (["--threads", "0"], "(--set train.threads):0:0: train.threads: Input should be greater than or equal to 1"),
    (["--steps", "0"], "(--set train.steps):0:0: train.steps: Input should be greater than or equal to 1"),
])
def test_a_bad_demo_setting_is_one_line_before_anything_is_written(args, message, tmp_path):
    result = marl_in_process("demo", *args, "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith(f"{find_scenario('addition')} {message}")
    assert not (tmp_path / "run").exists()


def test_grpo_config_checks_its_knobs_against_the_one_schema():
    with pytest.raises(KnobError) as caught:
        GRPOConfig(epsilon_low=2.0)
    assert caught.value.knob == "epsilon_low" and "less than or equal to 1" in str(caught.value)


def test_epsilon_high_reaches_the_loss_of_a_marl_run(demo_model_dir, monkeypatch):
    """`--set train.epsilon_high=0.28` validates, and the run's trainer clips with it in every update."""
    import trainers.grpo.objective as objective
    from trainers.run import prepare

    assert marl_in_process("validate", "relay", "--set", "train.epsilon_high=0.28").returncode == 0
    seen, policy_loss = [], objective.policy_loss

    def recording(*args, **kwargs):
        seen.append(kwargs["epsilon_high"])
        return policy_loss(*args, **kwargs)

    monkeypatch.setattr(objective, "policy_loss", recording)
    options = RunOptions("relay", ["train.epsilon_high=0.28", "train.prompts_per_step=2", "train.group_size=4",
                                   "tasks.count=60", "tasks.eval_count=8", "train.stages=[main]"])
    _, _, _, trainer, _ = prepare(options, log=lambda message: None)
    assert trainer.grpo.epsilon_high == 0.28
    assert {learner.config.epsilon_high for learner in trainer.learners.values()} == {0.28}
    trainer.step()
    assert seen and set(seen) == {0.28}
