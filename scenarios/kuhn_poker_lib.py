"""Kuhn poker: the referee, the scorer, the Nash expert, and the exact exploitability of a policy.

Three cards, J < Q < K; each player antes 1 and gets one card, seen by it alone. `first` acts: check
or bet (1 more chip). After a check, `second` checks (showdown for 1) or bets; facing a bet, a player
calls (showdown for 2) or folds (the other takes the pot). A move is the first word of the message.
A word that is not one of the two the player is offered is an illegal move, which counts as a fold
(the rule stated in kuhn_poker.yaml): the player loses the chip it has in.

Score (rule-verified, `chips_score`): (chips won + 2) / 4, so -2..+2 chips is 0..1 and the zero-sum
reward (score minus the mean of both) is chips / 4.

A strategy is the probability of the aggressive action (bet, or call) at each of the 12 information
sets: (player, card, history) with history '' or 'check bet' for `first`, 'check' or 'bet' for
`second`. `exploitability(strategy)` is exact (the game tree enumerated): half the sum of what a best
response to each player's side gains over the game value, so 0 at a Nash equilibrium. `nash(alpha)` is
the equilibrium family (alpha in [0, 1/3]: first bets a J with alpha, a K with 3 alpha); the game's
value for `first` is -1/18. `average_strategy(strategies)` is the strategy of drawing one of several
each hand (the average of self-play's iterates). `strategy_of(policy)` asks a text policy (greedy) what it does at every
information set, with the observation the scenario shows there; `mixed_strategy_of(policy)` asks a
model policy how likely it is to say the aggressive word there (the strategy it plays when sampling).
"""

from __future__ import annotations

import itertools
import random
import re

CARDS = ("J", "Q", "K")
RANK = {card: index for index, card in enumerate(CARDS)}
DEALS = tuple(itertools.permutations(CARDS, 2))  # (first's card, second's card): 6 deals, equally likely
PLAYERS = ("first", "second")
# information sets: (player, history) -> the two actions offered, passive first
OFFERS = {("first", ""): ("check", "bet"), ("second", "check"): ("check", "bet"),
          ("second", "bet"): ("fold", "call"), ("first", "check bet"): ("fold", "call")}
INFOSETS = tuple((player, card, history) for (player, history) in OFFERS for card in CARDS)
GAME_VALUE = -1 / 18  # for `first`, at equilibrium
_WORD = re.compile(r"[A-Za-z]+")


def generate_tasks(seed: int, count: int) -> list[dict]:
    """`count` deals drawn with `seed` (each of the 6 equally likely)."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        first, second = rng.choice(DEALS)
        tasks.append({"id": f"kuhn-{seed}-{index}", "prompt": "Kuhn poker: J < Q < K.",
                      "metadata": {"first": first, "second": second}})
    return tasks


def to_act(history: str) -> str | None:
    """Who acts after `history` (None: the hand is over)."""
    return {"": "first", "check": "second", "bet": "second", "check bet": "first"}.get(history)


def payoff(history: str, first: str, second: str) -> int:
    """Chips `first` wins at the end of `history` (negative: it loses them)."""
    showdown = 1 if RANK[first] > RANK[second] else -1
    return {"check check": showdown, "bet call": 2 * showdown, "check bet call": 2 * showdown,
            "bet fold": 1, "check bet fold": -1}[history]


def play(task, transcript) -> dict:
    """Replay the moves: {history, over, winner chips for first, verdict}."""
    history, verdict = "", ""
    for turn in transcript:
        player = to_act(history)
        if player is None or turn["agent"] != player:
            continue
        passive, aggressive = OFFERS[(player, history)]
        words = _WORD.findall((turn["text"] or "").lower())
        word = words[0] if words else ""
        if word not in (passive, aggressive):
            word = "fold"  # an illegal move is a fold: the player loses the chip(s) it has in
            verdict = f"{player} said {turn['text'][:20]!r}, not {passive} or {aggressive}: a fold"
        history = f"{history} {word}".strip()
        if word == "fold" and history not in ("bet fold", "check bet fold"):
            chips = -1 if player == "first" else 1  # folded where no bet was made: loses its ante
            return {"history": history, "over": True, "chips": chips, "verdict": verdict or f"{player} folds"}
        if to_act(history) is None:
            chips = payoff(history, task.metadata["first"], task.metadata["second"])
            winner = "first" if chips > 0 else "second"
            return {"history": history, "over": True, "chips": chips,
                    "verdict": verdict or f"{history}: {winner} wins {abs(chips)}"}
    return {"history": history, "over": False, "chips": 0, "verdict": ""}


def observation(player: str, card: str, history: str) -> str:
    """What `player` holding `card` sees at `history`: its card, the moves so far, its two options."""
    passive, aggressive = OFFERS[(player, history)]
    return f"Card {card}. Moves: {history or 'none'}. Say {aggressive} or {passive}."


def referee(task, transcript) -> dict:
    """The scenario's referee: each player's own view as {state}, the end of the hand, the verdict."""
    game = play(task, transcript)
    player = to_act(game["history"]) if not game["over"] else None
    state = {name: observation(name, task.metadata[name], game["history"]) if name == player else ""
             for name in PLAYERS}
    return {"state": state, "over": game["over"], "verdict": game["verdict"]}


def chips_score(item, candidate) -> float:
    """(chips the candidate player won + 2) / 4: 0 for losing 2, 1 for winning 2 (0.5 before the end).
    The moves are read inside `candidate_input`: text no parser survives is the players' own score."""
    from judges.types import candidate_input

    with candidate_input("the moves"):
        game = play(item, candidate.transcript)
    chips = game["chips"] if candidate.agent == "first" else -game["chips"]
    return (chips + 2) / 4


# -- strategies, the equilibrium, exploitability ------------------------------------------------------------

def nash(alpha: float = 0.0) -> dict:
    """The equilibrium strategy for both seats (P(bet or call) per information set), alpha in [0, 1/3]."""
    first = {("J", ""): alpha, ("Q", ""): 0.0, ("K", ""): 3 * alpha,
             ("J", "check bet"): 0.0, ("Q", "check bet"): alpha + 1 / 3, ("K", "check bet"): 1.0}
    second = {("J", "check"): 1 / 3, ("Q", "check"): 0.0, ("K", "check"): 1.0,
              ("J", "bet"): 0.0, ("Q", "bet"): 1 / 3, ("K", "bet"): 1.0}
    return {**{("first", *key): p for key, p in first.items()}, **{("second", *key): p for key, p in second.items()}}


def _value(strategy_first: dict, strategy_second: dict, deal, history: str = "") -> float:
    """Expected chips for `first` from `history` on `deal`, each seat playing its strategy."""
    player = to_act(history)
    if player is None:
        return payoff(history, *deal)
    card = deal[0] if player == "first" else deal[1]
    strategy = strategy_first if player == "first" else strategy_second
    passive, aggressive = OFFERS[(player, history)]
    p = strategy[(player, card, history)]
    return sum(weight * _value(strategy_first, strategy_second, deal, f"{history} {word}".strip())
               for weight, word in ((1 - p, passive), (p, aggressive)) if weight > 0)


def game_value(strategy_first: dict, strategy_second: dict) -> float:
    """Expected chips for `first` over the 6 deals."""
    return sum(_value(strategy_first, strategy_second, deal) for deal in DEALS) / len(DEALS)


def best_response(strategy: dict, seat: str) -> dict:
    """A pure strategy for `seat` maximising its expected chips against `strategy` (exact, backward
    induction over the information sets, each weighted by how often the other seat's play reaches it)."""
    response = dict(strategy)
    sign = 1 if seat == "first" else -1
    # the later decision first: `first` after 'check bet'; `second` has one decision per hand
    for history in (("check bet", "") if seat == "first" else ("check", "bet")):
        for card in CARDS:
            passive, aggressive = OFFERS[(seat, history)]
            totals = {}
            for word in (passive, aggressive):
                trial = {**response, (seat, card, history): 1.0 if word == aggressive else 0.0}
                deals = [d for d in DEALS if (d[0] if seat == "first" else d[1]) == card]
                totals[word] = sum(sign * _reach_value(trial, d, history, seat) for d in deals)
            response[(seat, card, history)] = 1.0 if totals[aggressive] > totals[passive] + 1e-12 else 0.0
    return response


def _reach_value(strategy: dict, deal, history: str, seat: str) -> float:
    """first's expected chips on `deal` from `history`, weighted by the chance the other seat's play
    reaches it (the seat's own moves on the way are its choice, so they carry no weight)."""
    other = "second" if seat == "first" else "first"
    reach = _moves_reach(strategy, history, other, deal[0] if other == "first" else deal[1])
    return reach * _value(strategy, strategy, deal, history) if reach else 0.0


def _moves_reach(strategy: dict, history: str, player: str, card: str) -> float:
    """The chance that `player`, holding `card`, makes its moves in `history` (the other seat's moves
    and the deal not counted)."""
    reach, path = 1.0, ""
    for word in history.split():
        if to_act(path) == player:
            p = strategy[(player, card, path)]
            reach *= p if word == OFFERS[(player, path)][1] else 1 - p
        path = f"{path} {word}".strip()
    return reach


def exploitability(strategy: dict) -> float:
    """Half of what best responses gain against `strategy` in each seat: 0 at a Nash equilibrium."""
    gain_first = game_value(best_response(strategy, "first"), strategy)
    gain_second = -game_value(strategy, best_response(strategy, "second"))
    return (gain_first + gain_second) / 2


def average_strategy(strategies: list[dict], weights: list[float] | None = None) -> dict:
    """The strategy of playing, each hand, one of `strategies` drawn with `weights` (default uniformly; in
    each seat): at every information set the average of their moves weighted by each one's draw weight
    times how often its own play reaches the set (Kuhn's theorem makes this behaviour strategy worth the
    same as the mixture against any opponent). It is the average of the iterates that fictitious play
    converges with, where the last iterate of gradient self-play may cycle."""
    if not strategies:
        raise ValueError("average_strategy needs at least one strategy")
    weights = [1.0] * len(strategies) if weights is None else list(weights)
    if len(weights) != len(strategies) or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"one non-negative weight per strategy, not all 0; got {weights} for {len(strategies)}")
    average = {}
    for player, card, history in INFOSETS:
        key = (player, card, history)
        # how often each strategy's own play reaches the set: 1 - P(bet) for `first` at 'check bet', else 1
        reach = [w * _moves_reach(strategy, history, player, card) for w, strategy in zip(weights, strategies)]
        total = sum(reach)
        if total <= 0:  # no strategy reaches it: any move will do, take the weighted mean
            average[key] = sum(w * strategy[key] for w, strategy in zip(weights, strategies)) / sum(weights)
        else:
            average[key] = sum(r * strategy[key] for r, strategy in zip(reach, strategies)) / total
    return average


def strategy_of(policy, task_id: str = "kuhn-probe") -> dict:
    """The pure strategy of a text `policy(agent, observation, task)` (greedy): at every information set
    it sees what the scenario shows there; an answer that is neither offered word counts as the passive
    one (an illegal move is a fold, and checking is what folding costs nothing over)."""
    from types import SimpleNamespace

    strategy = {}
    for player, card, history in INFOSETS:
        task = SimpleNamespace(id=task_id, prompt="", answer=None, metadata={player: card})
        words = _WORD.findall(str(policy(player, observation(player, card, history), task)).lower())
        strategy[(player, card, history)] = 1.0 if words and words[0] == OFFERS[(player, history)][1] else 0.0
    return strategy


def mixed_strategy_of(policy, task_id: str = "kuhn-probe") -> dict | None:
    """The mixed strategy a policy plays when it samples: at every information set, the probability that
    its message is exactly the aggressive word (`policy.probabilities`, exact from the model; anything
    else, the passive word or an illegal one, counts as passive, as in strategy_of). None for a policy
    that cannot say how likely its messages are (a scripted one)."""
    from types import SimpleNamespace

    probabilities = getattr(policy, "probabilities", None)
    if probabilities is None:
        return None
    strategy = {}
    for player, card, history in INFOSETS:
        task = SimpleNamespace(id=task_id, prompt="", answer=None, metadata={player: card})
        p = probabilities(player, observation(player, card, history), task, [OFFERS[(player, history)][1]])
        if p is None:
            return None
        strategy[(player, card, history)] = min(1.0, max(0.0, p[0]))
    return strategy


def evaluation(policy) -> dict[str, float]:
    """The scenario's figures of a policy: its exact exploitability, and its mean chips per hand against
    the equilibrium over both seats (0 is the most any policy gets: -1/18 first, +1/18 second).

    For a model policy these are of the mixed strategy it plays when sampling (mixed_strategy_of), the
    one it is trained as; `exploitability_greedy` is that of its greedy moves. No pure strategy is
    worth less than 1/6 (every one of the 4096 was enumerated; tests/marl/scenario/test_kuhn_poker.py),
    so only a mixed strategy can approach the equilibrium's 0. A scripted policy has its greedy figures.
    A mixture drawn once per hand (`policy.mixture`: [(weight, policy)], the served average of self-play's
    iterates) has the figures of its components' strategies averaged by average_strategy."""
    greedy, strategy = _strategies(policy)
    equilibrium = nash(0.0)
    return {"exploitability": exploitability(strategy),
            "value_vs_nash": (game_value(strategy, equilibrium) - game_value(equilibrium, strategy)) / 2,
            "exploitability_greedy": exploitability(greedy)}


def _strategies(policy) -> tuple[dict, dict]:
    """(greedy, sampled) strategies of a policy, or of a mixture's components averaged with its weights."""
    mixture = getattr(policy, "mixture", None)
    if not mixture:
        greedy = strategy_of(policy)
        return greedy, mixed_strategy_of(policy) or greedy
    weights = [weight for weight, _ in mixture]
    greedy = average_strategy([strategy_of(component) for _, component in mixture], weights)
    mixed = [mixed_strategy_of(component) for _, component in mixture]
    return greedy, greedy if None in mixed else average_strategy(mixed, weights)


def _view(observation_text: str) -> tuple[str, str]:
    """(card, history) of the observation the scenario shows a player."""
    card = re.search(r"Card ([JQK])", observation_text).group(1)
    moves = re.search(r"Moves: ([a-z ]+)\.", observation_text).group(1)
    return card, "" if moves == "none" else moves


def uniform_expert(agent: str, observation_text: str, task) -> str:
    """A warm-up that does not imitate the equilibrium (bench/selfplay.py --expert uniform): each of the two
    offered words with probability 1/2, drawn with a generator seeded by task and view."""
    _, history = _view(observation_text)
    passive, aggressive = OFFERS[(agent, history)]
    return aggressive if random.Random(f"{task.id}:{agent}:{history}:uniform").random() < 0.5 else passive


def check_expert(agent: str, observation_text: str, task) -> str:
    """A warm-up that does not imitate the equilibrium: always the passive word (check, or fold to a bet)."""
    _, history = _view(observation_text)
    return OFFERS[(agent, history)][0]


def expert(agent: str, observation_text: str, task) -> str:
    """The equilibrium (alpha = 1/6), its mixed moves drawn with a generator seeded by task and view."""
    card, history = _view(observation_text)
    passive, aggressive = OFFERS[(agent, history)]
    p = nash(1 / 6)[(agent, card, history)]
    return aggressive if random.Random(f"{task.id}:{agent}:{history}").random() < p else passive
