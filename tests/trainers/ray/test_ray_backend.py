"""The Ray backend against the local one, on a real local Ray cluster (127.0.0.1, two workers).

With the same seed and max_staleness 0, a run played by Ray rollout workers gives the same per-step
rewards, losses and final weights as the one played in this process (sampling is keyed by episode,
turn, agent and position, never by call order). A worker killed by its PID is replaced and its
episodes are played again with the same keys: the step's result does not change.
"""

from __future__ import annotations

import math
import os
import signal

import pytest
import torch

pytest.importorskip("ray")

from marl.scenario.load import load_scenario  # noqa: E402
from trainers.grpo.config import GRPOConfig  # noqa: E402
from trainers.policy.actors import ModelActor  # noqa: E402
from trainers.config import resolve_config  # noqa: E402
from trainers.team.trainer import MultiAgentTrainer, StepPlan  # noqa: E402
from helpers.signal import by_seed  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a real cluster: seconds to start, minutes in all
RELAY = ["tasks.count=40", "tasks.eval_count=4", "credit.method=shapley"]
STEPS = 3


@pytest.fixture
def cluster(ray_cluster):
    """The Ray tests' one local cluster (tests/conftest.py: ray_cluster; loopback only, a small object store)."""
    return ray_cluster


def _trainer(micro_policy, backend: str, scenario="relay", overrides=RELAY, staleness=0):
    settings = [f"train.backend={backend}", "train.ray.rollout_workers=2", f"train.ray.max_staleness={staleness}",
                "train.ray.num_cpus=0.5", *overrides]  # the test's own overrides win
    spec = load_scenario(scenario, settings)
    model, tokenizer = micro_policy()
    actors = {"shared": ModelActor("shared", model, tokenizer, seed=0)}
    seats = {agent: "shared" for agent in spec.agent_names}
    config = GRPOConfig(steps=STEPS, prompts_per_step=2, group_size=3, max_new_tokens=4, lr=1e-2, seed=0,
                        floor_reward=0.0, diversity_penalty=0.0)
    return MultiAgentTrainer(spec, actors, seats, spec.split()[0], resolve_config(spec, grpo=config), log=lambda message: None)


def _run(trainer, steps=STEPS, reward_transform=None):
    losses, rewards = [], []
    for _ in range(steps):
        metrics = trainer.step(StepPlan(reward_transform=reward_transform))
        losses.append(metrics["policy/shared/loss"])
        rewards.append([[row[a] for a in sorted(row)] for row in trainer.last_step.rewards])
    texts = [[t.text for t in e.turns] for e in trainer.last_step.episodes]
    return losses, rewards, texts


def test_ray_steps_equal_local_steps_and_weights(cluster, micro_policy):
    local = _trainer(micro_policy, "local")
    remote = _trainer(micro_policy, "ray")
    try:
        # by_seed: every group has a reward spread whatever the micro model samples on this CPU, so there is
        # an update to compare (the samples themselves are compared, never asserted)
        local_losses, local_rewards, local_texts = _run(local, reward_transform=by_seed)
        ray_losses, ray_rewards, ray_texts = _run(remote, reward_transform=by_seed)
    finally:
        remote.player.close()
    assert ray_texts == local_texts
    assert ray_rewards == local_rewards
    assert ray_losses == pytest.approx(local_losses, rel=1e-5, abs=1e-7)
    initial, _ = micro_policy()  # something was trained on: the weights moved from where they started
    assert any(not torch.equal(a, b) for a, b in zip(initial.parameters(), local.actors["shared"].model.parameters()))
    for (name, a), (_, b) in zip(local.actors["shared"].model.named_parameters(),
                                 remote.actors["shared"].model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
    assert remote.player.version == STEPS - 1  # one version per update that was played with


def test_a_worker_killed_by_its_pid_mid_step_changes_nothing(cluster, micro_policy):
    local, remote = _trainer(micro_policy, "local"), _trainer(micro_policy, "ray")
    expected = _run(local, 2)
    play_parts, killed = remote.player._play_parts, []

    def kill_then_play(jobs, parts, greedy):  # after the step's broadcast, before its episodes come back
        if remote.step_count == 1 and not killed:
            killed.append(remote.player.pids[1])
            os.kill(remote.player.pids[1], signal.SIGKILL)
        return play_parts(jobs, parts, greedy)

    remote.player._play_parts = kill_then_play
    try:
        assert _run(remote, 2) == expected
        assert killed and remote.player.timing["retries"] >= 1
        assert remote.player.pids[1] != killed[0]  # a new worker took its place
    finally:
        remote.player.close()


def test_a_worker_that_keeps_dying_is_one_clear_error(cluster, micro_policy):
    from trainers.ray.cluster import RayBackendError

    # one worker: the one killed (a second would only add its start-up)
    remote = _trainer(micro_policy, "ray", overrides=[*RELAY, "train.ray.max_retries=0", "train.ray.rollout_workers=1"])
    play_parts = remote.player._play_parts

    def kill_then_play(jobs, parts, greedy):
        os.kill(remote.player.pids[0], signal.SIGKILL)
        return play_parts(jobs, parts, greedy)

    remote.player._play_parts = kill_then_play
    try:
        with pytest.raises(RayBackendError, match=r"rollout worker 0 \(pid \d+\) died during step 1 .*max_retries=0"):
            remote.step()
    finally:
        remote.player.close()


def test_staleness_one_plays_behind_and_logs_it_staleness_zero_refuses(cluster, micro_policy):
    from trainers.ray.player import StaleSampleError, check_staleness

    # one worker: the versions and what is held back are the player's, whatever the number of workers
    remote = _trainer(micro_policy, "ray", overrides=[*RELAY, "train.ray.rollout_workers=1"], staleness=1)
    try:
        lags = [(m["ray/offpolicy_samples"], m["ray/staleness_max"]) for m in (remote.step() for _ in range(3))]
    finally:
        remote.player.close()
    episodes = 2 * 3
    # step 1 plays version 0; step 2 is one update behind (held back); step 3 would be 2 behind: shipped
    assert lags == [(0, 0), (episodes, 1), (0, 0)]
    stale = remote.last_step.episodes[0]
    stale.policy_version = remote.player.version - 1
    with pytest.raises(StaleSampleError, match="max_staleness=0 allows 0"):
        check_staleness([stale], remote.player.version, 0)
    assert check_staleness([stale], remote.player.version, 1)["ray/offpolicy_samples"] == 1


def test_a_competitive_scenario_on_ray_equals_local(cluster, micro_policy, tmp_path):
    from helpers.scenario_files import race_yaml

    race = tmp_path / "race.yaml"
    race.write_text(race_yaml())
    local = _trainer(micro_policy, "local", scenario=race, overrides=[])
    remote = _trainer(micro_policy, "ray", scenario=race, overrides=[])
    try:
        assert _run(remote) == _run(local)
    finally:
        remote.player.close()


def test_too_few_resources_and_driver_only_code_are_one_line_each(cluster, micro_policy, tmp_path, monkeypatch):
    from trainers.ray.cluster import RayBackendError

    with pytest.raises(RayBackendError, match=r"8 rollout workers x 1 CPU need 8 CPU, the cluster has \d+"):
        _trainer(micro_policy, "ray", overrides=[*RELAY, "train.ray.rollout_workers=8", "train.ray.num_cpus=1"])
    (tmp_path / "driver_only_module.py").write_text("def stand_in(agent, observation, task):\n    return ''\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # importable here, not in the workers
    with pytest.raises(RayBackendError, match=r"rollout worker 0 cannot load the scenario.s code: driver_only_module:stand_in: .*import"):
        _trainer(micro_policy, "ray", overrides=[*RELAY, "credit.absent=default_policy",
                                                 "credit.default_policy=driver_only_module:stand_in"])


def test_a_judge_rate_limit_and_concurrency_hold_across_two_workers(cluster, micro_policy, tmp_path):
    """Two workers score episodes with one judge endpoint at 10 requests/s and 2 in flight: the server
    sees those limits for the cluster as a whole (per-worker limits would let twice through)."""
    import shutil
    import threading
    import time

    from helpers.judge_server import JudgeServer, write_judged_relay
    from helpers.paths import SCENARIOS
    from marl.rollout import EpisodeJob
    from trainers.ray.gates import gate_name
    import ray

    shutil.copy(SCENARIOS / "relay_lib.py", tmp_path / "relay_lib.py")
    sent, lock, rate = [], threading.Lock(), 10.0

    def record(body):
        with lock:
            sent.append(time.monotonic())
        return ("ok", "Rating: [[8]]")

    with JudgeServer(default=record, latency_s=0.05) as server:
        path = write_judged_relay(SCENARIOS, server.url, tmp_path)
        trainer = _trainer(micro_policy, "ray", scenario=path,
                           overrides=["tasks.count=40", "tasks.eval_count=4", f"judges.0.requests_per_second={rate}",
                                      "judges.0.concurrency=2"])
        try:
            tasks = trainer.scenario.split()[0][:12]
            episodes = trainer.player.play([EpisodeJob(task, index) for index, task in enumerate(tasks)]).episodes
            gate = ray.get_actor(gate_name(f"openai:judge@{server.url.rstrip('/')}"))
            granted = ray.get(gate.stats.remote())
        finally:
            trainer.player.close()
        in_flight = server.max_in_flight
    assert len(episodes) == 12 and all(not math.isnan(e.team_reward()) for e in episodes)  # judged, none failed
    count, span = len(sent), max(sent) - min(sent)
    assert count >= 12 and granted["granted"] == count  # every request went through the one gate
    assert granted["max_in_flight"] <= 2
    assert span >= 0.8 * (count - 1) / rate, (count, span)  # one bucket (arrival jitter aside); per worker: 0.5x
    assert in_flight <= 2
