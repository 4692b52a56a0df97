"""`marl run --backend ray` end to end: the same metrics as the local backend, checkpoints that resume
on either backend, and one-line errors before any model is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ray")

from trainers.cli.main import main  # noqa: E402
from helpers.cli import one_error_line, run_marl  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a real cluster: seconds to start, minutes in all
SMALL = ["train.prompts_per_step=2", "train.group_size=3", "tasks.count=40", "tasks.eval_count=4",
         "train.warmup.rl_steps=0", "train.checkpoint_every=1", "credit.method=shapley",
         "train.ray.rollout_workers=2", "train.ray.num_cpus=0.5"]


def _args(*extra: str) -> list[str]:
    return [item for setting in (*SMALL, *extra) for item in ("--set", setting)]


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    # engine/*: the sampler/trainer logprob mismatch, float rounding that depends on how the sampler batched the
    # rows (workers batch episodes differently); the samples, rewards, credit and update are compared exactly
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "ray/", "engine/"))} for row in rows]


@pytest.fixture(scope="session")  # not module: the Ray tests are reordered (tests/conftest.py), this file's split
def local_three_steps(demo_model_dir, tmp_path_factory) -> Path:
    """A 3-step local run: what a run split across the backends must log (read by two tests, written once)."""
    local = tmp_path_factory.mktemp("local") / "run"
    assert main(["run", "relay", *_args("train.steps=3"), "--out", str(local), "--tracker", "none"]) == 0
    return local


def test_a_ray_run_logs_what_a_local_run_logs_and_resumes_on_the_local_backend(local_three_steps, tmp_path, capsys,
                                                                                 no_ray_session):
    local, remote = local_three_steps, tmp_path / "ray"
    assert main(["run", "relay", *_args("train.steps=2"), "--out", str(remote), "--tracker", "none",
                 "--backend", "ray"]) == 0
    assert "ray: started a local cluster" in capsys.readouterr().out
    raw = [json.loads(line) for line in (remote / "metrics.jsonl").read_text().splitlines()]
    assert all(row["ray/staleness_max"] == 0 for row in raw if "ray/staleness_max" in row)
    assert main(["run", "relay", *_args("train.steps=3"), "--out", str(remote), "--tracker", "none", "--resume"]) == 0
    assert _metrics(remote) == _metrics(local)  # 2 steps on Ray workers, the third here: the local run's figures
    assert json.loads((remote / "after.json").read_text()) == json.loads((local / "after.json").read_text())


def test_an_unreachable_cluster_is_one_line_before_any_model_is_built(tmp_path):
    out = tmp_path / "run"
    result = run_marl("run", "relay", "--backend", "ray", "--set", "train.ray.address=127.0.0.1:9",
                      "--out", str(out), "--cache-dir", str(tmp_path / "cache"), timeout=60)
    line = one_error_line(result)
    assert "train.ray.address: nothing answers at 127.0.0.1:9" in line and "ray start --head" in line
    assert not out.exists() and not (tmp_path / "cache").exists()  # nothing built, nothing written


def test_a_cluster_too_small_for_the_workers_is_one_line(tmp_path):
    result = run_marl("run", "relay", "--backend", "ray", "--set", "train.ray.rollout_workers=64",
                      "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), timeout=120)
    line = one_error_line(result)
    assert "64 rollout workers x 1 CPU need 64 CPU" in line and "lower train.ray.rollout_workers" in line


def test_lora_adapters_travel_to_the_workers_and_train_as_locally(demo_model_dir, tmp_path, ray_cluster):
    lora = ("train.steps=2", "train.lora.r=4", "train.stages=[main]")
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert main(["run", "relay", *_args(*lora), "--out", str(local), "--tracker", "none"]) == 0
    assert main(["run", "relay", *_args(*lora), "--out", str(remote), "--tracker", "none", "--backend", "ray"]) == 0
    assert _metrics(remote) == _metrics(local)
    raw = [json.loads(line) for line in (remote / "metrics.jsonl").read_text().splitlines()]
    assert [row["ray/staleness_max"] for row in raw if "ray/staleness_max" in row] == [0.0, 0.0]  # current adapter
    # what each step learnt (zero or not: that depends on what the tiny model samples on this CPU) is
    # the same on Ray as here, tensor for tensor
    assert _adapter_tensors(remote) == _adapter_tensors(local)


def _adapter_tensors(out: Path) -> dict:
    """path/name -> the tensor's bytes, over every safetensors file of the run's latest checkpoint."""
    from safetensors.torch import load_file

    from trainers.records.checkpoint import latest_checkpoint

    checkpoint = latest_checkpoint(out)
    files = sorted(checkpoint.rglob("*.safetensors"))
    assert files, f"no safetensors file in {checkpoint}"
    return {f"{path.relative_to(checkpoint)}/{name}": tensor.numpy().tobytes()
            for path in files for name, tensor in load_file(path).items()}


def test_ctrl_c_writes_a_checkpoint_and_stops_the_workers(demo_model_dir, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    def workers() -> set[str]:  # rollout worker processes on this machine
        return set(subprocess.run(["pgrep", "-f", "ray::RolloutWorker"], capture_output=True, text=True).stdout.split())

    already = workers()  # another job's, if any: not this run's to stop
    out = tmp_path / "run"
    command = [sys.executable, "-m", "trainers.cli.main", "run", "relay", *_args("train.steps=400"), "--out", str(out),
               "--tracker", "none", "--backend", "ray"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics = out / "metrics.jsonl"
    while process.poll() is None and (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
        time.sleep(0.2)  # waits for the event (two logged steps), not for a time
    assert process.poll() is None, process.communicate()[0][-3000:]
    mine = workers() - already  # the run's two rollout workers, playing its steps
    assert mine, "no rollout worker of the run was found while it played"
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "checkpoint written at step" in output and "Traceback" not in output
    assert (out / "checkpoints" / "latest").is_file()
    # the run's workers are gone (the raylet stops them as the run exits; a hang guard, not a timing)
    import psutil

    _, alive = psutil.wait_procs([psutil.Process(int(pid)) for pid in mine if psutil.pid_exists(int(pid))],
                                 timeout=120)
    assert alive == []


def test_endpoint_and_frozen_agents_play_on_the_workers_as_locally(demo_model_dir, ray_cluster):
    """left: a frozen own copy; right: an OpenAI-compatible endpoint (sent to the workers, its client
    rebuilt there); final: the shared trainable model. Two steps on Ray log what two local steps log."""
    from helpers.judge_server import JudgeServer
    from trainers.ray.cluster import shutdown
    from trainers.run import RunOptions, prepare

    def adder(body):
        a, b = body["messages"][-1]["content"].rstrip("=").split("+")
        return ("ok", str(int(a) + int(b)))

    results = {}
    with JudgeServer(default=adder) as server:
        for backend in ("local", "ray"):
            overrides = ["train.group_size=4", "train.prompts_per_step=2", "agents.0.policy=own",
                         "agents.0.trainable=false", "agents.1.policy=openai:adder", f"agents.1.base_url={server.url}",
                         "agents.1.api_key_env=null", f"train.backend={backend}", "train.ray.num_cpus=0.5"]
            _, _, _, trainer, _ = prepare(RunOptions("relay", overrides), log=lambda *_: None)
            try:
                rows = [trainer.step() for _ in range(2)]
            finally:
                if backend == "ray":
                    trainer.player.close()
                    shutdown(only_if_started_here=True)  # as a run does: the shared cluster stays up
            results[backend] = [{k: v for k, v in row.items() if not k.startswith(("time/", "ray/", "engine/"))}
                                for row in rows]  # engine/*: see _metrics
        assert server.requests == 2 * 2 * 8  # right speaks once in each of the 8 episodes of 2 steps, per backend
    assert results["ray"] == results["local"]


def test_a_local_checkpoint_resumes_on_the_ray_backend(local_three_steps, tmp_path, ray_cluster):
    straight, split = local_three_steps, tmp_path / "split"
    assert main(["run", "relay", *_args("train.steps=2"), "--out", str(split), "--tracker", "none"]) == 0
    assert main(["run", "relay", *_args("train.steps=3"), "--out", str(split), "--tracker", "none", "--resume",
                 "--backend", "ray"]) == 0
    assert _metrics(split) == _metrics(straight)
