"""A rollout worker: a Ray actor that holds copies of a run's actors and plays episodes.

The driver (trainers.ray.player.RayPlayer) sends it, once, the scenario and every actor (models with
their tokenizers, scripted and frozen policies), then after each change only the parameters that
changed, tagged with a policy version. `play(jobs)` runs the one episode engine (marl.rollout) on
the worker's copies and returns the episodes with the version they were sampled at. Payloads travel
as cloudpickle bytes through Ray's object store and are opened here, inside a try, so a module that
exists only on the driver is one clear line, not a worker crash.
"""

from __future__ import annotations

import os
import traceback

import cloudpickle
from marl.rollout import EpisodePlayer
from trainers.policy.actors import ModelActor
from trainers.ray import gates


class RolloutWorker:
    """Plays jobs with copies of the driver's actors (made a Ray actor by the player)."""

    def __init__(self, threads: int = 1):
        import torch

        torch.set_num_threads(max(1, threads))
        # the device Ray gave this worker: a GPU when it asked for one (CUDA_VISIBLE_DEVICES is set to it)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.scenario, self.player, self.version = None, None, -1
        self.actors: dict = {}
        self.seats: dict = {}

    def pid(self) -> int:
        """This worker's process id (tests kill it by PID)."""
        return os.getpid()

    def setup(self, scenario_bytes: bytes, seats: dict, max_tokens: dict, ledger: str | None = None) -> str | None:
        """Open the scenario and check that every 'module:function' it names imports here; an error
        line (None when ready). `ledger`: the name of the driver's judge ledger actor (the judge cache)."""
        try:
            import ray

            gates.install(ray)  # this worker's judges share the driver's per-endpoint limits
            gates.join_ledger(ray, ledger)  # and its judge cache: no file of its own
            self.scenario = cloudpickle.loads(scenario_bytes)
            self.seats = dict(seats)
            self.max_tokens = dict(max_tokens)
            problem = _unresolvable(self.scenario)
        except Exception as error:  # a module only the driver has, a broken pickle: reported, never raised
            return _one_line(error)
        return problem

    def sync(self, payload: bytes, version: int) -> str | None:
        """Apply a payload (new actors and changed parameters) and take `version`; an error line or None."""
        import torch

        try:
            update = cloudpickle.loads(payload)
            for name, actor in update["actors"].items():
                self.actors[name] = _opened(name, actor, self.device)
            with torch.no_grad():
                for name, params in update["params"].items():
                    own = dict(self.actors[name].model.named_parameters())
                    for key, value in params.items():
                        own[key].copy_(value)
        except Exception as error:  # a module only the driver has, weights on a device this node lacks...
            return _one_line(error)
        for name in update.get("dropped", ()):
            self.actors.pop(name, None)
        self.version = version  # the player reads self.actors, updated in place: it (and its judges) stays
        return None

    def play(self, jobs: list, greedy: bool):
        """Play the jobs; (EpisodeBatch, the version played at) or (None, an error line)."""
        try:
            if self.player is None:
                self.player = EpisodePlayer(self.scenario, self.actors, self.seats, max_tokens=self.max_tokens)
            batch = self.player.play(jobs, greedy=greedy)
        except Exception as error:
            return None, f"{_one_line(error)}\n{traceback.format_exc(limit=-3)}"
        for episode in batch.episodes:
            episode.policy_version = self.version
        return batch, self.version


def _opened(name: str, actor, device: str = "cpu"):
    """An actor of the payload as the worker uses it: a model actor is rebuilt around its model, on the
    worker's device (models travel on the CPU)."""
    kind = actor[0]
    if kind == "model":
        _, model, tokenizer, options = actor
        return ModelActor(name, model.to(device), tokenizer, **options)
    return actor[1]


def _unresolvable(scenario) -> str | None:
    """The first 'module:function' of the scenario that does not import on this worker, as a line."""
    spec = scenario.spec
    references = [spec.expert, spec.credit.default_policy, spec.referee, spec.evaluation,
                  *(agent.policy for agent in spec.agents if ":" in agent.policy and not agent.policy.startswith("openai:"))]
    for reference in references:
        if reference and ":" in reference:
            try:
                scenario.resolve(reference)
            except Exception as error:
                return f"{reference}: {_one_line(error)}"
    return None


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:300]
