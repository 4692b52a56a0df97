"""Self-play, plugged into the team trainer: who the learner faces each step, and what it learns of them.

A competitive scenario with `train.selfplay` on (the default for competitive and mixed modes) plays,
on a share of steps, against a snapshot from an `OpponentPool` instead of itself, taking alternate seats
per task; each episode's result updates the snapshot's rating, and a snapshot joins the pool every
`snapshot_every` steps. A share of steps may instead face one of the scenario's fixed `opponents`
(`fixed_opponents`). The trainer calls, each step:

    opponent = selfplay.pick(rng)              None (self-play), a snapshot's pool id, or FIXED + a name
    seats = SelfPlay.seats(opponent, agents, k) the opponent's seats in the k-th task of a step against one
    selfplay.record(episodes, agents, opponent, step)   ratings, and a snapshot when one is due
    selfplay.metrics(episodes, agents, opponent)        selfplay/* of the step

It adds its frozen actors (the snapshot player, fixed opponents, the initial policy) to the actors
dict the episode player plays from; it never writes the trainer's fields. With `converge: average` it
also keeps the iterates' snapshots and serves their mixture to the evaluation (`served`, trainers/team/
served.py); `converge: mmd` is the GRPO KL term resolved by trainers.config.magnet_knobs, nothing here.
"""

from __future__ import annotations

from contextlib import nullcontext

from marl.rollout import PolicyActor
from marl.selfplay import OpponentPool
from trainers.policy.actors import ModelActor
from trainers.policy.adapters import opponent_model
from trainers.team.metrics import FIXED, fixed_opponent_score, match_scores
from trainers.team.served import ServedAverage, snapshot

OPPONENT = "opponent"  # the actor that plays a pool snapshot's seats
INITIAL = "initial"  # the evaluation's opponent: the policy as the run started


def opponent_actor(opponent: str) -> str:
    """The actor that plays the opponent's seats: a fixed opponent's own, else the snapshot actor."""
    return opponent if opponent.startswith(FIXED) else OPPONENT


class SelfPlay:
    """The opponent pool, the fixed opponents and the initial policy of a self-play run (module docstring)."""

    def __init__(self, settings, scenario, actors: dict, seats: dict[str, str], seed: int, *,
                 evaluate_against_start: bool):
        self.settings, self.scenario, self.actors, self.seed = settings, scenario, actors, seed
        shared = actors.get("shared")
        if shared is None or not shared.trainable or set(seats.values()) != {"shared"}:
            raise ValueError("self-play needs every agent on the one trainable 'shared' policy; set "
                             "train.selfplay.enabled: false or make every agent's policy 'shared'")
        self.pool = self._opponent_pool()
        self.average = None if settings.converge != "average" else ServedAverage(shared.model, settings.average_every,
                                                                                 seed)
        # only a run with a held-out set evaluates against its start (the copy costs one frozen model)
        self.eval_opponents = {INITIAL: self._frozen_actor(INITIAL, seed_offset=98)} if evaluate_against_start else {}

    def pick(self, rng):
        """None (self-play), a fixed opponent (FIXED + its name) or the pool id of the snapshot the learner
        faces this step; the snapshot's weights are loaded into the opponent actor."""
        if self.settings.fixed_opponents:  # drawn only when configured: runs without them keep their draws
            draw = rng.random()
            for name, share in self.settings.fixed_opponents.items():
                if draw < share:
                    return self._fixed_opponent(name)
                draw -= share
        if rng.random() < self.settings.self_play_fraction:
            return None
        opponent_id, snapshot = self.pool.sample()
        self.actors[OPPONENT].model.load_state_dict(snapshot)
        return opponent_id

    @staticmethod
    def seats(opponent: str, agents: list[str], turn: int) -> dict[str, str]:
        """Agent -> actor of the opponent's seats in a task: the learner takes seat `turn` mod the seats."""
        learner_seat = agents[turn % len(agents)]
        return {agent: opponent_actor(opponent) for agent in agents if agent != learner_seat}

    def record(self, episodes, agents: list[str], opponent, step: int) -> None:
        """Match results against a pool snapshot to its rating (a fixed opponent has none: its score is the
        step's selfplay/fixed/NAME/score); after step `step` (1-based), a snapshot when one is due."""
        if opponent is not None and not opponent.startswith(FIXED):
            for score in match_scores(episodes, agents, OPPONENT):
                self.pool.record(opponent, score)
        if step % self.settings.snapshot_every == 0:
            self.pool.add_snapshot(step, snapshot(self.actors["shared"].model))
        if self.average is not None:
            self.average.record(step)

    def metrics(self, episodes, agents: list[str], opponent) -> dict[str, float]:
        """selfplay/*: the pool's ratings, whom the learner faced, its score against a fixed opponent."""
        metrics = dict(self.pool.ratings_metrics())
        fixed = opponent is not None and opponent.startswith(FIXED)
        metrics["selfplay/against_snapshot"] = float(opponent is not None and not fixed)
        metrics["selfplay/against_fixed"] = float(fixed)
        if fixed:
            metrics[f"selfplay/{opponent.replace(':', '/')}/score"] = fixed_opponent_score(episodes, agents, opponent)
        if self.average is not None:
            metrics.update(self.average.metrics())
        return metrics

    def served(self, player, step: int):
        """A context giving the player of the served policy after step `step`: the mixture of the iterates
        with converge: average (the live weights restored when it ends), else `player` itself."""
        return nullcontext(player) if self.average is None else self.average.serving(player, step)

    def restart(self) -> None:
        """After a warm-up changed the weights: the pool starts again from them."""
        self.pool = self._opponent_pool()
        if self.average is not None:
            self.average.restart()

    def _opponent_pool(self):
        self.actors[OPPONENT] = self._frozen_actor(OPPONENT, seed_offset=99)
        pool = OpponentPool(max_size=self.settings.pool_size, strategy=self.settings.strategy,
                            ratings=self.settings.ratings, seed=self.seed)
        pool.add_snapshot(0, snapshot(self.actors["shared"].model))
        return pool

    def _frozen_actor(self, name: str, *, seed_offset: int):
        """A frozen ModelActor `name` holding a copy of the shared policy's weights now (with LoRA: a frozen
        adapter on the same base), with its sampling settings, roles and prompt style."""
        from trainers.grpo.learner import frozen_copy

        shared = self.actors["shared"]
        return ModelActor(name, opponent_model(shared.model, name, frozen_copy), shared.tokenizer, trainable=False,
                          temperature=shared.temperature, top_p=shared.top_p, seed=self.seed + seed_offset,
                          styles=shared.styles)

    def _fixed_opponent(self, name: str) -> str:
        """The id of the scenario's fixed opponent `name`, its actor built on first use."""
        from marl.policies import get_policy

        opponent = FIXED + name
        if opponent not in self.actors:  # called in seat order, as a loop over the agents would (seeded)
            policy = get_policy(self.scenario.spec.opponents[name], self.scenario, self.seed)
            self.actors[opponent] = PolicyActor(policy, order=list(self.scenario.agent_names))
        return opponent

    def state_dict(self) -> dict:
        """The pool (snapshots and ratings) for a checkpoint, and with converge: average the iterates'."""
        state = self.pool.state_dict()
        return state if self.average is None else {**state, "average": self.average.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()`."""
        self.pool.load_state_dict(state)
        if self.average is not None and "average" in state:
            self.average.load_state_dict(state["average"])
