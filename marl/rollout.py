"""Play many episodes of a scenario in lockstep, with one batched generate call per actor per turn.

`EpisodePlayer.play(jobs)` resets one environment per job and advances them all together: at every
turn-step the agents whose turn it is, in every live episode, are answered by ONE `act` call per
(actor, token budget) (batching across agents and episodes is where rollout speed comes from).
Each heard message is recorded as a `Turn`; turns a trainable model produced point at their row of
the sampled tokens, so the trainer can train on them once advantages are known.

Counterfactual replays for credit assignment are jobs too. A job can carry a `reference` (the turns
of an episode already played) and a coalition: agents outside it are absent (`absent_mode`), agents
inside it repeat their recorded message while their observation is unchanged (common random
numbers: the same input gets the same sample), and are sampled afresh once what they see differs.

    null_message    the absent agent's turns produce an empty message
    skip_turn       the absent agent's turns are skipped (nothing of it is heard or recorded)
    default_policy  a stand-in actor (credit.default_policy) speaks for it
    resample        the agent's own actor samples a fresh message (a marginalising baseline)
    replay          as null_message (the recorded prefix is kept, downstream agents regenerate)
    mask            handled without playing: see `marl.credit.coalitions.masked_team_reward`
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from marl.types import Task


JUDGE_THREADS = 32  # threads scoring finished episodes at once (their judge calls overlap)


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

    task: Task
    seed: int
    seats: dict[str, str] = field(default_factory=dict)  # agent -> actor, overriding the default seating
    coalition: frozenset | None = None  # counterfactual: only these agents are present (None: everyone)
    absent_mode: str = "null_message"
    reference: dict[tuple[int, str], Turn] | None = None  # (turn, agent) -> recorded turn
    prefix: str = ""  # prepended to every observation (the reflection stage's failure reason)
    memo: dict | None = None  # shared by the replays of one episode: (turn, agent, seen, present) -> message


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

    def team_reward(self) -> float:
        """The cooperative team reward (every agent's reward is the same), NaN when masked."""
        from marl.credit.coalitions import team_reward

        return team_reward(self.rewards)

    def reference(self) -> dict[tuple[int, str], Turn]:
        """The turns keyed by (turn index, agent), for counterfactual replays of this episode."""
        return {(t.turn, t.agent): t for t in self.turns}


@dataclass
class EpisodeBatch:
    """Episodes played together and the sampled tokens of every generate call, per actor."""

    episodes: list[Episode]
    generations: dict[str, list] = field(default_factory=lambda: defaultdict(list))


class EpisodePlayer:
    """Plays jobs of one scenario in lockstep with its actors (environments are reused across calls)."""

    def __init__(self, scenario, actors: dict, seats: dict[str, str], *, default_policy=None):
        from marl.env import ScenarioEnv

        self.scenario, self.actors, self.seats = scenario, actors, seats
        credit = scenario.spec.credit
        if default_policy is None and credit.default_policy:
            default_policy = scenario.resolve(credit.default_policy)
        self.default_policy = default_policy
        self.max_tokens = {agent.name: agent.max_tokens for agent in scenario.spec.agents}
        self._first = ScenarioEnv(scenario)
        self._envs = [self._first]
        self.judged = bool(scenario.spec.judges)  # model judges: score finished episodes concurrently

    @property
    def scorer(self):
        """The reward scorer every environment shares (judges are built once)."""
        return self._first.scorer

    def _environments(self, count: int) -> list:
        from marl.env import ScenarioEnv

        while len(self._envs) < count:
            self._envs.append(ScenarioEnv(self.scenario, tasks=self._first.tasks, scorer=self._first.scorer))
        return self._envs[:count]

    def play(self, jobs: list[EpisodeJob], *, greedy: bool = False) -> EpisodeBatch:
        """Play every job to the end; returns the episodes and the sampled tokens."""
        batch = EpisodeBatch(episodes=[])
        envs = self._environments(len(jobs))
        observations = [env.reset(seed=job.seed, options={"task": job.task, "absent": self._skipped(job)})[0]
                        for env, job in zip(envs, jobs)]
        turns, rewards, infos = [[] for _ in jobs], [{} for _ in jobs], [{} for _ in jobs]
        while any(env.agents for env in envs):
            live = [k for k, env in enumerate(envs) if env.agents]
            texts = self._answer_turn(jobs, envs, observations, live, turns, batch, greedy)
            for k, result in zip(live, self._step_all([envs[k] for k in live], [
                    {agent: {"text": texts.get((k, agent), "")} for agent in envs[k].agents} for k in live])):
                observations[k], rewards[k], _, _, infos[k] = result
        for k, (env, job) in enumerate(zip(envs, jobs)):
            validity = {agent: info.get("tool_validity") for agent, info in infos[k].items()}
            batch.episodes.append(Episode(job, turns[k], rewards[k], env.breakdown or {},
                                          [dict(t) for t in env.transcript], validity, list(env.tool_log)))
        return batch

    def _step_all(self, envs: list, actions: list[dict]) -> list[tuple]:
        """env.step for every live episode. When the step ends the episodes of a scenario with model
        judges, the steps run in threads, so the judges' requests go out concurrently (each backend
        still caps its own concurrency); otherwise one after the other."""
        last_turn = all(env.turn_index == len(env.turns) - 1 for env in envs)
        if not (self.judged and last_turn and len(envs) > 1):
            return [env.step(action) for env, action in zip(envs, actions)]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(len(envs), JUDGE_THREADS)) as pool:
            return list(pool.map(lambda pair: pair[0].step(pair[1]), zip(envs, actions)))

    def _skipped(self, job: EpisodeJob) -> frozenset:
        if job.coalition is None or job.absent_mode != "skip_turn":
            return frozenset()
        return frozenset(self.scenario.agent_names) - job.coalition

    def _answer_turn(self, jobs, envs, observations, live, turns, batch, greedy) -> dict[tuple[int, str], str]:
        """Texts of every acting agent of the live episodes: replayed, absent, or one batched call per actor."""
        texts, requests, followers = {}, defaultdict(list), defaultdict(list)
        for k in live:
            job, env = jobs[k], envs[k]
            for agent in env.acting_agents():
                observation = job.prefix + observations[k][agent]["text"]
                turn = Turn(agent, env.turn_index, observation, "")
                turns[k].append(turn)
                decided = self._without_generation(job, agent, turn, env.task)
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
        for (actor_name, max_tokens), pending in requests.items():
            generation = self.actors[actor_name].act([(t.agent, t.observation, envs[k].task) for k, t in pending],
                                                     max_new_tokens=max_tokens, greedy=greedy)
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

    def _without_generation(self, job: EpisodeJob, agent: str, turn: Turn, task: Task) -> str | None:
        """The message when no sampling is needed: absent agents and unchanged replayed turns."""
        present = job.coalition is None or agent in job.coalition
        if not present:
            if job.absent_mode == "default_policy":
                if self.default_policy is None:
                    raise ValueError("credit.absent 'default_policy' needs credit.default_policy (module:function)")
                return str(self.default_policy(agent, turn.observation, task))
            if job.absent_mode == "resample":
                return None
            return ""
        recorded = job.reference.get((turn.turn, agent)) if job.reference else None
        if recorded is not None and recorded.observation == turn.observation:
            return recorded.text
        return None
