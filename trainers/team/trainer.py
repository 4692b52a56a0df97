"""Multi-agent GRPO on a scenario, top to bottom: play -> score -> credit -> guards -> advantages -> update.

This is the step `marl run` executes. One `MultiAgentTrainer.step(plan)`:

1. play: draw `prompts_per_step` tasks from one difficulty bucket (or take the plan's); play each
   `group_size` times, all episodes in lockstep (`marl.rollout.EpisodePlayer`: one batched generate
   per actor per turn; the Ray backend's `RayPlayer` plays the same jobs on rollout workers);
2. score and credit: in cooperative scenarios the team reward is split by the scenario's `credit`
   section from counterfactual replays of each episode (common random numbers: unchanged inputs keep
   their recorded sample); in competitive ones each agent's zero-sum reward is its own;
3. guards per agent: Self-BLEU of each group of that agent's messages, diversity penalty, floor
   reward when a whole group's team reward failed (cooperative); masked rewards (a judge failure)
   stay NaN, and too many of them stop the run (`MaskedRewardGuard`);
4. advantages, role-conditioned: each agent's rewards are normalised within its own task group, and
   every turn the agent took in that episode becomes a sample (observation -> message, advantage);
5. update: one `PolicyLearner.update` per trainable actor (a shared model trains on all its agents'
   samples).

Features plug in rather than reach in. A `StepPlan` is what a stage or a feature asks of one step (its
tasks, a prefix per task, a reward transform, an lr scale, another `Arena` to play in: the continual
run's replay of an earlier scenario); `SelfPlay` (trainers/team/selfplay.py) picks the opponent of
competitive steps; the episode player is this process's or the Ray backend's. With every feature off a
step runs none of their code. Settings come resolved in a `trainers.config.TrainConfig`.

What a step played and computed stays readable as `trainer.last_step` (a `StepResult`); its metrics
are `trainers.team.metrics`. Seeding, the difficulty buckets, the repetition guards and the saved RNG
state are the GRPO core's (`trainers.grpo.shared`).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from marl.credit.replay import episode_credits, shrink_factors, shrink_rewards
from marl.rollout import EpisodeBatch, EpisodeJob, EpisodePlayer
from marl.types import Task
from trainers.grpo.objective import group_advantages, masked_mean
from trainers.grpo.safeguards import apply_floor_reward
from trainers.grpo.shared import (GuardTally, core_state, difficulty_buckets, load_core_state, record_pass_rates,
                                  repetition_guards, seed_everything)
from trainers.ray.player import RayPlayer
from trainers.records.fingerprint import fingerprint_changes, resume_fingerprint
from trainers.team.metrics import TurnGuards, is_masked, masked_credit, step_metrics, success
from trainers.team.selfplay import INITIAL, OPPONENT, SelfPlay  # noqa: F401 - the actor names, re-exported

MASKED_WINDOW = 5  # steps over which the masked share is judged


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


def episode_player(scenario, actors: dict, seats: dict, config, log=print):
    """The episode player of `config.backend`: this process (local) or Ray rollout workers (ray)."""
    if config.backend.kind == "ray":
        return RayPlayer(scenario, actors, seats, config.backend.ray, threads=config.grpo.threads, log=log)
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


@dataclass(frozen=True)
class Arena:
    """Where a step's episodes are played and scored: a scenario's spec (mode, credit, rewards) and its
    episode player; `known` holds the task ids whose pass rates feed the difficulty sampler."""

    spec: object
    player: object
    known: frozenset = frozenset()


@dataclass(frozen=True)
class StepPlan:
    """What a stage or a feature asks of one step (the main stage asks nothing: `StepPlan()`).

    tasks: the step's tasks (None: drawn from the difficulty buckets); prefix: task id -> text put before
    every observation; reward_transform(episode, agent, reward) -> reward; lr_scale: the learners' lr
    is scaled by it; arena: another scenario to play in (None: the trainer's own).
    """

    tasks: list[Task] | None = None
    prefix: dict[str, str] = field(default_factory=dict)
    reward_transform: Callable | None = None
    lr_scale: float = 1.0
    arena: Arena | None = None


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
    """GRPO for every trainable actor of a scenario (see the module docstring).

    `config` is the run's `trainers.config.TrainConfig`; `player` the episode player (default: the one
    of config.backend). The trainer's fields are its own: nothing outside this class assigns to them.
    """

    def __init__(self, scenario, actors: dict, seats: dict[str, str], tasks: list[Task], config, *,
                 player=None, log=print):
        from trainers.grpo.learner import PolicyLearner

        if not tasks:
            raise ValueError(f"scenario {scenario.spec.name!r} has no training tasks")
        self.scenario, self.spec, self.config, self.grpo, self.log = scenario, scenario.spec, config, config.grpo, log
        self.agents = list(scenario.agent_names)
        self.actors, self.seats = actors, seats
        seed_everything(self.grpo)
        self.learners = {name: PolicyLearner(actor.model, self.grpo) for name, actor in actors.items()
                         if actor.trainable and hasattr(actor, "model")}
        if not self.learners:
            raise ValueError(f"scenario {scenario.spec.name!r} has no trainable agent: give at least one agent "
                             "a model policy ('shared', 'own' or a model directory) with trainable: true")
        self.player = player or episode_player(scenario, actors, seats, config, log)
        self.tasks = {task.id: task for task in tasks}
        self.arena = Arena(self.spec, self.player, frozenset(self.tasks))
        self.buckets = difficulty_buckets(tasks, self.grpo)
        self.rng = random.Random(self.grpo.seed)
        self.selfplay = None if config.selfplay is None else SelfPlay(
            config.selfplay, scenario, actors, seats, self.grpo.seed,
            evaluate_against_start=bool(self.spec.tasks.eval_count))
        self.step_count = 0
        self.totals = {"masked_episodes": 0, "masked_credit": 0, "floored_groups": 0, "collapse_alarms": 0,
                       "episodes": 0}
        self.last_step: StepResult | None = None  # what the last step played and trained on
        self.masked_guard = MaskedRewardGuard(config.loop.max_masked_fraction, self.grpo.steps, log)
        # truncated prompts, completions at max_tokens, silent tools
        self.turn_guards = TurnGuards(self.spec, config.loop.truncation_warn_fraction,
                                      config.loop.tool_silence_steps, log)

    @property
    def pool(self):
        """The self-play opponent pool (None without self-play)."""
        return self.selfplay.pool if self.selfplay is not None else None

    @property
    def eval_opponents(self) -> dict:
        """Actors the held-out evaluation plays the policy against ({'initial': its start} in self-play)."""
        return self.selfplay.eval_opponents if self.selfplay is not None else {}

    def serving(self):
        """A context giving the episode player of the served policy: with train.selfplay.converge: average
        the mixture of the iterates' snapshots, one drawn per game (the live weights back when it ends);
        else the trainer's own player."""
        return self.selfplay.served(self.player, self.step_count) if self.selfplay is not None else \
            nullcontext(self.player)

    # -- one step, top to bottom ------------------------------------------------------------------

    def step(self, plan: StepPlan | None = None) -> dict[str, float]:
        """One multi-agent GRPO step (play -> score -> credit -> guards -> advantages -> update); its metrics."""
        plan, started = plan or StepPlan(), time.perf_counter()
        arena = plan.arena or self.arena
        bucket, tasks = self._draw_tasks(plan.tasks)
        opponent = self.selfplay.pick(self.rng) if self.selfplay is not None else None
        batch = self._play(arena, self._jobs(tasks, opponent, plan.prefix))
        played = time.perf_counter()
        rewards, credits = self._agent_rewards(arena, batch, plan.reward_transform)
        self._check_masked(batch, credits)
        rewards, guards = self._apply_safeguards(arena, batch, rewards)
        advantages = self._role_advantages(rewards)
        scored = time.perf_counter()
        updates = self._update(arena, batch, advantages, plan.lr_scale)
        self._record_results(arena, tasks, batch, credits, opponent)
        self.last_step = StepResult(batch, rewards, advantages, credits)
        times = {"time/play": played - started, "time/credit": scored - played,
                 "time/update": time.perf_counter() - scored, "time/step": time.perf_counter() - started}
        metrics = {**step_metrics(self, self.last_step, arena.spec.mode, bucket, guards, updates, times),
                   **self._selfplay_metrics(batch, opponent), **batch.figures}
        return {**metrics, **self.turn_guards.update(self.step_count, batch)}  # length/*, tools/*: warns when due

    def _draw_tasks(self, tasks):
        if tasks is not None:
            return -1, list(tasks)
        bucket, ids = self.buckets.sample_batch(self.grpo.prompts_per_step)
        return bucket, [self.tasks[i] for i in ids]

    def _jobs(self, tasks: list[Task], opponent, prefix: dict[str, str]) -> list[EpisodeJob]:
        """G jobs per task with distinct seeds; against an opponent the learner's seat alternates per task."""
        g, jobs = self.grpo.group_size, []
        for index, task in enumerate(tasks):
            seats = {} if opponent is None else SelfPlay.seats(opponent, self.agents, self.step_count + index)
            for member in range(g):
                seed = self.grpo.seed * 1_000_003 + self.step_count * 10_007 + index * g + member
                jobs.append(EpisodeJob(task, seed, seats=seats, prefix=prefix.get(task.id, "")))
        return jobs

    def _play(self, arena: Arena, jobs: list[EpisodeJob]) -> EpisodeBatch:
        """The jobs' episodes, played together by the arena's episode player."""
        arena.player.context = f"step {self.step_count + 1}"  # named by the Ray backend's error lines
        return arena.player.play(jobs)

    def _agent_rewards(self, arena: Arena, batch, reward_transform):
        """(episodes x agents) rewards and credit estimates (None where credit does not apply)."""
        cooperative = arena.spec.mode == "cooperative"
        credits = episode_credits(arena.player, batch.episodes, arena.spec.credit) if cooperative else None
        rows = []
        for index, episode in enumerate(batch.episodes):
            if credits is not None:
                row = {a: credits[index].values[a] if credits[index] is not None else math.nan for a in self.agents}
            else:
                row = {a: episode.rewards.get(a, math.nan) for a in self.agents}
            if reward_transform is not None:
                row = {a: reward_transform(episode, a, r) for a, r in row.items()}
            rows.append(row)
        shrink_rewards(rows, shrink_factors(batch.episodes, self.grpo.group_size, arena.spec),
                       self.grpo.group_size, self.agents)
        return rows, credits

    def _check_masked(self, batch, credits) -> None:
        """Feed the masked-reward guard: episodes masked by a scorer, or whose credit could not be split."""
        masked = [e for index, e in enumerate(batch.episodes)
                  if is_masked(e) or (credits is not None and credits[index] is None)]
        self.masked_guard.check(self.step_count, masked, len(batch.episodes))

    def _apply_safeguards(self, arena: Arena, batch, rewards):
        """Per agent: Self-BLEU per group, diversity penalty, floor reward (cooperative); the `guard/*` metrics."""
        cfg, tally = self.grpo, GuardTally()
        for agent in self.agents:
            texts = [" ".join(t.text for t in e.turns if t.agent == agent) for e in batch.episodes]
            column = repetition_guards(texts, [row[agent] for row in rewards], cfg, tally)
            if cfg.floor_reward > 0 and arena.spec.mode == "cooperative":
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
        g, progress, column, floored = self.grpo.group_size, self._progress(batch, agent), list(column), 0
        for start in range(0, len(column), g):
            team = [e.team_reward() for e in batch.episodes[start:start + g]]
            if all(math.isnan(r) or r <= 0 for r in team):
                column[start:start + g], count = apply_floor_reward(column[start:start + g], g,
                                                                    progress[start:start + g], self.grpo.floor_reward)
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
            advantages[agent] = group_advantages(column, self.grpo.group_size, self.grpo.scale_rewards).tolist()
        return advantages

    def _update(self, arena: Arena, batch, advantages, lr_scale: float) -> dict[str, dict]:
        """One update per learner on its actor's sampled turns (a learner that sampled nothing keeps its
        lr clock); its stats by learner."""
        updates = {}
        for name, learner in self.learners.items():
            if not batch.generations.get(name):
                updates[name] = learner.keep_clock()
                continue
            offpolicy = batch.offpolicy or self.actors[name].engine.offpolicy  # correct for another sampler
            updates[name] = learner.update(*self._samples(arena, batch, name, advantages), lr_scale=lr_scale,
                                           offpolicy=offpolicy)
        return updates

    def _samples(self, arena: Arena, batch, actor: str, advantages):
        """The actor's sampled turns as one Completions batch with each turn's advantage."""
        from trainers.policy.generation import concat_completions, select_rows

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
        self._mask_unheard(rows, [t for e in batch.episodes for t in e.turns if t.actor == actor], actor,
                           arena.spec.action_max_chars)
        return rows, torch.tensor(values, dtype=torch.float32, device=device)

    def _mask_unheard(self, rows, turns, actor: str, limit: int) -> None:
        """Mask 0 on completion tokens the environment never heard: past action_max_chars of a clipped
        message (and its stop token), so the policy is not trained on text that changed nothing."""
        from trainers.policy.prompts import heard_tokens

        for row, turn in enumerate(turns):
            if len(turn.text) <= limit:
                continue  # heard whole: the mask is the sampler's (relay's messages always are)
            kept = rows.completion_mask[row].nonzero().flatten()
            heard = heard_tokens(self.actors[actor].tokenizer, rows.completion_ids[row, kept].tolist(), limit)
            rows.completion_mask[row, kept[heard:]] = 0

    # -- bookkeeping ------------------------------------------------------------------------------

    def _record_results(self, arena: Arena, tasks, batch, credits, opponent) -> None:
        """Pass rates for the bucket sampler, the run's totals, and the self-play results; then the step
        ends: the count moves on and each learner ends its step (a moving KL reference moves)."""
        successes = [success(e, arena.spec.mode) for e in batch.episodes]
        record_pass_rates(self.buckets, tasks, successes, self.grpo.group_size, known=arena.known)
        self.totals["episodes"] += len(batch.episodes)
        self.totals["masked_episodes"] += sum(is_masked(e) for e in batch.episodes)
        if credits is not None:
            self.totals["masked_credit"] += masked_credit(batch.episodes, credits)
        if self.selfplay is not None:
            self.selfplay.record(batch.episodes, self.agents, opponent, self.step_count + 1)
        self.step_count += 1
        for learner in self.learners.values():
            learner.end_step(self.step_count)

    def _selfplay_metrics(self, batch, opponent) -> dict[str, float]:
        return self.selfplay.metrics(batch.episodes, self.agents, opponent) if self.selfplay is not None else {}

    def restart_frozen_copies(self) -> None:
        """After a warm-up changed the weights: the KL references and the opponent pool start from them."""
        for name, learner in self.learners.items():
            if learner.reference is not None:
                learner.reference.load_state_dict(self.actors[name].model.state_dict())
        if self.selfplay is not None:
            self.selfplay.restart()

    def anchor_references(self, make_reference) -> None:
        """Give each learner with a KL term the reference `make_reference(name, model)` returns (None keeps
        its own): a continual run anchors its KL to the earlier policy (trainers/continual.py)."""
        for name, learner in self.learners.items():
            reference = make_reference(name, self.actors[name].model) if learner.reference is not None else None
            if reference is not None:
                learner.set_reference(reference)

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
                "pool": self.selfplay.state_dict() if self.selfplay is not None else None,
                "scenario": resume_fingerprint(self.spec)}

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()` (same scenario, actors and config; more steps are allowed)."""
        changed = fingerprint_changes(state.get("scenario", {}), self.spec)
        if changed:
            raise ValueError(f"the checkpoint was made with a different scenario ({'; '.join(changed[:5])}); resume "
                             "with the same scenario and --set values (only step counts may change), or start a "
                             "new run directory")
        self.step_count, self.totals = load_core_state(state, self.buckets)
        for name, learner in self.learners.items():
            learner.load_state_dict(state["learners"][name])
        for name, generator_state in state["generators"].items():
            self.actors[name].generator.set_state(generator_state)
        for name, rng_state in state.get("scripted_rngs", {}).items():  # seeded scripted policies (random)
            self.actors[name].policy.rng.setstate(_as_tuple_state(rng_state))
        self.rng.setstate(_as_tuple_state(state["rng"]))
        if self.selfplay is not None and state.get("pool") is not None:
            self.selfplay.load_state_dict(state["pool"])


def _as_tuple_state(state):
    """random.Random states come back from torch.load as lists; setstate needs tuples."""
    version, internal, gauss = state
    return version, tuple(internal), gauss
