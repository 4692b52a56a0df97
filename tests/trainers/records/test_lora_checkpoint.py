"""LoRA checkpoints: adapters only, exact resume, `marl eval` on them, `marl export --merge`, and an
adapter for another base refused in one line. Relay with the micro model (instant, untrained) as base."""

from __future__ import annotations

import json

import pytest
import torch

from marl.scenario.load import load_scenario
from trainers.grpo.config import GRPOConfig
from trainers.policy.actors import build_actors
from trainers.records.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from trainers.config import resolve_config
from trainers.team.trainer import MultiAgentTrainer, StepPlan

RELAY = ["tasks.count=40", "tasks.eval_count=4", "credit.absent=null_message", "train.threads=1",
         "train.lora.r=4", "agents.0.policy=own", "agents.1.policy=own"]


@pytest.fixture
def bases(micro_policy, tmp_path):
    """Two saved micro models (seeds 0 and 1): the base, and another base of the same shape."""
    directories = []
    for seed in (0, 1):
        model, tokenizer = micro_policy(seed)
        directory = tmp_path / f"base-{seed}"
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        directories.append(directory)
    return directories


def _scenario(base_dir):
    return load_scenario("relay", RELAY + [f"train.model={base_dir}"])


def _trainer(base_dir):
    scenario = _scenario(base_dir)
    actors, seats = build_actors(scenario, base_dir, seed=0, lora=scenario.spec.train.lora)
    config = GRPOConfig(steps=4, prompts_per_step=2, group_size=2, max_new_tokens=4, lr=5e-2, beta=0.04, seed=0,
                        floor_reward=0.0, diversity_penalty=0.0)
    return MultiAgentTrainer(scenario, actors, seats, scenario.split()[0], resolve_config(scenario, grpo=config), log=lambda message: None)


def _step(trainer) -> dict:
    metrics = trainer.step(StepPlan(reward_transform=lambda episode, agent, reward: reward + episode.job.seed % 2))
    return {k: v for k, v in metrics.items() if not k.startswith("time/")}


def _adapter_weights(trainer) -> dict:
    return {name: {k: v.clone() for k, v in learner.model.state_dict().items()}
            for name, learner in trainer.learners.items()}


def test_a_lora_checkpoint_holds_adapters_only_and_resumes_exactly(bases, tmp_path):
    straight = _trainer(bases[0])
    history = [_step(straight) for _ in range(4)]
    first = _trainer(bases[0])
    _step(first), _step(first)
    checkpoint = save_checkpoint(first, tmp_path / "run")
    for name in ("model", "model-left", "model-right"):
        files = {p.name for p in (checkpoint / name).iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors", "marl_base.json"} <= files
        assert "config.json" not in files and "model.safetensors" not in files  # no full model anywhere
        recorded = json.loads((checkpoint / name / "marl_base.json").read_text())
        assert recorded["base_model_dir"] == str(bases[0].resolve())
        config = json.loads((checkpoint / name / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(bases[0].resolve()) and config["r"] == 4
    state = torch.load(checkpoint / "state.pt", weights_only=True)
    for learner in state["learners"].values():  # adapter weights (and their optimizer moments), no model copies
        assert learner["model"] and all("lora_" in key for key in learner["model"]) and learner["reference"] == {}

    resumed = _trainer(bases[0])
    load_checkpoint(resumed, latest_checkpoint(tmp_path / "run"))
    assert [_step(resumed) for _ in range(2)] == history[2:]
    for name, weights in _adapter_weights(straight).items():
        assert all(torch.equal(v, resumed.learners[name].model.state_dict()[k]) for k, v in weights.items())


def test_resuming_on_another_base_is_refused_naming_both(bases, tmp_path):
    trainer = _trainer(bases[0])
    _step(trainer)
    save_checkpoint(trainer, tmp_path / "run")
    other = _trainer(bases[1])
    with pytest.raises(CheckpointError, match=f"trained on base {bases[0].resolve()}.*not on {bases[1].resolve()}"):
        load_checkpoint(other, latest_checkpoint(tmp_path / "run"))


def test_an_adapter_checkpoint_evaluates_as_the_trained_team(bases, tmp_path):
    from trainers.checkpoint_eval import evaluate_checkpoint, load_actors
    from trainers.team.evaluation import evaluate_team

    trainer = _trainer(bases[0])
    _step(trainer), _step(trainer)
    checkpoint = save_checkpoint(trainer, tmp_path / "run")
    scenario = _scenario(bases[0])
    _, tasks = scenario.split()
    actors, _ = load_actors(scenario, checkpoint, None, log=lambda message: None)
    for name in ("shared", "left", "right"):
        assert actors[name].model.owner is actors["shared"].model.owner  # one base again
        saved, loaded = trainer.actors[name].model.state_dict(), actors[name].model.state_dict()
        assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    result = evaluate_checkpoint(scenario, tasks, checkpoint, None, credit=False)
    from marl.rollout import EpisodePlayer

    expected = evaluate_scenario_of(EpisodePlayer(scenario, trainer.actors, trainer.seats), tasks)
    assert result["metrics"] == expected["metrics"]
    assert evaluate_team(trainer.player, tasks)  # the trained team itself still plays


def evaluate_scenario_of(player, tasks):
    from trainers.team.evaluation import evaluate_scenario

    return evaluate_scenario(player, tasks, credit=False)


def test_marl_eval_with_another_base_is_one_line_and_exit_2(bases, tmp_path, capsys):
    from trainers.cli.main import main

    trainer = _trainer(bases[0])
    _step(trainer)
    checkpoint = save_checkpoint(trainer, tmp_path / "run")
    overrides = [item for option in RELAY + [f"train.model={bases[1]}"] for item in ("--set", option)]
    status = main(["eval", "relay", "--checkpoint", str(checkpoint), "--tasks", "2", "--no-credit", *overrides])
    error = capsys.readouterr().err.strip()
    assert status == 2 and len(error.splitlines()) == 1
    assert str(bases[0].resolve()) in error and str(bases[1].resolve()) in error


def test_export_merge_writes_a_standalone_model_equal_to_the_adapter(bases, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from trainers.cli.main import main
    from trainers.policy.adapters import load_adapter_dir

    trainer = _trainer(bases[0])
    _step(trainer), _step(trainer)
    save_checkpoint(trainer, tmp_path / "run")
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "merged"), "--merge"]) == 0
    assert {p.name for p in (tmp_path / "merged").iterdir()} == {"model", "model-left", "model-right"}
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / "model-left")  # plain transformers
    adapter, tokenizer = load_adapter_dir(latest_checkpoint(tmp_path / "run") / "model-left")
    ids = torch.tensor([tokenizer("12+35=")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, adapter(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "as-saved")]) == 0
    assert (tmp_path / "as-saved" / "model" / "adapter_config.json").is_file()
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "x"), "--merge",
                 "--base", str(bases[1])]) == 2
    assert "not on" in capsys.readouterr().err
    # --base without --merge would be ignored (a copied adapter keeps its own base): refused, nothing written
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "y"), "--base", str(bases[1])]) == 2
    assert "only --merge uses a base" in capsys.readouterr().err and not (tmp_path / "y").exists()


def test_marl_rollout_plays_an_adapter_directory(bases, tmp_path, capsys):
    from trainers.cli.main import main

    checkpoint = save_checkpoint(_trainer(bases[0]), tmp_path / "run")
    overrides = [item for option in RELAY for item in ("--set", option)]
    assert main(["rollout", "relay", "--policy", str(checkpoint / "model-left"), "--episodes", "1", "--quiet",
                 *overrides]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 1
    # --base names the base explicitly (the one it was trained on plays; another is refused in one line)
    assert main(["rollout", "relay", "--policy", str(checkpoint / "model-left"), "--base", str(bases[0]),
                 "--episodes", "1", "--quiet", *overrides]) == 0
    capsys.readouterr()
    assert main(["rollout", "relay", "--policy", str(checkpoint / "model-left"), "--base", str(bases[1]),
                 "--episodes", "1", "--quiet", *overrides]) == 2
    assert "--base DIR for marl serve, export and rollout" in capsys.readouterr().err
    assert main(["rollout", "relay", "--policy", "expert", "--base", str(bases[0]), "--episodes", "1"]) == 2
    assert "only for --policy ADAPTER_DIR" in capsys.readouterr().err


def test_serving_an_adapter_serves_it_merged(bases, tmp_path):
    from trainers.cli.serve import servable_dir

    trainer = _trainer(bases[0])
    checkpoint = save_checkpoint(trainer, tmp_path / "run")
    served = servable_dir(str(checkpoint / "model"), None, tmp_path / "scratch")
    assert (tmp_path / "scratch" / "merged" / "config.json").is_file() and served.endswith("merged")
    assert servable_dir(str(bases[0]), None, tmp_path / "scratch") == str(bases[0])  # a full model: itself


@pytest.mark.slow  # a fresh interpreter serving a merged adapter
def test_a_sigtermed_serve_of_an_adapter_removes_its_merged_copy(bases, tmp_path):
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    checkpoint = save_checkpoint(_trainer(bases[0]), tmp_path / "run")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "trainers.cli.main", "serve", str(checkpoint / "model-left"),
                                "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "TMPDIR": str(scratch)})
    import urllib.request

    ready = False
    while process.poll() is None and not ready:  # until it answers or exits, not for a time
        with socket.socket() as client:  # a bare probe (connect, close) must not upset the server either
            client.connect_ex(("127.0.0.1", port))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
                ready = response.status == 200
        except OSError:
            time.sleep(0.2)
    assert ready and process.poll() is None, process.communicate()[0]
    def merged():  # marl's merged copies in TMPDIR (torch may keep its own caches there, e.g. torchinductor_root)
        return [p.name for p in scratch.iterdir() if p.name.startswith("marl-serve-")]

    assert len(merged()) == 1  # the merge is being served
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM and "Traceback" not in output
    assert merged() == []  # the merged copy is gone
