"""The served policy of `train.selfplay.converge: average`: the average of the iterates, played as a mixture.

Self-play's last iterate may cycle in a zero-sum game where the average of the iterates converges
(fictitious play, CFR, NFSP). `ServedAverage` keeps a snapshot of the learner after every
`average_every` steps (`marl.selfplay.IterateMixture`, each weighted by the steps it stood for) and
serves their mixture: every game draws one snapshot, seeded by the game, and plays it throughout, which
is realization-equivalent to the average strategy (Kuhn's theorem). The held-out evaluation plays the
served policy through `serving(player, step)`:

    with served.serving(player, step) as mixture_player:
        figures = evaluate_team(mixture_player, tasks)     each game plays its drawn snapshot

`MixturePlayer.play` groups the jobs by the snapshot they drew and plays each group with that snapshot's
weights loaded into the learner's actor; the live weights are back when it returns (and when the block
ends). A scenario's `evaluation` function receives a `MixturePolicy`, whose `mixture` lists (weight,
component policy): a game's exact figures read the components (Kuhn poker averages their strategies at
every information set, weighted by reach); called as a policy, it answers as the game's drawn snapshot.
"""

from __future__ import annotations

from contextlib import contextmanager

from marl.rollout import EpisodeBatch
from marl.selfplay import IterateMixture
from trainers.team.evaluation import LearnedPolicy

SERVED = "shared"  # the learner's actor: the one whose weights the mixture replaces while it plays


def snapshot(model) -> dict:
    """A detached copy of a model's weights."""
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


class ServedAverage:
    """The snapshots of the iterates and the mixture served from them (module docstring)."""

    def __init__(self, model, every: int, seed: int):
        self.model, self.every, self.seed = model, every, seed
        self.restart()

    def restart(self) -> None:
        """The mixture starts again from the weights now (after a warm-up changed them): step 0."""
        self.mixture = IterateMixture(self.every, self.seed)
        self.mixture.add(0, snapshot(self.model))
        self.answers: dict = {}  # (component step, question) -> answer: a snapshot never changes

    def record(self, step: int) -> None:
        """After step `step` (1-based): the learner's snapshot when one is due."""
        if self.mixture.due(step):
            self.mixture.add(step, snapshot(self.model))

    def metrics(self) -> dict[str, float]:
        """selfplay/average/snapshots: the snapshots the served mixture draws from."""
        return {"selfplay/average/snapshots": float(len(self.mixture))}

    @contextmanager
    def serving(self, player, step: int):
        """A player whose learner plays the mixture over the iterates 0..`step`; the live weights are
        restored when the block ends."""
        mixture_player = MixturePlayer(player, self, step)
        try:
            yield mixture_player
        finally:
            mixture_player.restore()

    def state_dict(self) -> dict:
        """The snapshots, for a checkpoint."""
        return self.mixture.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()`."""
        self.mixture.load_state_dict(state)
        self.answers = {}


class MixturePlayer:
    """An episode player whose learner's seats play the mixture: one snapshot per game (module docstring).
    Everything but `play` is the wrapped player's."""

    def __init__(self, player, served: ServedAverage, step: int):
        self._player, self._served = player, served
        self.live = snapshot(served.model)
        self.components = served.mixture.components(step, live=self.live)
        self.weights = [weight for weight, _, _ in self.components]
        self._loaded: int | None = None  # the component whose weights the actor holds (None: the live ones)

    def __getattr__(self, name):
        return getattr(self._player, name)

    def draw(self, game: str) -> int:
        """The component the game `game` plays (seeded: the same game, the same component)."""
        return self._served.mixture.draw(self.weights, game)

    def play(self, jobs, *, greedy: bool = False) -> EpisodeBatch:
        """The jobs' episodes, each game with the snapshot it drew (the jobs that drew alike together)."""
        draws = [self.draw(f"{getattr(job.task, 'id', job.task)}:{job.seed}") for job in jobs]
        episodes: list = [None] * len(jobs)
        try:
            for component in sorted(set(draws)):
                index = [i for i, drawn in enumerate(draws) if drawn == component]
                self.load(component)
                batch = self._player.play([jobs[i] for i in index], greedy=greedy)
                for i, episode in zip(index, batch.episodes):
                    episodes[i] = episode
        finally:
            self.restore()
        return EpisodeBatch(episodes)

    def load(self, component: int) -> None:
        """The component's weights into the learner's actor (nothing to do when they are there)."""
        if self._loaded != component:
            self._served.model.load_state_dict(self.components[component][2])
            self._loaded = component

    def restore(self) -> None:
        """The live weights back into the learner's actor."""
        if self._loaded is not None:
            self._served.model.load_state_dict(self.live)
            self._loaded = None

    def learned_policy(self):
        """What a scenario's `evaluation` function receives: the mixture as a policy (MixturePolicy)."""
        return MixturePolicy(self)


class MixturePolicy:
    """The served mixture as a greedy `policy(agent, observation, task) -> text`: each game (task id) answers
    with the snapshot it drew. `mixture` is [(weight, component policy)], each component a LearnedPolicy of
    one snapshot, its answers kept (a snapshot never changes): a game's exact figures of the mixture."""

    def __init__(self, player: MixturePlayer):
        self.player = player
        self.mixture = [(weight, _Component(player, index, step))
                        for index, (weight, step, _) in enumerate(player.components)]

    def __call__(self, agent: str, observation: str, task) -> str:
        return self.mixture[self.player.draw(str(task.id))][1](agent, observation, task)

    def probabilities(self, agent: str, observation: str, task, messages: list[str]) -> None:
        """None: how likely a mixture drawn once per game is to say a message depends on its own earlier
        moves in the game (which components they point to), not on the observation alone; a game reads
        `mixture` for exact figures."""
        return None


class _Component:
    """One snapshot of the mixture as a LearnedPolicy: its weights loaded when asked, its answers kept."""

    def __init__(self, player: MixturePlayer, index: int, step: int):
        self.player, self.index, self.step = player, index, step

    def _ask(self, question: tuple, answer):
        answers = self.player._served.answers
        key = (self.step, *question)
        if key not in answers:
            self.player.load(self.index)
            answers[key] = answer(LearnedPolicy(self.player._player))
        return answers[key]

    def __call__(self, agent: str, observation: str, task) -> str:
        return self._ask(("act", agent, observation, str(task.id)), lambda policy: policy(agent, observation, task))

    def probabilities(self, agent: str, observation: str, task, messages: list[str]):
        return self._ask(("p", agent, observation, str(task.id), tuple(messages)),
                         lambda policy: policy.probabilities(agent, observation, task, messages))
