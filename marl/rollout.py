"""The one episode engine: play many episodes of a scenario in lockstep, with one batched call per
actor per turn. Training, evaluation, replay credit, scenario coalition values and `policies.rollout`
all play through `EpisodePlayer`.

`EpisodePlayer.play(jobs)` resets one environment per job and advances them all together: at every
turn-step the agents whose turn it is, in every live episode, are answered by ONE `act` call per
(actor, token budget) (batching across agents and episodes is where rollout speed comes from).
Each heard message is recorded as a `Turn`; turns a trainable model produced point at their row of
the sampled tokens, so the trainer can train on them once advantages are known. An actor is anything
with `act(requests, *, max_new_tokens, greedy)` returning `.texts` (and `.completions`, the sampled
tokens, or None); `PolicyActor` makes one of a plain `policy(agent, observation, task) -> text`.

Counterfactuals for credit assignment are jobs too. A job can carry a coalition: the agents outside
it are absent, in one of the `ABSENT_MODES` (the scenario's `credit.absent`):

    null_message    the absent agent's turns produce an empty message (the others see it said nothing)
    skip_turn       the absent agent's turns are skipped: nothing of it is heard or recorded
    default_policy  a stand-in policy (`credit.default_policy`, 'module:function') speaks for it
    resample        the agent's own actor samples a fresh message (a marginalising baseline); a
                    scripted policy is called with another seed, so it must accept `seed=`
    replay          as null_message, replaying the full-team episode: recorded messages are kept up to
                    the change, present agents regenerate what comes after it
    mask            no re-run at all: the full-team transcript with the absent agents' messages (and
                    their tool calls) blanked, scored again (`marl.credit.coalitions.masked_team_reward`)

Replays reuse recorded messages with common random numbers (the same input gets the same sample), by
one of two rules:

    reference   (turn, agent) -> recorded Turn: a present agent repeats its recorded message while
                its observation is unchanged, and is sampled afresh once what it sees differs (replay
                credit of a trainer's episodes, every mode). Replays sharing a `memo` share their
                fresh samples too: the same agent seeing the same thing at the same turn says the same
                thing in every coalition.
    history     the recorded transcript: a present agent repeats its next recorded message while the
                transcript so far is exactly the recorded one (the scenario coalition value's replay)
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from marl.types import Task

from marl.options import ABSENT_MODES  # the one list (documented above, mode by mode)
JUDGE_THREADS = 32  # threads scoring finished episodes at once (their judge calls overlap)


class AbsentModeError(ValueError):
    """An absent mode that cannot be played: unknown, or missing what it needs (a default policy)."""


def check_absent_mode(mode: str) -> str:
    """The mode if it is one of ABSENT_MODES, else an AbsentModeError listing them."""
    if mode not in ABSENT_MODES:
        raise AbsentModeError(f"absent={mode!r} is not one of {', '.join(ABSENT_MODES)}")
    return mode


def team_reward(rewards: dict[str, float]) -> float:
    """The cooperative team reward of per-agent rewards (all equal), NaN when there are none."""
    values = list(rewards.values())
    return values[0] if values else math.nan


@dataclass
class Turn:
    """One heard message: who said what, seeing what, and (for model output) where its tokens are."""

    agent: str
    turn: int
    observation: str
    text: str
    actor: str | None = None  # the actor that generated it (None: absent / replayed / default policy)
    batch: int | None = None  # index into EpisodeBatch.generations[actor]
    row: int | None = None


@dataclass
class EpisodeJob:
    """One episode to play: a task and seed, optional seat overrides, optional counterfactual."""

    task: Task  # a Task (or a task id, an index, None: drawn with the seed, as ScenarioEnv.reset takes)
    seed: int
    seats: dict[str, str] = field(default_factory=dict)  # agent -> actor, overriding the default seating
    coalition: frozenset | None = None  # counterfactual: only these agents are present (None: everyone)
    absent_mode: str = "null_message"
    reference: dict[tuple[int, str], Turn] | None = None  # (turn, agent) -> recorded turn (observation rule)
    prefix: str = ""  # prepended to every observation (the reflection stage's failure reason)
    memo: dict | None = None  # shared by the replays of one episode: (turn, agent, seen, present) -> message
    history: list[dict] | None = None  # recorded transcript (agent, text, turn): the history rule


@dataclass
class Episode:
    """What one job produced."""

    job: EpisodeJob
    turns: list[Turn]
    rewards: dict[str, float]
    breakdown: dict
    transcript: list[dict]
    tool_validity: dict[str, float | None]
    tool_log: list = field(default_factory=list)
    task: Task | None = None  # the task played (job.task resolved by the environment)
    policy_version: int | None = None  # the weights' version it was sampled at (Ray backend; None: current)

    def team_reward(self) -> float:
        """The cooperative team reward (every agent's reward is the same), NaN when masked."""
        return team_reward(self.rewards)

    def reference(self) -> dict[tuple[int, str], Turn]:
        """The turns keyed by (turn index, agent), for counterfactual replays of this episode."""
        return {(t.turn, t.agent): t for t in self.turns}


@dataclass
class EpisodeBatch:
    """Episodes played together and the sampled tokens of every generate call, per actor.

    figures: the player's own figures of how it played (the Ray backend's ray/*; {} in this process);
    offpolicy: some episode was sampled by weights older than the learner's (the Ray backend with
    max_staleness > 0), so the update corrects for the sampler (train.tis_cap).
    """

    episodes: list[Episode]
    generations: dict[str, list] = field(default_factory=lambda: defaultdict(list))
    figures: dict[str, float] = field(default_factory=dict)
    offpolicy: bool = False


@dataclass
class Generation:
    """What an actor said for a batch: texts, and the sampled tokens when a model produced them."""

    texts: list
    completions: object | None = None  # trainers.policy.generation.Completions of a model actor, row i = texts[i]


class PolicyActor:
    """A frozen `policy(agent, observation, task) -> text` as an actor (token budgets are ignored).

    Without `order`, a policy with a `batch(requests)` method (an LLM answering many prompts at once)
    gets one call per batch. With `order` (agent names), the policy is called once per request, in
    that order within a batch, as a loop over the environment's agents would call it (the order
    matters to a policy with state, such as a seeded random one)."""

    trainable = False

    def __init__(self, policy, order=None):
        self.policy = policy
        self.rank = {agent: index for index, agent in enumerate(order)} if order is not None else None

    def act(self, requests: list[tuple[str, str, Task]], *, max_new_tokens=None, greedy: bool = False,
            keys=None) -> Generation:
        """One message per request (see the class doc; `keys` are ignored)."""
        batch = getattr(self.policy, "batch", None) if self.rank is None else None
        if batch is not None:
            return Generation(list(batch(list(requests))))
        indices = range(len(requests))
        if self.rank is not None:
            indices = sorted(indices, key=lambda i: self.rank.get(requests[i][0], len(self.rank)))
        texts = [None] * len(requests)
        for i in indices:
            texts[i] = self.policy(*requests[i])
        return Generation(texts)


class EpisodePlayer:
    """Plays jobs of one scenario in lockstep with its actors (environments are reused across calls).

    `default_policy`: the stand-in of absent_mode default_policy (None: the scenario's
    credit.default_policy, resolved when first needed). `env`: the first environment (its tasks and
    scorer are shared by the others; default: a new ScenarioEnv). `max_tokens`: each agent's token
    budget (default: the scenario's); agents with the same actor and budget are answered in one call.
    """

    def __init__(self, scenario, actors: dict, seats: dict[str, str], *, default_policy=None, env=None,
                 max_tokens: dict | None = None):
        from marl.env import ScenarioEnv

        self.scenario, self.actors, self.seats = scenario, actors, seats
        self._default_policy = default_policy
        self.max_tokens = dict(max_tokens) if max_tokens is not None else \
            {agent.name: agent.max_tokens for agent in scenario.spec.agents}
        self._first = env if env is not None else ScenarioEnv(scenario)
        self._envs = [self._first]
        self.judged = bool(scenario.spec.judges)  # model judges: score finished episodes concurrently

    @property
    def scorer(self):
        """The reward scorer every environment shares (judges are built once)."""
        return self._first.scorer

    @property
    def visibility(self):
        """The scenario's visibility graph (who sees whose messages): Myerson credit's graph."""
        return self._first.visibility

    @property
    def default_policy(self):
        """The stand-in for absent agents (absent_mode default_policy), or None when there is none."""
        if self._default_policy is None and self.scenario.spec.credit.default_policy:
            self._default_policy = self.scenario.resolve(self.scenario.spec.credit.default_policy)
        return self._default_policy

    def _environments(self, count: int) -> list:
        from marl.env import ScenarioEnv

        while len(self._envs) < count:
            self._envs.append(ScenarioEnv(self.scenario, tasks=self._first.tasks, scorer=self._first.scorer))
        return self._envs[:count]

    def play(self, jobs: list[EpisodeJob], *, greedy: bool = False) -> EpisodeBatch:
        """Play every job to the end; returns the episodes and the sampled tokens."""
        batch = EpisodeBatch(episodes=[])
        envs = self._environments(len(jobs))
        for env, job in zip(envs, jobs):  # start/advance/observe: env.reset/step without every agent's dicts
            env.start(seed=job.seed, options={"task": job.task, "absent": self._skipped(job)})
        turns, rewards = [[] for _ in jobs], [{} for _ in jobs]
        while any(env.agents for env in envs):
            live = [k for k, env in enumerate(envs) if env.agents]
            texts = self._answer_turn(jobs, envs, live, turns, batch, greedy)
            for k, result in zip(live, self._step_all([envs[k] for k in live], [
                    {agent: {"text": texts.get((k, agent), "")} for agent in envs[k].agents} for k in live])):
                rewards[k] = result[0]
        for k, (env, job) in enumerate(zip(envs, jobs)):
            validity = {agent: env.tool_validity(agent) for agent in rewards[k]}
            batch.episodes.append(Episode(job, turns[k], rewards[k], env.breakdown or {},
                                          [dict(t) for t in env.transcript], validity, list(env.tool_log),
                                          task=env.task))
        return batch

    def _step_all(self, envs: list, actions: list[dict]) -> list[tuple]:
        """env.advance for every live episode. When the step ends the episodes of a scenario with model
        judges, the steps run in threads, so the judges' requests go out concurrently (each backend
        still caps its own concurrency); otherwise one after the other."""
        last_turn = all(env.turn_index == len(env.turns) - 1 for env in envs)
        if not (self.judged and last_turn and len(envs) > 1):
            return [env.advance(action) for env, action in zip(envs, actions)]

        with ThreadPoolExecutor(max_workers=min(len(envs), JUDGE_THREADS)) as pool:
            return list(pool.map(lambda pair: pair[0].advance(pair[1]), zip(envs, actions)))

    def _skipped(self, job: EpisodeJob) -> frozenset:
        if job.coalition is None or job.absent_mode != "skip_turn":
            return frozenset()
        return frozenset(self.scenario.agent_names) - job.coalition

    def _answer_turn(self, jobs, envs, live, turns, batch, greedy) -> dict[tuple[int, str], str]:
        """Texts of every acting agent of the live episodes: replayed, absent, or one batched call per actor."""
        texts, requests, followers = {}, defaultdict(list), defaultdict(list)
        for k in live:
            job, env = jobs[k], envs[k]
            for agent in env.acting_agents():
                observation = job.prefix + env.observe(agent)["text"]
                turn = Turn(agent, env.turn_index, observation, "")
                turns[k].append(turn)
                decided = self._without_generation(job, agent, turn, env)
                key = self._memo_key(job, turn)
                if decided is None and key is not None:
                    decided = job.memo.get(key)
                    if decided is None and (id(job.memo), key) in followers:  # another replay asked already
                        followers[id(job.memo), key].append((k, turn))
                        continue
                if decided is not None:
                    turn.text = texts[k, agent] = decided
                    continue
                if key is not None:
                    followers[id(job.memo), key] = []
                requests[self._actor_for(job, agent), self.max_tokens[agent]].append((k, turn))
        for (actor_name, max_tokens), pending, generation in self._generate(requests, jobs, envs, greedy):
            record = generation.completions is not None and self.actors[actor_name].trainable
            if record:
                batch.generations[actor_name].append(generation.completions)
            for row, ((k, turn), text) in enumerate(zip(pending, generation.texts)):
                turn.text = texts[k, turn.agent] = text
                if record:
                    turn.actor, turn.batch, turn.row = actor_name, len(batch.generations[actor_name]) - 1, row
                key = self._memo_key(jobs[k], turn)
                if key is not None:
                    jobs[k].memo[key] = text
                    for other, follower in followers.get((id(jobs[k].memo), key), ()):
                        follower.text = texts[other, follower.agent] = text
        return texts

    def _generate(self, requests: dict, jobs, envs, greedy: bool):
        """((actor, max_tokens), pending, Generation) per request list: one `act` call each, except that
        actors sharing a `batch_group` (LoRA adapters on one base model) answer in one `act_together` call."""
        groups: dict = defaultdict(list)
        for (actor_name, max_tokens), pending in requests.items():
            group = getattr(self.actors[actor_name], "batch_group", None)
            groups[(group, max_tokens) if group is not None else (actor_name, max_tokens, "alone")].append(
                ((actor_name, max_tokens), pending))
        for members in groups.values():
            calls = [(self.actors[name], [(t.agent, t.observation, envs[k].task) for k, t in pending],
                      [turn_key(jobs[k], t) for k, t in pending]) for (name, _), pending in members]
            max_tokens = members[0][0][1]
            if len(calls) == 1:
                actor, asked, keys = calls[0]
                generations = [actor.act(asked, max_new_tokens=max_tokens, greedy=greedy, keys=keys)]
            else:
                generations = calls[0][0].act_together(calls, max_new_tokens=max_tokens, greedy=greedy)
            yield from ((request, pending, generation) for (request, pending), generation in zip(members, generations))

    @staticmethod
    def _memo_key(job: EpisodeJob, turn: Turn):
        """Replays of one episode share their fresh samples: the same agent seeing the same thing at the
        same turn says the same thing in every coalition (common random numbers across coalitions)."""
        if job.memo is None:
            return None
        present = job.coalition is None or turn.agent in job.coalition
        return turn.turn, turn.agent, turn.observation, present

    def _actor_for(self, job: EpisodeJob, agent: str) -> str:
        return job.seats.get(agent, self.seats[agent])

    def _without_generation(self, job: EpisodeJob, agent: str, turn: Turn, env) -> str | None:
        """The message when no sampling is needed: absent agents and unchanged replayed turns."""
        present = job.coalition is None or agent in job.coalition
        if not present:
            if job.absent_mode == "default_policy":
                if self.default_policy is None:
                    raise AbsentModeError("credit.absent 'default_policy' needs credit.default_policy "
                                          "(module:function)")
                return str(self.default_policy(agent, turn.observation, env.task))
            if job.absent_mode == "resample":
                return None
            return ""
        if job.history is not None:  # history rule: the recorded message while nothing heard has changed
            index, history = len(env.transcript), job.history
            if index < len(history) and history[index]["agent"] == agent and env.transcript == history[:index]:
                return history[index]["text"]
            return None
        recorded = job.reference.get((turn.turn, agent)) if job.reference else None
        if recorded is not None and recorded.observation == turn.observation:
            return recorded.text
        return None


def turn_key(job: EpisodeJob, turn: Turn) -> int:
    """The random stream of one message: keyed by (episode seed, turn, agent), never by call order, so
    a message is sampled the same in any batch, on any worker (see `keyed_uniforms`)."""
    return stream_key(job.seed, turn.turn, turn.agent)


def stream_key(*parts: int | str) -> int:
    """A 63-bit key naming one random stream, from ints and strings, the same in every process (unlike
    `hash`, which salts strings per process): the sampler's row keys (seed, turn, agent, ...)."""
    text = "\x1f".join(f"{type(part).__name__}:{part}" for part in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def policy_player(env, policy, *, default_policy=None, order=None) -> EpisodePlayer:
    """A player in which one policy speaks for every agent of `env` (reused as the first environment)."""
    agents = list(env.possible_agents)
    return EpisodePlayer(env.scenario, {"policy": PolicyActor(policy, order)}, dict.fromkeys(agents, "policy"),
                         default_policy=default_policy, env=env, max_tokens=dict.fromkeys(agents))
