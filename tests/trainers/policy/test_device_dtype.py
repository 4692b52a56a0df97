"""Device and dtype (issue 12, item 3): resolution, the bad-input lines, loading in a dtype, float32
logprobs from low-precision weights, and every tensor of a step on the model's device.

What runs everywhere is on the CPU (bfloat16 weights included); the CUDA tests run where torch sees a
CUDA device and are skipped elsewhere.
"""

from __future__ import annotations

import pytest
import torch

from trainers.policy.loading import (PlacementError, compute_dtype, load_policy, model_device, place_actors,
                                     placement, resolve_device, resolve_dtype)
from trainers.policy.generation import Completions, completion_logprobs, encode_prompts, sample_completions

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
without_cuda = pytest.mark.skipif(CUDA, reason="checks the message of a machine without CUDA")
PROMPTS = ["Task: 12+35=", "You are the solver. 3*4=", "9="]


def _sample(model, tokenizer, *, seed=0, generator=None, **options):
    ids, mask = encode_prompts(tokenizer, PROMPTS)
    generator = generator or torch.Generator(device=model_device(model)).manual_seed(seed)
    return sample_completions(model, ids, mask, group_size=2, max_new_tokens=5, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, generator=generator, **options)


# -- resolution and the bad-input lines ----------------------------------------------------------------


def test_auto_picks_the_best_device_there_is_and_cpu_is_always_there():
    assert resolve_device("cpu") == "cpu"
    expected = "cuda" if CUDA else "mps" if torch.backends.mps.is_available() else "cpu"
    assert resolve_device("auto") == expected


def test_auto_dtype_is_float32_on_the_cpu_and_named_dtypes_are_kept():
    assert resolve_dtype("auto", "cpu") is torch.float32
    assert resolve_dtype("float32", "cpu") is torch.float32
    assert resolve_dtype("bfloat16", "cpu") is torch.bfloat16
    assert placement("cpu", "auto") == ("cpu", torch.float32)


@without_cuda
def test_a_missing_cuda_device_is_one_line_naming_the_fix():
    with pytest.raises(PlacementError) as error:
        resolve_device("cuda")
    assert str(error.value) == "train.device=cuda but torch sees no CUDA device; use cpu or auto"


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the message of a machine without MPS")
def test_a_missing_mps_device_is_one_line():
    with pytest.raises(PlacementError, match=r"^train.device=mps but torch sees no MPS .*; use cpu or auto$"):
        resolve_device("mps")


@pytest.mark.parametrize("call, message", [
    (lambda: resolve_dtype("float16", "cpu"), "train.dtype=float16 cannot train on the cpu"),
    (lambda: resolve_dtype("float64", "cpu"), "train.dtype='float64' is not one of auto, float32, bfloat16, float16"),
    (lambda: resolve_device("tpu"), "train.device='tpu' is not one of auto, cpu, cuda, mps"),
])
def test_a_dtype_or_device_the_machine_cannot_do_is_one_line(call, message):
    with pytest.raises(PlacementError) as error:
        call()
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert isinstance(error.value, ValueError) and isinstance(error.value, RuntimeError)  # both CLI error paths


def test_bfloat16_on_a_gpu_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    with pytest.raises(PlacementError, match="^train.dtype=bfloat16 but this cuda device has no bfloat16 support; "
                                             "use float16 or float32$"):
        resolve_dtype("bfloat16", "cuda")
    assert resolve_dtype("auto", "cuda") is torch.float32  # auto falls back instead


@without_cuda
def test_marl_run_with_a_missing_device_exits_2_before_any_model(capsys):
    from trainers.cli.main import main

    assert main(["run", "relay", "--set", "train.device=cuda", "--set", "train.steps=1"]) == 2
    err = capsys.readouterr().err
    assert "train.device=cuda but torch sees no CUDA device; use cpu or auto" in err and "Traceback" not in err


def test_marl_run_and_demo_refuse_float16_on_the_cpu_with_exit_2(capsys, tmp_path):
    from trainers.cli.main import main

    assert main(["run", "relay", "--set", "train.device=cpu", "--set", "train.dtype=float16",
                 "--out", str(tmp_path / "run")]) == 2
    assert "train.dtype=float16 cannot train on the cpu" in capsys.readouterr().err
    assert main(["demo", "--set", "train.device=cpu", "--set", "train.dtype=float16", "--out", str(tmp_path / "d")]) == 2
    assert ("train.dtype=float16 cannot train on the cpu (no half-precision kernels or loss scaling there); use "
            "float32 or bfloat16, or train.device=cuda") in capsys.readouterr().err  # marl run's, as the demo is it
    assert not (tmp_path / "d").exists() and not (tmp_path / "run").exists()  # refused before anything was made


# -- loading in a dtype; float32 logprobs and a finite loss from bfloat16 weights ----------------------------


def test_tinylm_still_exports_load_policy():
    from trainers.policy import loading, tinylm

    assert tinylm.load_policy is loading.load_policy


@pytest.mark.parametrize("architecture", ["qwen2", "llama", "gpt2"])
def test_bfloat16_weights_give_float32_logprobs_and_a_finite_loss(real_model_dirs, architecture):
    from trainers.grpo.config import GRPOConfig
    from trainers.grpo.learner import PolicyLearner

    model, tokenizer = load_policy(real_model_dirs[architecture], dtype="bfloat16")
    assert compute_dtype(model) is torch.bfloat16 and model_device(model) == torch.device("cpu")
    completions = _sample(model, tokenizer)
    assert completions.logprobs.dtype is torch.float32 and torch.isfinite(completions.logprobs).all()
    logprobs = completion_logprobs(model, completions)
    assert logprobs.dtype is torch.float32 and torch.isfinite(logprobs).all()
    learner = PolicyLearner(model, GRPOConfig(beta=0.04, mu=2, lr=1e-4, max_new_tokens=5))
    advantages = torch.tensor([1.0, -1.0] * 3)
    update = learner.update(completions, advantages)
    assert torch.isfinite(torch.tensor(update["loss"])) and update["grad_norm"] > 0
    assert all(p.dtype is torch.bfloat16 for p in model.parameters())


def test_place_actors_casts_models_and_keeps_cpu_generators(micro_policy):
    from trainers.policy.actors import ModelActor

    model, tokenizer = micro_policy()
    actor = ModelActor("shared", model, tokenizer, seed=7)
    generator = actor.generator
    place_actors({"shared": actor}, "cpu", torch.float32)  # already there: nothing changes
    assert actor.generator is generator and compute_dtype(model) is torch.float32
    place_actors({"shared": actor}, "cpu", "bfloat16")
    assert compute_dtype(actor.model) is torch.bfloat16 and actor.generator is generator


# -- every tensor where the model is ------------------------------------------------------------------


def _devices(completions: Completions) -> set[torch.device]:
    return {getattr(completions, name).device for name in Completions.__dataclass_fields__
            if getattr(completions, name) is not None}  # prompt_cut: only where an actor fitted the prompts


def test_every_tensor_of_a_sampled_batch_is_on_the_models_device(micro_policy):
    model, tokenizer = micro_policy()
    completions = _sample(model, tokenizer)
    assert _devices(completions) == {model_device(model)}
    assert completion_logprobs(model, completions).device == model_device(model)


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_cuda_model_samples_and_trains_on_cuda(real_model_dirs, dtype):
    from trainers.grpo.config import GRPOConfig
    from trainers.grpo.learner import PolicyLearner

    model, tokenizer = load_policy(real_model_dirs["qwen2"], device="cuda", dtype=dtype)
    completions = _sample(model, tokenizer)
    assert {d.type for d in _devices(completions)} == {"cuda"}
    learner = PolicyLearner(model, GRPOConfig(beta=0.04, lr=1e-4, max_new_tokens=5, max_tokens_per_microbatch=16))
    update = learner.update(completions, torch.tensor([1.0, -1.0] * 3))
    assert torch.isfinite(torch.tensor(update["loss"]))


@needs_cuda
def test_a_cuda_run_samples_the_same_tokens_from_the_same_seed(real_model_dirs):
    model, tokenizer = load_policy(real_model_dirs["qwen2"], device="cuda")
    first, again = _sample(model, tokenizer, seed=3), _sample(model, tokenizer, seed=3)
    assert torch.equal(first.completion_ids, again.completion_ids)


@needs_cuda
def test_the_addition_trainer_on_a_cuda_model_samples_and_trains_there(micro_policy):
    from marl.scenario.load import load_scenario
    from trainers.config import resolve_config
    from trainers.grpo.config import GRPOConfig
    from trainers.policy.actors import ModelActor
    from trainers.team.trainer import MultiAgentTrainer, StepPlan
    from helpers.signal import by_seed

    spec = load_scenario("addition")
    model, tokenizer = micro_policy()
    model.to("cuda")
    actors = {"shared": ModelActor("shared", model, tokenizer, trainable=True, seed=0)}
    config = resolve_config(spec, grpo=GRPOConfig(prompts_per_step=2, group_size=2, max_new_tokens=3))
    trainer = MultiAgentTrainer(spec, actors, {"solver": "shared"}, spec.split()[0], config, log=lambda message: None)
    assert actors["shared"].generator.device.type == "cuda"
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    metrics = trainer.step(StepPlan(reward_transform=by_seed))  # a spread: the step updates
    assert metrics["train/step"] == 1 and metrics["policy/shared/trained_rows"] > 0
    sampled = trainer.last_step.batch.generations["shared"][0]
    assert {sampled.completion_ids.device.type, sampled.logprobs.device.type} == {"cuda"}
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    assert {p.device.type for p in model.parameters()} == {"cuda"}
