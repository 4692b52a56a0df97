"""Self-play opponent pool with ratings, for competitive (zero-sum) scenarios.

The learner trains against itself and against frozen snapshots of its past selves:

    pool = OpponentPool(max_size=8, strategy="prioritised", ratings="elo", seed=0)
    pool.add_snapshot(step, {name: p.detach().cpu().clone() for name, p in model.state_dict().items()})
    opponent_id, snapshot = pool.sample()
    ...play an episode, the learner against `snapshot`...
    pool.record(opponent_id, match_score(result.rewards, learner_agents, opponent_agents))
    tracker.log(pool.ratings_metrics())

Snapshots are opaque: the pool stores whatever the caller gives and hands it back. The learner is the
player "learner"; a new snapshot starts at the learner's current rating, since it is the learner as it
is now. Sampling strategies:

- `latest`: the newest snapshot (classic self-play);
- `uniform`: any snapshot with equal probability (fictitious self-play);
- `prioritised`: prioritised fictitious self-play (AlphaStar's PFSP "hard" weighting): an opponent is
  drawn with weight (1 - P(learner beats it)) ** p, p = 2 by default, from the ratings' expected score,
  so the snapshots that still beat the learner are played most.

Ratings are Elo (`EloRatings`) or TrueSkill (`TrueSkillRatings`, the `trueskill` package, imported lazily).
`IterateMixture` holds the snapshots of `converge: average`: the average of the iterates, served as a
mixture drawn once per game. This module loads no torch.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import trueskill

LEARNER = "learner"
RATING_KINDS = ("elo", "trueskill")
STRATEGIES = ("latest", "uniform", "prioritised")


def _check_score(score: float) -> float:
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"score_a must be in [0, 1] (1 win, 0.5 draw, 0 loss), got {score}")
    return float(score)


class Ratings(Protocol):
    """What the pool needs from a rating system."""

    def rating(self, player: str) -> float: ...
    def expected(self, a: str, b: str) -> float: ...
    def update(self, a: str, b: str, score_a: float) -> None: ...
    def copy(self, source: str, target: str) -> None: ...
    def remove(self, player: str) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class EloRatings:
    """Elo ratings: every player starts at `initial`; an update moves both by k * (score - expected)."""

    k_factor: float = 32.0
    initial: float = 1000.0
    scale: float = 400.0  # a `scale` lead means 10:1 odds
    ratings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if self.k_factor <= 0 or self.scale <= 0:
            raise ValueError(f"k_factor and scale must be positive, got {self.k_factor} and {self.scale}")

    def rating(self, player: str) -> float:
        """The player's rating (`initial` for a player never seen)."""
        return self.ratings.get(player, self.initial)

    def expected(self, a: str, b: str) -> float:
        """Expected score of a against b: 1 / (1 + 10 ** ((R_b - R_a) / scale))."""
        return 1.0 / (1.0 + 10.0 ** ((self.rating(b) - self.rating(a)) / self.scale))

    def update(self, a: str, b: str, score_a: float) -> None:
        """Rate one game; b scores 1 - score_a, so the sum of the two ratings is unchanged."""
        delta = self.k_factor * (_check_score(score_a) - self.expected(a, b))
        self.ratings[a], self.ratings[b] = self.rating(a) + delta, self.rating(b) - delta

    def copy(self, source: str, target: str) -> None:
        """Give `target` the current rating of `source`."""
        self.ratings[target] = self.rating(source)

    def remove(self, player: str) -> None:
        """Forget a player."""
        self.ratings.pop(player, None)

    def state_dict(self) -> dict:
        """Plain, JSON-able state."""
        return {"kind": "elo", "k_factor": self.k_factor, "initial": self.initial, "scale": self.scale,
                "ratings": dict(self.ratings)}

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()` of Elo ratings."""
        _check_kind(state, "elo")
        self.k_factor, self.initial, self.scale = state["k_factor"], state["initial"], state["scale"]
        self.ratings = {player: float(value) for player, value in state["ratings"].items()}


@dataclass
class TrueSkillRatings:
    """TrueSkill ratings (mu, sigma per player). `rating(id)` is the CONSERVATIVE skill mu - 3 sigma (the
    TrueSkill leaderboard value, 0 for a new player with the defaults), so it rises both when mu rises
    and when the system grows surer; `mu(id)` and `sigma(id)` give the parts. A score above 0.5 counts as
    a win, below as a loss, exactly 0.5 as a draw."""

    initial_mu: float = 25.0
    initial_sigma: float = 25.0 / 3.0
    beta: float | None = None  # default initial_sigma / 2, as in TrueSkill
    tau: float | None = None  # default initial_sigma / 100
    draw_probability: float = 0.1
    players: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self):
        self.beta = self.initial_sigma / 2.0 if self.beta is None else self.beta
        self.tau = self.initial_sigma / 100.0 if self.tau is None else self.tau
        self._build_env()

    def _build_env(self) -> None:
        self._env = trueskill.TrueSkill(mu=self.initial_mu, sigma=self.initial_sigma, beta=self.beta,
                                        tau=self.tau, draw_probability=self.draw_probability)

    def mu(self, player: str) -> float:
        """Mean skill."""
        return self.players.get(player, (self.initial_mu, self.initial_sigma))[0]

    def sigma(self, player: str) -> float:
        """Uncertainty of the skill (standard deviation)."""
        return self.players.get(player, (self.initial_mu, self.initial_sigma))[1]

    def rating(self, player: str) -> float:
        """Conservative skill estimate mu - 3 sigma."""
        return self.mu(player) - 3.0 * self.sigma(player)

    def expected(self, a: str, b: str) -> float:
        """P(a beats b) = Phi((mu_a - mu_b) / sqrt(2 beta^2 + sigma_a^2 + sigma_b^2)), draws ignored."""
        spread = math.sqrt(2 * self.beta ** 2 + self.sigma(a) ** 2 + self.sigma(b) ** 2)
        return 0.5 * (1.0 + math.erf((self.mu(a) - self.mu(b)) / (spread * math.sqrt(2.0))))

    def update(self, a: str, b: str, score_a: float) -> None:
        """Rate one game between a and b with TrueSkill's 1-vs-1 update."""
        score_a = _check_score(score_a)
        rating_a, rating_b = (self._env.create_rating(*self.players.get(p, (self.initial_mu, self.initial_sigma)))
                              for p in (a, b))
        if score_a < 0.5:
            new_b, new_a = self._env.rate_1vs1(rating_b, rating_a)
        else:
            new_a, new_b = self._env.rate_1vs1(rating_a, rating_b, drawn=score_a == 0.5)
        self.players[a], self.players[b] = (new_a.mu, new_a.sigma), (new_b.mu, new_b.sigma)

    def copy(self, source: str, target: str) -> None:
        """Give `target` the current mu and sigma of `source`."""
        self.players[target] = (self.mu(source), self.sigma(source))

    def remove(self, player: str) -> None:
        """Forget a player."""
        self.players.pop(player, None)

    def state_dict(self) -> dict:
        """Plain, JSON-able state."""
        return {"kind": "trueskill", "initial_mu": self.initial_mu, "initial_sigma": self.initial_sigma,
                "beta": self.beta, "tau": self.tau, "draw_probability": self.draw_probability,
                "players": {player: list(value) for player, value in self.players.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()` of TrueSkill ratings."""
        _check_kind(state, "trueskill")
        self.initial_mu, self.initial_sigma = state["initial_mu"], state["initial_sigma"]
        self.beta, self.tau, self.draw_probability = state["beta"], state["tau"], state["draw_probability"]
        self.players = {player: (float(mu), float(sigma)) for player, (mu, sigma) in state["players"].items()}
        self._build_env()


def _check_kind(state: dict, kind: str) -> None:
    if state.get("kind") != kind:
        raise ValueError(f"cannot load {state.get('kind')!r} ratings into {kind!r} ratings")


def make_ratings(kind: str, **options) -> EloRatings | TrueSkillRatings:
    """A rating system by name: "elo" (options of EloRatings) or "trueskill" (of TrueSkillRatings)."""
    if kind == "elo":
        return EloRatings(**options)
    if kind == "trueskill":
        return TrueSkillRatings(**options)
    raise ValueError(f"unknown ratings kind {kind!r}: use one of {', '.join(RATING_KINDS)}")


@dataclass
class PoolEntry:
    """One frozen opponent: its id ("step-40"), the training step it was taken at, the caller's object."""

    id: str
    step: int
    snapshot: Any


class OpponentPool:
    """Past snapshots of the learner, rated against it, and sampled as opponents (see the module docstring)."""

    def __init__(self, max_size: int = 8, strategy: str = "latest", ratings: str = "elo", seed: int = 0,
                 priority_exponent: float = 2.0, rating_options: dict | None = None):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown sampling strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self.max_size, self.strategy, self.priority_exponent = max_size, strategy, priority_exponent
        self.ratings: Ratings = make_ratings(ratings, **(rating_options or {}))
        self.entries: list[PoolEntry] = []
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.entries)

    def ids(self) -> list[str]:
        """Opponent ids, oldest first."""
        return [entry.id for entry in self.entries]

    def add_snapshot(self, step: int, snapshot: Any) -> str:
        """Add the learner as of `step`, rated as the learner is now; evict the oldest beyond max_size."""
        opponent_id = f"step-{step}"
        if opponent_id in self.ids():
            raise ValueError(f"the pool already holds a snapshot {opponent_id!r}")
        self.entries.append(PoolEntry(opponent_id, int(step), snapshot))
        self.ratings.copy(LEARNER, opponent_id)
        while len(self.entries) > self.max_size:
            self.ratings.remove(self.entries.pop(0).id)
        return opponent_id

    def priorities(self) -> dict[str, float]:
        """PFSP weights (1 - P(learner beats opponent)) ** p, normalised to sum to 1."""
        raw = [(1.0 - self.ratings.expected(LEARNER, e.id)) ** self.priority_exponent for e in self.entries]
        total = sum(raw)
        if total <= 0:  # every opponent hopelessly weaker: fall back to uniform
            return {e.id: 1.0 / len(self.entries) for e in self.entries}
        return {e.id: weight / total for e, weight in zip(self.entries, raw)}

    def sample(self) -> tuple[str, Any]:
        """Draw an opponent with the pool's strategy: (id, snapshot)."""
        if not self.entries:
            raise ValueError("the opponent pool is empty: add a snapshot first (add_snapshot(step, snapshot))")
        if self.strategy == "latest":
            entry = self.entries[-1]
        elif self.strategy == "uniform":
            entry = self.rng.choice(self.entries)
        else:
            weights = list(self.priorities().values())
            entry = self.rng.choices(self.entries, weights=weights)[0]
        return entry.id, entry.snapshot

    def record(self, opponent_id: str, learner_score: float) -> None:
        """Rate one game: the learner scored `learner_score` (1 win, 0.5 draw, 0 loss) against the opponent."""
        if opponent_id not in self.ids():
            raise ValueError(f"{opponent_id!r} is not in the pool (it holds {self.ids()}); record a game "
                             "before adding the snapshot that evicts its opponent")
        self.ratings.update(LEARNER, opponent_id, learner_score)

    def ratings_metrics(self) -> dict[str, float]:
        """`selfplay/rating/learner`, `selfplay/rating/<id>` per opponent, and `selfplay/pool_size`."""
        metrics = {f"selfplay/rating/{LEARNER}": self.ratings.rating(LEARNER)}
        metrics.update({f"selfplay/rating/{e.id}": self.ratings.rating(e.id) for e in self.entries})
        metrics["selfplay/pool_size"] = float(len(self.entries))
        return metrics

    def state_dict(self) -> dict:
        """Snapshots, ratings and the sampling RNG: a loaded pool samples and rates exactly as this one."""
        return {"max_size": self.max_size, "strategy": self.strategy, "priority_exponent": self.priority_exponent,
                "entries": [{"id": e.id, "step": e.step, "snapshot": e.snapshot} for e in self.entries],
                "ratings": self.ratings.state_dict(), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()` (also one that went through JSON: the RNG state's lists are accepted)."""
        self.max_size, self.strategy = state["max_size"], state["strategy"]
        self.priority_exponent = state["priority_exponent"]
        self.ratings.load_state_dict(state["ratings"])
        self.entries = [PoolEntry(e["id"], int(e["step"]), e["snapshot"]) for e in state["entries"]]
        version, internal, gauss_next = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss_next))


class IterateMixture:
    """The average of self-play's iterates, as a mixture of snapshots drawn once per game
    (`train.selfplay.converge: average`).

    A snapshot of the policy is added after every `every` steps (and at the start, step 0). The mixture
    over steps 0..T (the iterates so far) gives each snapshot the share of those steps it stood for:
    the one taken at step s stands for steps s up to the next snapshot's (the newest: up to T, the live
    policy standing for the steps after it). With every = 1 each iterate is a snapshot, weighted
    uniformly. Drawing one component per game plays, by Kuhn's theorem, like the behaviour strategy
    that averages the components at every information set weighted by how often each reaches it: the
    average strategy that fictitious play and counterfactual regret minimisation converge with.
    Snapshots are opaque (the caller's objects); this class loads no torch.
    """

    def __init__(self, every: int = 1, seed: int = 0):
        if every < 1:
            raise ValueError(f"every must be at least 1 (steps between snapshots), got {every}")
        self.every, self.seed = int(every), int(seed)
        self.entries: list[PoolEntry] = []

    def __len__(self) -> int:
        return len(self.entries)

    def due(self, step: int) -> bool:
        """Whether the policy after step `step` (1-based; 0: the start) joins the mixture."""
        return step % self.every == 0

    def add(self, step: int, snapshot: Any) -> None:
        """The policy as of `step`; steps only move forward."""
        if self.entries and step <= self.entries[-1].step:
            raise ValueError(f"snapshot of step {step} after one of step {self.entries[-1].step}: steps move forward")
        self.entries.append(PoolEntry(f"step-{step}", int(step), snapshot))

    def components(self, step: int, live: Any = None) -> list[tuple[float, int, Any]]:
        """(weight, step, snapshot) of the mixture over the iterates 0..`step`, weights summing to 1; the
        `live` policy stands for the steps after the newest snapshot (a snapshot taken at `step`, or none
        given: the newest snapshot stands for them)."""
        if not self.entries:
            raise ValueError("the mixture is empty: add the start's snapshot first (add(0, snapshot))")
        entries = [(e.step, e.snapshot) for e in self.entries if e.step <= step]
        if live is not None and entries[-1][0] < step:
            entries.append((step, live))
        ends = [start for start, _ in entries[1:]] + [step + 1]
        total = step + 1 - entries[0][0]
        return [((end - start) / total, start, snapshot) for (start, snapshot), end in zip(entries, ends)]

    def draw(self, weights: list[float], game: str) -> int:
        """The component (an index into `weights`) one game plays: drawn with the mixture's seed and the
        game's key, so the same game draws the same component, and over games each comes `weights`' share."""
        u = random.Random(f"{self.seed}:{game}").random()
        for index, weight in enumerate(weights):
            u -= weight
            if u < 0:
                return index
        return len(weights) - 1  # rounding: the sum fell a hair short of 1

    def state_dict(self) -> dict:
        """The snapshots and the settings."""
        return {"every": self.every, "seed": self.seed,
                "entries": [{"step": e.step, "snapshot": e.snapshot} for e in self.entries]}

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()`."""
        self.every, self.seed = int(state["every"]), int(state["seed"])
        self.entries = [PoolEntry(f"step-{e['step']}", int(e["step"]), e["snapshot"]) for e in state["entries"]]


def match_score(rewards: dict[str, float], learner_agents, opponent_agents) -> float:
    """The learner side's score in a zero-sum episode: 1 if its total reward beats the opponent side's,
    0.5 on a tie (within 1e-9), 0 otherwise."""
    learner_agents, opponent_agents = list(learner_agents), list(opponent_agents)
    if not learner_agents or not opponent_agents:
        raise ValueError("both sides need at least one agent")
    if set(learner_agents) & set(opponent_agents):
        raise ValueError(f"an agent cannot be on both sides: {sorted(set(learner_agents) & set(opponent_agents))}")
    missing = [a for a in learner_agents + opponent_agents if a not in rewards]
    if missing:
        raise ValueError(f"no reward for agents {missing}; the episode's rewards cover {sorted(rewards)}")
    learner = sum(rewards[a] for a in learner_agents)
    opponent = sum(rewards[a] for a in opponent_agents)
    if math.isclose(learner, opponent, abs_tol=1e-9):
        return 0.5
    return 1.0 if learner > opponent else 0.0
