"""RayPlayer: the driver's EpisodePlayer on Ray rollout workers (`train.backend: ray`).

`play(jobs)` splits the jobs over the workers (the jobs that share a replay memo, or a task, stay on
one worker, so common random numbers and shared prompts hold), plays them there with copies of the
driver's actors and merges the episodes back in the jobs' order, as `EpisodePlayer.play` returns
them. Everything else (scorer, visibility, actors...) is the local player's: the learner, the
evaluation's exact probabilities and the credit estimators stay on the driver.

Weights: before a play, every trainable actor whose parameters changed since they were last shipped
(a fingerprint per tensor: `_parameter_versions`) bumps the policy version; the changed tensors go to
every worker in one object-store payload. With `max_staleness: k` the trainable actors' changes are
held back until the workers lag by more than k versions (frozen opponents and evaluations always get
the current weights), and every episode records the version it was sampled at.

Model judges and endpoint policies share one concurrency cap and rate limit per endpoint across the
driver and the workers (trainers/ray/gates.py).

A worker that is lost (its process, its node or its objects: `lost_worker_errors`) is replaced by a
new one holding the current actors, and its jobs are played again with the same keys, at most
`max_retries` times per step; then a RayBackendError names the worker, its PID and what was being
played. At max_staleness 0 a replay changes nothing; at k > 0 the new worker holds the current
weights and its episodes record that version. A worker that cannot be scheduled within
START_TIMEOUT_S (a busy cluster, or no node large enough) and an error raised inside a worker's task
are one RayBackendError line each, never a hang or a traceback.
"""

from __future__ import annotations

import os
import time

import cloudpickle

from marl.rollout import EpisodeBatch, EpisodePlayer
from trainers.policy.actors import ModelActor
from trainers.ray import gates
from trainers.ray.cluster import RayBackendError, check_resources, connect
from trainers.ray.worker import RolloutWorker

START_TIMEOUT_S = 300.0  # a new worker not scheduled and set up by then cannot be (the cluster has no room)


def lost_worker_errors(ray) -> tuple[type[BaseException], ...]:
    """The Ray errors that mean a worker (or what it held) is gone, not that its code failed: the actor
    or its process died, its node died or ran out of memory, or an object it returned was lost."""
    names = ("RayActorError", "WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "ObjectLostError")
    return tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))


class StaleSampleError(RayBackendError):
    """An episode was sampled with weights older than train.ray.max_staleness allows."""


def check_staleness(episodes, version: int, max_staleness: int) -> dict[str, float]:
    """The off-policy figures of a batch (`ray/offpolicy_samples`, `ray/staleness_max`); a
    StaleSampleError when an episode lags the learner's `version` by more than `max_staleness`."""
    lags = [version - getattr(e, "policy_version", version) for e in episodes]
    worst = max(lags, default=0)
    if worst > max_staleness:
        raise StaleSampleError(f"an episode was sampled at policy version {version - worst}, {worst} behind the "
                               f"learner's {version}; train.ray.max_staleness={max_staleness} allows {max_staleness} "
                               "(raise it to train off-policy, with the sampler's logprobs as the old policy)")
    return {"ray/offpolicy_samples": float(sum(lag > 0 for lag in lags)), "ray/staleness_max": float(worst)}


class RayPlayer:
    """Plays jobs on Ray rollout workers (see the module docstring); a drop-in for EpisodePlayer."""

    def __init__(self, scenario, actors: dict, seats: dict[str, str], settings, *, threads: int = 1, log=print):
        self.scenario, self.actors, self.seats, self.settings, self.log = scenario, actors, seats, settings, log
        self.version, self.shipped_version = 0, -1
        self._seen: dict = {}  # actor -> {parameter: _version} when the version last moved
        self._shipped: dict = {}  # actor -> {parameter: _version} as the workers hold it
        self.context = "play"  # what is being played (the trainer sets 'step N'), for error lines
        self._deaths, self._counted = 0, None  # worker deaths in the step (context) being played
        self.timing = {"broadcast": 0.0, "broadcast_bytes": 0.0, "retries": 0.0}
        self.ray = connect(settings, log=log)
        check_resources(settings)

        gates.install(self.ray)  # before any judge is built: this process owns every endpoint's gate
        self.ledger_name = f"marl-judge-ledger-{os.getpid()}-{id(self):x}"
        self._ledger = gates.share_ledger(self.ray, self.ledger_name)  # one judge cache, one writer
        if self._ledger is None:
            self.ledger_name = None
        for actor in actors.values():  # endpoint policies were built before: their gates are made here too
            backend = getattr(actor, "backend", None)
            if hasattr(backend, "_shared_gate"):
                backend._shared_gate()
        self.local = EpisodePlayer(scenario, actors, seats)
        self.threads = threads
        self.workers = [self._start_worker(index) for index in range(settings.rollout_workers)]
        self.pids = self.ray.get([w.pid.remote() for w in self.workers])

    # what the rest of the run reads from a player
    scorer = property(lambda self: self.local.scorer)
    visibility = property(lambda self: self.local.visibility)
    default_policy = property(lambda self: self.local.default_policy)
    max_tokens = property(lambda self: self.local.max_tokens)

    def play(self, jobs: list, *, greedy: bool = False) -> EpisodeBatch:
        """Play every job on the workers; the same episodes, in the same order, as EpisodePlayer.play, with
        the batch's off-policy figures (a StaleSampleError past train.ray.max_staleness)."""
        if self.context != self._counted:  # deaths count per step: a step plays its episodes, then its replays
            self._deaths, self._counted = 0, self.context
        self._broadcast(force=greedy)
        if not jobs:
            return EpisodeBatch(episodes=[])
        parts = _partition(jobs, len(self.workers))
        results = self._play_parts(jobs, parts, greedy)
        batch = _merged(jobs, parts, results)
        batch.figures = check_staleness(batch.episodes, self.version, self.settings.max_staleness)
        batch.offpolicy = bool(batch.figures["ray/offpolicy_samples"])
        return batch

    def close(self) -> None:
        """Stop the workers (the cluster stays up for whoever started it)."""
        for worker in self.workers:
            self.ray.kill(worker)
        self.workers = []
        gates.uninstall()
        gates.unshare_ledger(self.ray, self._ledger)
        self._ledger = None

    # -- workers --------------------------------------------------------------------------------

    def _start_worker(self, index: int):
        """A new worker holding the scenario and every actor as the workers now hold them."""
        # a worker given no GPU sees none (Ray leaves CUDA_VISIBLE_DEVICES alone when 0 GPUs are asked for)
        gpu = {} if self.settings.num_gpus else {"runtime_env": {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}}}
        remote = self.ray.remote(RolloutWorker).options(num_cpus=self.settings.num_cpus,
                                                         num_gpus=self.settings.num_gpus,
                                                         max_restarts=0, name=None, **gpu)
        worker = remote.remote(self.threads)
        try:
            problem = self.ray.get(worker.setup.remote(cloudpickle.dumps(self.scenario), self.seats,
                                                       self.local.max_tokens, self.ledger_name),
                                   timeout=START_TIMEOUT_S)
        except self.ray.exceptions.GetTimeoutError:
            self.ray.kill(worker)
            raise RayBackendError(f"rollout worker {index} was not started within {START_TIMEOUT_S:.0f} s: the "
                                  f"cluster has no room for num_cpus={self.settings.num_cpus}, num_gpus="
                                  f"{self.settings.num_gpus} (busy, or no single node that large); lower "
                                  "train.ray.num_cpus / num_gpus or rollout_workers, or add nodes") from None
        if problem is None and self._shipped:
            # the current weights: a replacement's episodes are sampled at, and record, the learner's version
            problem = self.ray.get(worker.sync.remote(self._full_payload(), self.version))
        if problem is not None:
            self.ray.kill(worker)
            raise RayBackendError(f"rollout worker {index} cannot load the scenario's code: {problem}; every module "
                                  "a scenario names must import on every node (the same path, or a Ray runtime_env "
                                  "working_dir)")
        return worker

    def _play_parts(self, jobs, parts, greedy) -> list:
        """Each worker's (EpisodeBatch, version); a dead worker's part is played again on a new one."""
        pending = {w: self.workers[w].play.remote([jobs[i] for i in part], greedy)
                   for w, part in enumerate(parts) if part}
        results = [None] * len(parts)
        while pending:
            w, future = next(iter(pending.items()))
            try:
                batch, problem_or_version = self.ray.get(future)
            except lost_worker_errors(self.ray) as error:
                self._replace_worker(w, error, "replaying its episodes")
                pending[w] = self.workers[w].play.remote([jobs[i] for i in parts[w]], greedy)
                continue
            del pending[w]
            if batch is None:
                raise RayBackendError(f"rollout worker {w} failed during {self.context}: {problem_or_version}")
            results[w] = batch
        return results

    def _replace_worker(self, w: int, error: Exception, what: str) -> None:
        """A new worker in place of dead worker `w`; a RayBackendError past max_retries deaths per play."""
        self._deaths += 1
        if self._deaths > self.settings.max_retries:
            raise RayBackendError(f"rollout worker {w} (pid {self.pids[w]}) died during {self.context} "
                                  f"({type(error).__name__}), {self._deaths} worker deaths in it; giving up "
                                  f"after train.ray.max_retries={self.settings.max_retries}") from None
        self.log(f"ray: rollout worker {w} (pid {self.pids[w]}) died during {self.context}; {what} on a new worker")
        self.timing["retries"] += 1
        try:
            self.ray.kill(self.workers[w])  # one that is only unreachable would otherwise keep its resources
        except Exception:  # noqa: BLE001 - already gone, which is the usual case
            pass
        try:
            self.workers[w] = self._start_worker(w)
            self.pids[w] = self.ray.get(self.workers[w].pid.remote())
        except lost_worker_errors(self.ray) as again:  # the replacement died while starting: one more death
            self._replace_worker(w, again, what)

    def _sync_workers(self, reference) -> None:
        """Every worker applies the payload; a dead one is replaced (it starts with the current actors)."""
        futures = [w.sync.remote(reference, self.shipped_version) for w in self.workers]
        for index, future in enumerate(futures):
            try:
                problem = self.ray.get(future)
            except lost_worker_errors(self.ray) as error:
                self._replace_worker(index, error, "starting again")  # it holds what was shipped before...
                problem = self.ray.get(self.workers[index].sync.remote(reference, self.shipped_version))  # ...and this
            if problem is not None:
                raise RayBackendError(f"rollout worker {index} cannot open the run's actors: {problem}; every "
                                      "module a policy names must import on every node")

    # -- weights --------------------------------------------------------------------------------

    def _broadcast(self, *, force: bool) -> None:
        """Move the version when a trainable actor changed, and ship what the workers must hold now:
        new actors, frozen actors' changes, and the trainable ones' when `force`d (evaluation) or when
        the workers would lag by more than max_staleness versions."""
        current = {name: _parameter_versions(actor) for name, actor in self.actors.items()}
        trainable = {name for name, actor in self.actors.items() if getattr(actor, "trainable", False)}
        if any(current[name] != self._seen.get(name) for name in trainable) and self._seen:
            self.version += 1
        self._seen = {name: current[name] for name in trainable}
        ship_trainable = force or self.shipped_version < 0 or \
            self.version - self.shipped_version > self.settings.max_staleness
        new = [name for name in self.actors if name not in self._shipped]
        changed = {name: keys for name, keys in _changed(current, self._shipped).items()
                   if name not in new and (ship_trainable or name not in trainable)}
        dropped = [name for name in self._shipped if name not in self.actors]
        if ship_trainable:
            self.shipped_version = self.version
        if not (new or changed or dropped):
            return
        started = time.perf_counter()
        payload = self._payload(new, changed, dropped)
        self._sync_workers(self.ray.put(payload))
        for name in new:
            self._shipped[name] = current[name]
        for name, keys in changed.items():
            self._shipped[name] = {**self._shipped[name], **{k: current[name][k] for k in keys}}
        for name in dropped:
            del self._shipped[name]
        self.timing["broadcast"] += time.perf_counter() - started
        self.timing["broadcast_bytes"] += len(payload)

    def _payload(self, new, changed, dropped) -> bytes:
        params = {}
        for name, keys in changed.items():
            tensors = dict(self.actors[name].model.named_parameters())
            params[name] = {key: tensors[key].detach().cpu() for key in keys}
        return cloudpickle.dumps({"actors": {name: _shippable(self.actors[name]) for name in new},
                                  "params": params, "dropped": dropped})

    def _full_payload(self) -> bytes:
        """Every actor the workers hold that still exists (for a new worker), with the current weights."""
        return self._payload([name for name in self._shipped if name in self.actors], {}, [])


def _parameter_versions(actor) -> dict | None:
    """{parameter name: fingerprint} of a model actor (None for an actor without weights): the tensor's
    in-place change count with its sum and absolute sum, since fused optimizers (AdamW(fused=True))
    change the weights without moving the count."""
    import torch

    model = getattr(actor, "model", None)
    if model is None:
        return None
    named = list(model.named_parameters())
    if not named:
        return {}
    with torch.no_grad():
        sums = torch.stack([t.detach().float().sum() for _, t in named]).tolist()
        norms = torch.stack([t.detach().float().abs().sum() for _, t in named]).tolist()
    return {name: (tensor._version, total, norm) for (name, tensor), total, norm in zip(named, sums, norms)}


def _changed(current: dict, shipped: dict) -> dict[str, list[str]]:
    """actor -> names of the parameters whose change count moved since they were shipped."""
    changed = {}
    for name, versions in current.items():
        before = shipped.get(name)
        if versions is None or before is None:
            continue
        keys = [key for key, count in versions.items() if before.get(key) != count]
        if keys:
            changed[name] = keys
    return changed


def _shippable(actor) -> tuple:
    """An actor as it travels: a model actor as (model, tokenizer, sampling options), others whole."""
    if isinstance(actor, ModelActor):
        return ("model", actor.model, actor.tokenizer, dict(trainable=actor.trainable, temperature=actor.temperature,
                                                             top_p=actor.top_p, styles=actor.styles))
    return ("object", actor)


def _partition(jobs: list, workers: int) -> list[list[int]]:
    """Job indices per worker: jobs sharing a replay memo (else a task and prefix) stay together;
    groups go, in order, to the least-loaded worker (deterministic)."""
    groups: dict = {}
    for index, job in enumerate(jobs):
        task = job.task if not hasattr(job.task, "id") else job.task.id
        key = ("memo", id(job.memo)) if job.memo is not None else ("task", repr(task), job.prefix)
        groups.setdefault(key, []).append(index)
    parts, loads = [[] for _ in range(workers)], [0] * workers
    for indices in groups.values():
        target = loads.index(min(loads))
        parts[target].extend(indices)
        loads[target] += len(indices)
    return parts


def _merged(jobs: list, parts: list[list[int]], results: list) -> EpisodeBatch:
    """The workers' batches as one, in the jobs' order: each episode back on its own job (whose replay
    memo takes the worker's new samples), each turn pointing into the merged generations."""
    merged, episodes = EpisodeBatch(episodes=[]), [None] * len(jobs)
    for part, batch in zip(parts, results):
        if batch is None:
            continue
        offsets = {}
        for actor, calls in batch.generations.items():
            offsets[actor] = len(merged.generations[actor])
            merged.generations[actor].extend(calls)
        for index, episode in zip(part, batch.episodes):
            job = jobs[index]
            if job.memo is not None and episode.job.memo is not None:
                job.memo.update(episode.job.memo)
            episode.job = job
            for turn in episode.turns:
                if turn.actor is not None and turn.batch is not None:
                    turn.batch += offsets[turn.actor]
            episodes[index] = episode
    merged.episodes = episodes
    return merged
