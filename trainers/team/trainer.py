"""Multi-agent GRPO on a scenario, top to bottom: play -> score -> credit -> guards -> advantages -> update.

One `MultiAgentTrainer.step()`:

1. draw `prompts_per_step` tasks from one difficulty bucket; play each `group_size` times, all episodes
   in lockstep (`marl.rollout.EpisodePlayer`: one batched generate per actor per turn);
2. per-agent rewards: in cooperative scenarios the team reward is split by the scenario's `credit`
   section from counterfactual replays of each episode (common random numbers: unchanged inputs keep
   their recorded sample); in competitive ones each agent's zero-sum reward is its own;
3. safeguards per agent: Self-BLEU of each group of that agent's messages, diversity penalty, floor
   reward when a whole group's team reward failed (cooperative); masked rewards (a judge failure)
   stay NaN;
4. role-conditioned advantages: each agent's rewards are normalised within its own task group, and
   every turn the agent took in that episode becomes a sample (observation -> message, advantage);
5. one `PolicyLearner.update` per trainable actor (a shared model trains on all its agents' samples).

Masked rewards are watched (`MaskedRewardGuard`): the first step on which more than
`train.max_masked_fraction` of the episodes had a masked reward prints one warning line; when that
share over the last MASKED_WINDOW steps (or all the steps of a shorter run, at its last step) is
still above it, the step raises `MaskedRewardsError` before its update, so the weights, the last
checkpoint and metrics.jsonl stay those of the last complete step. A run whose every reward is
masked (an SQL scenario whose database is not a database, a judge that always fails) never ends
with exit status 0.

Self-play (competitive scenarios, `train.selfplay`): on a share of steps the learner plays against a
snapshot from an `OpponentPool` instead of itself, taking alternate seats per task; each episode's
result updates the ratings, and a snapshot joins the pool every `snapshot_every` steps.

What a step played and computed stays readable as `trainer.last_step` (a `StepResult`); its metrics
are `trainers.team.metrics`. Seeding, the difficulty buckets, the repetition guards and the saved RNG
state are the GRPO trainer's own (`trainers.grpo.shared`).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass

import torch

from marl.credit.replay import episode_credits, shrink_factors, shrink_rewards
from marl.rollout import EpisodeBatch, EpisodeJob, EpisodePlayer
from marl.types import Task
from trainers.grpo.objective import group_advantages, masked_mean
from trainers.grpo.shared import (GuardTally, core_state, difficulty_buckets, load_core_state, record_pass_rates,
                                  repetition_guards, seed_everything)
from trainers.team.metrics import (FIXED, TurnGuards, is_masked, masked_credit, match_scores, step_metrics,
                                   success)

OPPONENT = "opponent"
INITIAL = "initial"  # the evaluation's opponent: the policy as the run started
MASKED_WINDOW = 5  # steps over which the masked share is judged


def _opponent_actor(opponent: str) -> str:
    """The actor that plays the opponent's seats: a fixed opponent's own, else the snapshot actor."""
    return opponent if opponent.startswith(FIXED) else OPPONENT


class MaskedRewardsError(ValueError):
    """Too many episodes had masked rewards: training stopped (the message says why and what to do)."""


def _masked_reason(episodes) -> str:
    """The first failed scorer's status and rationale among masked episodes ('' when none is recorded)."""
    for episode in episodes:
        for breakdown in (getattr(episode, "breakdown", None) or {}).values():
            for component in getattr(breakdown, "components", None) or ():
                if component.get("status") not in (None, "ok"):
                    rationale = " ".join(str(component.get("rationale") or "").split())[:160]
                    return f"{component.get('kind', 'scorer')} {component['status']}: {rationale}"
    return ""


def _player(scenario, actors: dict, seats: dict, log):
    """The episode player of `train.backend`: this process (local) or Ray rollout workers (ray)."""
    train = scenario.spec.train
    if train.backend == "ray":
        from trainers.ray.player import RayPlayer

        return RayPlayer(scenario, actors, seats, train.ray, threads=train.threads, log=log)
    return EpisodePlayer(scenario, actors, seats)


class MaskedRewardGuard:
    """Counts masked episodes per step; warns once, and raises past `limit` over a window of steps."""

    def __init__(self, limit: float, total_steps: int, log=print, window: int = MASKED_WINDOW):
        self.limit, self.total_steps, self.log, self.window = limit, total_steps, log, window
        self.recent: list[tuple[int, int]] = []  # (masked, episodes) of the last `window` steps
        self.warned = False

    def check(self, step: int, masked_episodes: list, episodes: int) -> None:
        """Record step `step` (0-based); warn once; MaskedRewardsError when the window is past the limit."""
        masked = len(masked_episodes)
        self.recent = (self.recent + [(masked, episodes)])[-self.window:]
        if episodes and masked / episodes > self.limit and not self.warned:
            self.warned = True
            self.log(f"warning: step {step + 1}: {masked} of {episodes} episodes had masked rewards "
                     f"({_masked_reason(masked_episodes) or 'a scorer failed'}); training stops if more than "
                     f"{self.limit:g} of them stay masked over {self.window} steps (train.max_masked_fraction)")
        total_masked, total = sum(m for m, _ in self.recent), sum(n for _, n in self.recent)
        decided = len(self.recent) == self.window or step + 1 >= self.total_steps
        if decided and total and total_masked / total > self.limit:
            steps = len(self.recent)
            raise MaskedRewardsError(
                f"step {step + 1}: {total_masked} of {total} episodes over the last {steps} step(s) had masked "
                f"rewards ({_masked_reason(masked_episodes) or 'a scorer failed'}), more than "
                f"train.max_masked_fraction={self.limit:g}; training stopped before this step's update (the last "
                "checkpoint and metrics.jsonl are intact). Fix the scorer (marl validate, marl rollout), or allow "
                "more with --set train.max_masked_fraction=0.9 (1 never stops)")


@dataclass
class StepResult:
    """What one `MultiAgentTrainer.step()` played and trained on (E episodes: G per task, task by task).

    batch: the played `EpisodeBatch`: `episodes` (E) and `generations` (actor -> the sampled tokens
        of each generate call, which turns point into with `turn.batch` and `turn.row`).
    rewards: E rows of agent -> the reward trained on: credit (cooperative) or the agent's own reward
        (competitive), after the stage's transform, shrinkage and the safeguards; NaN where masked.
    advantages: agent -> E group-normalised advantages (0 where the reward is masked).
    credits: E credit estimates (cooperative; None where an episode's credit could not be split),
        or None when credit does not apply (competitive).
    """

    batch: EpisodeBatch
    rewards: list[dict[str, float]]
    advantages: dict[str, list[float]]
    credits: list | None

    @property
    def episodes(self) -> list:
        """The played episodes (`batch.episodes`)."""
        return self.batch.episodes


class MultiAgentTrainer:
    """GRPO for every trainable actor of a scenario (see the module docstring)."""

    def __init__(self, scenario, actors: dict, seats: dict[str, str], tasks: list[Task], config, *,
                 selfplay: bool = False, log=print):
        from trainers.grpo.learner import PolicyLearner

        if not tasks:
            raise ValueError(f"scenario {scenario.spec.name!r} has no training tasks")
        self.scenario, self.spec, self.config, self.log = scenario, scenario.spec, config, log
        self.agents = list(scenario.agent_names)
        self.actors, self.seats = actors, seats
        seed_everything(config)
        self.learners = {name: PolicyLearner(actor.model, config) for name, actor in actors.items()
                         if actor.trainable and hasattr(actor, "model")}
        if not self.learners:
            raise ValueError(f"scenario {scenario.spec.name!r} has no trainable agent: give at least one agent "
                             "a model policy ('shared', 'own' or a model directory) with trainable: true")
        self.player = _player(scenario, actors, seats, log)
        self.tasks = {task.id: task for task in tasks}
        self.buckets = difficulty_buckets(tasks, config)
        self.rng = random.Random(config.seed)
        self.pool = self._opponent_pool() if selfplay else None
        # only a run with a held-out set evaluates against its start (the copy costs one frozen model)
        self.eval_opponents = self._initial_opponent() if selfplay and self.spec.tasks.eval_count else {}
        self.step_count = 0
        self.totals = {"masked_episodes": 0, "masked_credit": 0, "floored_groups": 0, "collapse_alarms": 0,
                       "episodes": 0}
        self.last_step: StepResult | None = None  # what the last step played and trained on
        self.masked_guard = MaskedRewardGuard(self.spec.train.max_masked_fraction, config.steps, log)
        self.turn_guards = TurnGuards(self.spec, log)  # truncated prompts, completions at max_tokens, silent tools

    # -- one step, top to bottom ------------------------------------------------------------------

    def step(self, *, prefix: dict[str, str] | None = None, tasks: list[Task] | None = None,
             reward_transform=None, lr_scale: float = 1.0) -> dict[str, float]:
        """One multi-agent GRPO step; returns its metrics.

        Stages steer it with: `tasks` (instead of the bucket draw), `prefix` (task id -> text put before
        every observation), `reward_transform(episode, agent, reward) -> reward` and `lr_scale`.
        """
        started = time.perf_counter()
        bucket, tasks = self._draw_tasks(tasks)
        opponent = self._pick_opponent()
        jobs = self._jobs(tasks, opponent, prefix or {})
        self.player.context = f"step {self.step_count + 1}"  # named by the Ray backend's error lines
        batch = self.player.play(jobs)
        lag = self._staleness(batch)
        played = time.perf_counter()
        rewards, credits = self._agent_rewards(batch, reward_transform)
        self._check_masked(batch, credits)
        rewards, guards = self._apply_safeguards(batch, rewards)
        advantages = self._role_advantages(rewards)
        scored = time.perf_counter()
        updates = {name: learner.update(*self._samples(batch, name, advantages), lr_scale=lr_scale,
                                        offpolicy=bool(lag.get("ray/offpolicy_samples"))
                                        or self.actors[name].engine.offpolicy)
                   if self._has_samples(batch, name) else learner.keep_clock()
                   for name, learner in self.learners.items()}
        self._record_results(tasks, batch, credits, opponent)
        self.step_count += 1
        for learner in self.learners.values():
            learner.end_step(self.step_count)
        self.last_step = StepResult(batch, rewards, advantages, credits)
        times = {"time/play": played - started, "time/credit": scored - played,
                 "time/update": time.perf_counter() - scored, "time/step": time.perf_counter() - started}
        metrics = {**step_metrics(self, self.last_step, bucket, guards, updates, times, opponent), **lag}
        return {**metrics, **self.turn_guards.update(self.step_count, batch)}  # length/*, tools/*: warns when due

    def _staleness(self, batch) -> dict[str, float]:
        """The Ray backend's off-policy figures of the batch (a StaleSampleError past max_staleness)."""
        if self.spec.train.backend != "ray":
            return {}
        from trainers.ray.player import check_staleness

        return check_staleness(batch.episodes, self.player.version, self.spec.train.ray.max_staleness)

    def _check_masked(self, batch, credits) -> None:
        """Feed the masked-reward guard: episodes masked by a scorer, or whose credit could not be split."""
        masked = [e for index, e in enumerate(batch.episodes)
                  if is_masked(e) or (credits is not None and credits[index] is None)]
        self.masked_guard.check(self.step_count, masked, len(batch.episodes))

    def _draw_tasks(self, tasks):
        if tasks is not None:
            return -1, list(tasks)
        bucket, ids = self.buckets.sample_batch(self.config.prompts_per_step)
        return bucket, [self.tasks[i] for i in ids]

    def _jobs(self, tasks: list[Task], opponent, prefix: dict[str, str]) -> list[EpisodeJob]:
        """G jobs per task with distinct seeds; against an opponent the learner's seat alternates per task."""
        g, jobs = self.config.group_size, []
        for index, task in enumerate(tasks):
            seats = {}
            if opponent is not None:
                learner_seat = self.agents[(self.step_count + index) % len(self.agents)]
                seats = {agent: _opponent_actor(opponent) for agent in self.agents if agent != learner_seat}
            for member in range(g):
                seed = self.config.seed * 1_000_003 + self.step_count * 10_007 + index * g + member
                jobs.append(EpisodeJob(task, seed, seats=seats, prefix=prefix.get(task.id, "")))
        return jobs

    def _agent_rewards(self, batch, reward_transform):
        """(episodes x agents) rewards and credit estimates (None where credit does not apply)."""
        cooperative = self.spec.mode == "cooperative"
        credits = episode_credits(self.player, batch.episodes, self.spec.credit) if cooperative else None
        rows = []
        for index, episode in enumerate(batch.episodes):
            if credits is not None:
                row = {a: credits[index].values[a] if credits[index] is not None else math.nan for a in self.agents}
            else:
                row = {a: episode.rewards.get(a, math.nan) for a in self.agents}
            if reward_transform is not None:
                row = {a: reward_transform(episode, a, r) for a, r in row.items()}
            rows.append(row)
        shrink_rewards(rows, shrink_factors(batch.episodes, self.config.group_size, self.spec),
                       self.config.group_size, self.agents)
        return rows, credits

    def _apply_safeguards(self, batch, rewards):
        """Per agent: Self-BLEU per group, diversity penalty, floor reward (cooperative); the `guard/*` metrics."""
        cfg, tally = self.config, GuardTally()
        for agent in self.agents:
            texts = [" ".join(t.text for t in e.turns if t.agent == agent) for e in batch.episodes]
            column = repetition_guards(texts, [row[agent] for row in rewards], cfg, tally)
            if cfg.floor_reward > 0 and self.spec.mode == "cooperative":
                column, count = self._floor_failed_groups(batch, column, agent)
                tally.floored_groups += count
            for row, value in zip(rewards, column):
                row[agent] = value
        tally.add_to(self.totals)
        return rewards, tally.metrics()

    def _floor_failed_groups(self, batch, column: list[float], agent: str) -> tuple[list[float], int]:
        """The floor reward, in the groups whose every team reward failed (<= 0 or masked) only.

        Failure is judged on the team reward, not on the agent's credit: a credit split can be <= 0
        for every member of a group that did not fail, and flooring it would reward a wrong answer.
        """
        from trainers.grpo.safeguards import apply_floor_reward

        g, progress, column, floored = self.config.group_size, self._progress(batch, agent), list(column), 0
        for start in range(0, len(column), g):
            team = [e.team_reward() for e in batch.episodes[start:start + g]]
            if all(math.isnan(r) or r <= 0 for r in team):
                column[start:start + g], count = apply_floor_reward(column[start:start + g], g,
                                                                    progress[start:start + g], self.config.floor_reward)
                floored += count
        return column, floored

    def _progress(self, batch, agent: str) -> list[float]:
        """Partial progress of an agent per episode: the mean token logprob of its sampled messages."""
        values = []
        for episode in batch.episodes:
            scores = []
            for turn in episode.turns:
                if turn.agent == agent and turn.actor is not None:
                    rows = batch.generations[turn.actor][turn.batch]
                    logprobs = rows.logprobs[turn.row]
                    known = rows.completion_mask[turn.row] * ~torch.isnan(logprobs)  # a server may not send all
                    scores.append(masked_mean(torch.nan_to_num(logprobs), known).item())
            values.append(statistics.fmean(scores) if scores else -math.inf)
        return values

    def _role_advantages(self, rewards) -> dict[str, list[float]]:
        """Each agent's rewards normalised within its task groups (role-conditioned GRPO advantages)."""
        advantages = {}
        for agent in self.agents:
            column = torch.tensor([row[agent] for row in rewards], dtype=torch.float64)
            advantages[agent] = group_advantages(column, self.config.group_size, self.config.scale_rewards).tolist()
        return advantages

    def _has_samples(self, batch, actor: str) -> bool:
        return bool(batch.generations.get(actor))

    def _samples(self, batch, actor: str, advantages):
        """The actor's sampled turns as one Completions batch with each turn's advantage."""
        from trainers.policy.sampling import concat_completions, select_rows

        offsets, total = [], 0
        for rows in batch.generations[actor]:
            offsets.append(total)
            total += rows.completion_ids.size(0)
        index, values = [], []
        for e, episode in enumerate(batch.episodes):
            for turn in episode.turns:
                if turn.actor == actor:
                    index.append(offsets[turn.batch] + turn.row)
                    values.append(advantages[turn.agent][e])
        merged = concat_completions(batch.generations[actor])
        device = merged.completion_ids.device  # the model's: the learner trains there
        rows = select_rows(merged, torch.tensor(index, device=device))  # a copy: the played batch stays as sampled
        self._mask_unheard(rows, [t for e in batch.episodes for t in e.turns if t.actor == actor], actor)
        return rows, torch.tensor(values, dtype=torch.float32, device=device)

    def _mask_unheard(self, rows, turns, actor: str) -> None:
        """Mask 0 on completion tokens the environment never heard: past action_max_chars of a clipped
        message (and its stop token), so the policy is not trained on text that changed nothing."""
        from trainers.policy.prompts import heard_tokens

        limit = self.spec.action_max_chars
        for row, turn in enumerate(turns):
            if len(turn.text) <= limit:
                continue  # heard whole: the mask is the sampler's (relay's messages always are)
            kept = rows.completion_mask[row].nonzero().flatten()
            heard = heard_tokens(self.actors[actor].tokenizer, rows.completion_ids[row, kept].tolist(), limit)
            rows.completion_mask[row, kept[heard:]] = 0

    # -- bookkeeping ------------------------------------------------------------------------------

    def _record_results(self, tasks, batch, credits, opponent) -> None:
        """Pass rates for the bucket sampler, the run's totals, and match results for the opponent pool."""
        successes = [success(e, self.spec.mode) for e in batch.episodes]
        record_pass_rates(self.buckets, tasks, successes, self.config.group_size, known=self.tasks)
        self.totals["episodes"] += len(batch.episodes)
        self.totals["masked_episodes"] += sum(is_masked(e) for e in batch.episodes)
        if credits is not None:
            self.totals["masked_credit"] += masked_credit(batch.episodes, credits)
        if self.pool is not None:
            self._record_matches(batch, opponent)
            if (self.step_count + 1) % self.spec.train.selfplay.snapshot_every == 0:
                self.pool.add_snapshot(self.step_count + 1, _snapshot(self.actors["shared"].model))

    def restart_frozen_copies(self) -> None:
        """After a warm-up changed the weights: the KL references and the opponent pool start from them."""
        for name, learner in self.learners.items():
            if learner.reference is not None:
                learner.reference.load_state_dict(self.actors[name].model.state_dict())
        if self.pool is not None:
            self.pool = self._opponent_pool()

    # -- self-play --------------------------------------------------------------------------------

    def _opponent_pool(self):
        from trainers.grpo.learner import frozen_copy
        from marl.selfplay import OpponentPool

        settings = self.spec.train.selfplay
        shared = self.actors.get("shared")
        if shared is None or not shared.trainable or set(self.seats.values()) != {"shared"}:
            raise ValueError("self-play needs every agent on the one trainable 'shared' policy; set "
                             "train.selfplay.enabled: false or make every agent's policy 'shared'")
        self.actors[OPPONENT] = self._frozen_actor(OPPONENT, seed_offset=99)
        pool = OpponentPool(max_size=settings.pool_size, strategy=settings.strategy, ratings=settings.ratings,
                            seed=self.config.seed)
        pool.add_snapshot(0, _snapshot(shared.model))
        return pool

    def _initial_opponent(self) -> dict:
        """{'initial': a frozen greedy copy of the policy as the run starts (before any stage, as in
        before.json)}: the evaluation's vs/initial/* says how the trained policy fares against it."""
        return {INITIAL: self._frozen_actor(INITIAL, seed_offset=98)}

    def _frozen_actor(self, name: str, *, seed_offset: int):
        """A frozen ModelActor `name` holding a copy of the shared policy's weights now (with LoRA: a frozen
        adapter on the same base), with its sampling settings, roles and prompt style."""
        from trainers.grpo.learner import frozen_copy
        from trainers.policy.actors import ModelActor
        from trainers.policy.adapters import opponent_model

        shared = self.actors["shared"]
        return ModelActor(name, opponent_model(shared.model, name, frozen_copy), shared.tokenizer, trainable=False,
                          temperature=shared.temperature, top_p=shared.top_p, seed=self.config.seed + seed_offset,
                          styles=shared.styles)

    def _pick_opponent(self):
        """None (self-play), a fixed opponent (FIXED + its name: train.selfplay.fixed_opponents) or the
        pool id of the snapshot the learner faces this step."""
        settings = self.spec.train.selfplay
        if self.pool is None:
            return None
        if settings.fixed_opponents:  # drawn only when configured: runs without them keep their draws
            draw = self.rng.random()
            for name, share in settings.fixed_opponents.items():
                if draw < share:
                    return self._fixed_opponent(name)
                draw -= share
        if self.rng.random() < settings.self_play_fraction:
            return None
        opponent_id, snapshot = self.pool.sample()
        self.actors[OPPONENT].model.load_state_dict(snapshot)
        return opponent_id

    def _fixed_opponent(self, name: str) -> str:
        """The id of the scenario's fixed opponent `name`, its actor built on first use."""
        from marl.policies import get_policy
        from marl.rollout import PolicyActor

        opponent = FIXED + name
        if opponent not in self.actors:  # called in seat order, as a loop over the agents would (seeded)
            policy = get_policy(self.spec.opponents[name], self.scenario, self.config.seed)
            self.actors[opponent] = PolicyActor(policy, order=self.agents)
        return opponent

    def _record_matches(self, batch, opponent) -> None:
        """Match results against a pool snapshot go to its ratings; a fixed opponent has none (its
        score is the step's selfplay/fixed/NAME/score)."""
        if opponent is None or opponent.startswith(FIXED):
            return
        for score in match_scores(batch.episodes, self.agents, OPPONENT):
            self.pool.record(opponent, score)

    # -- state ------------------------------------------------------------------------------------

    def export_models(self) -> dict[str, tuple]:
        """Checkpoint directory name -> (model, tokenizer) of every trainable actor."""
        return {("model" if name == "shared" else f"model-{name}"): (self.actors[name].model, self.actors[name].tokenizer)
                for name in self.learners}


    def state_dict(self) -> dict:
        """Everything a resumed run needs to continue like an uninterrupted one."""
        return {**core_state(self),
                "learners": {name: learner.state_dict() for name, learner in self.learners.items()},
                "generators": {name: a.generator.get_state() for name, a in self.actors.items()
                               if hasattr(a, "generator")},
                "scripted_rngs": {name: list(a.policy.rng.getstate()) for name, a in self.actors.items()
                                  if hasattr(getattr(a, "policy", None), "rng")},
                "rng": self.rng.getstate(),
                "pool": self.pool.state_dict() if self.pool is not None else None,
                "scenario": resume_fingerprint(self.spec)}

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()` (same scenario, actors and config; more steps are allowed)."""
        changed = _differences(_identified(state.get("scenario", {})), resume_fingerprint(self.spec))
        if changed:
            raise ValueError(f"the checkpoint was made with a different scenario ({'; '.join(changed[:5])}); resume "
                             "with the same scenario and --set values (only step counts may change), or start a "
                             "new run directory")
        load_core_state(self, state)
        for name, learner in self.learners.items():
            learner.load_state_dict(state["learners"][name])
        for name, generator_state in state["generators"].items():
            self.actors[name].generator.set_state(generator_state)
        for name, rng_state in state.get("scripted_rngs", {}).items():  # seeded scripted policies (random)
            self.actors[name].policy.rng.setstate(_as_tuple_state(rng_state))
        self.rng.setstate(_as_tuple_state(state["rng"]))
        if self.pool is not None and state.get("pool") is not None:
            self.pool.load_state_dict(state["pool"])


STEP_KEYS = {("train", "steps"), ("train", "threads"), ("train", "checkpoint_every"), ("train", "eval_every"),
             ("train", "tracking"), ("train", "warmup", "rl_steps"), ("train", "reflection", "steps"),
             ("train", "safety", "steps"), ("train", "max_masked_fraction"),  # a stopped run may resume with a new limit
             ("train", "truncation_warn_fraction"), ("train", "tool_silence_steps"),  # warnings only
             # where episodes are played changes nothing (staleness 0): a run resumes on either backend
             ("train", "backend"), ("train", "ray", "address"), ("train", "ray", "rollout_workers"),
             ("train", "ray", "num_cpus"), ("train", "ray", "num_gpus"), ("train", "ray", "max_retries"),
             ("train", "ray", "object_store_mb")}


def resume_fingerprint(spec) -> dict:
    """The scenario as plain data, minus what a resumed run may change (step counts, threads, tracking).

    A model directory (train.model, an agent's own policy) is recorded by its content, not its path, so
    a run resumes after its base model moved (a new cache folder, another disk) and still refuses a
    different model at the old path.
    """
    data = spec.model_dump(mode="json")
    for path in STEP_KEYS:
        node = data
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1], None)
    data["train"]["model"] = _model_identity(data["train"]["model"])
    for agent in data.get("agents", []):
        agent["policy"] = _model_identity(agent["policy"])
    return data


def _identified(saved: dict) -> dict:
    """A saved fingerprint with its model directories as `_model_identity`s (a checkpoint written before
    they were recorded by content holds their paths)."""
    if isinstance(saved.get("train"), dict) and isinstance(saved["train"].get("model"), str):
        saved["train"]["model"] = _model_identity(saved["train"]["model"])
    for agent in saved.get("agents", []) if isinstance(saved.get("agents"), list) else []:
        if isinstance(agent, dict) and isinstance(agent.get("policy"), str):
            agent["policy"] = _model_identity(agent["policy"])
    return saved


def _model_identity(name: str) -> str:
    """'sha256:<config and weights>' of a model directory (trainers/policy/adapters.py:base_fingerprint);
    anything else ('tiny', 'shared', a scripted policy) as it is."""
    from pathlib import Path

    if name in ("tiny", "shared", "own") or ":" in name or not (Path(name).expanduser() / "config.json").is_file():
        return name
    from trainers.policy.adapters import base_fingerprint

    return "sha256:" + base_fingerprint(Path(name).expanduser())


def _differences(saved, current, path: str = "") -> list[str]:
    """'key.path: saved -> current' for every leaf that differs. A key the checkpoint does not have is a
    setting added to marl since it was written (e.g. train.packing): not a change, so an upgrade can resume."""
    if isinstance(saved, dict) and isinstance(current, dict):
        return [line for key in sorted(set(saved) | set(current)) if key in saved
                for line in _differences(saved.get(key), current.get(key), f"{path}.{key}" if path else key)]
    return [] if saved == current else [f"{path}: {saved!r} -> {current!r}"]


def _snapshot(model) -> dict:
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def _as_tuple_state(state):
    """random.Random states come back from torch.load as lists; setstate needs tuples."""
    version, internal, gauss = state
    return version, tuple(internal), gauss
