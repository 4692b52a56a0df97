"""Tasks, scoring and scripted players of the negotiation scenario.

Two agents (alice, bob) split a pool of books, hats and balls. Each has private per-item values
(task metadata). Protocol, in the agents' messages (keywords in any case):
  VALUES books=1 hats=3 balls=2    tell the other your values (optional, may be a bluff)
  PROPOSE books=2 hats=0 balls=1   claim these items for yourself; the other gets the rest
  ACCEPT                           (a message starting with it) accept the other's last proposal;
                                   the episode ends
The split: the accepted proposal; without an agreement, FINAL-OFFER ARBITRATION imposes one of the two
agents' last valid proposals, the one that favours its proposer less (the proposer's payoff over its
fair share minus the other's, from the true values; on a tie, the earlier offer, which the other could
have accepted). An agent
that never proposes leaves the arbitrator only the other's offer, so walking away is never a safe
draw: any proposal beats silence, and a greedier last offer loses to a fairer one.
Score (rule-verified): payoff over TWICE the agent's FAIR SHARE, clipped to 1, where the fair share is
its payoff under the efficient split that gives every item to the agent who values it more (half of
the value on a tie). The efficient split scores 0.5 for both (a tie); an agent wins by getting more
than its fair share (bluffing its values, holding out, a better last offer). The generator makes
every item type valued differently by the two agents and each agent value at least one type more
than the other, so the fair share is positive and the efficient split is unique.

Scripted opponents of graded strength (`opponents:` in negotiation.yaml): `random_player` (random
messages), `greedy_player` (never says its values, claims what it values most, accepts half of its
total value), `strong_player` (knows both agents' true values: claims everything from a silent
opponent, else proposes the efficient split, accepts only its fair share or more; it cannot be beaten,
only tied).
"""

from __future__ import annotations

import random
import re

ITEMS = ("books", "hats", "balls")
AGENTS = ("alice", "bob")
MAX_DIGITS = 6  # a count longer than this is no count (pools hold 1-4 of each item)
ROUNDS = 3  # negotiation.yaml's graph.rounds: strong_player makes its last turn's offer the efficient split
_PAIR = re.compile(r"\b(books?|hats?|balls?)\s*[=:]\s*(\d+)", re.IGNORECASE)
_COUNTS = r"((?:[\s,;]*(?:books?|hats?|balls?)\s*[=:]\s*\d+)+)"
_PROPOSE = re.compile(r"\bPROPOSE\b:?" + _COUNTS, re.IGNORECASE)
_VALUES = re.compile(r"\bVALUES\b:?" + _COUNTS, re.IGNORECASE)
_ACCEPT = re.compile(r"\s*ACCEPT\b", re.IGNORECASE)


def render(counts: dict) -> str:
    """{'books': 2, ...} -> 'books=2 hats=0 balls=1'."""
    return " ".join(f"{item}={counts.get(item, 0)}" for item in ITEMS)


def parse_counts(text: str) -> dict[str, int] | None:
    """'books=2 hats=0 balls=1' -> dict (missing items are 0); None when no item is named, or when a count
    has more than MAX_DIGITS digits: such a proposal is no offer. It must not raise, since the
    arbitrator reads both agents' proposals: an agent losing the game could otherwise write a count
    past int's digit limit and turn the game into a 0-0 tie (a failure to parse is each candidate's 0)."""
    pairs = _PAIR.findall(text or "")
    if not pairs or any(len(number) > MAX_DIGITS for _, number in pairs):
        return None
    counts = {item: 0 for item in ITEMS}
    for name, number in pairs:
        counts[name.lower().rstrip("s") + "s"] = int(number)
    return counts


def generate_tasks(seed: int, count: int) -> list[dict]:
    """Pools of 1-4 of each item; values 0-6 per item, different between the agents for every item,
    each agent valuing at least one item type more than the other."""
    rng = random.Random(seed)
    tasks = []
    while len(tasks) < count:
        pool = {item: rng.randint(1, 4) for item in ITEMS}
        values = {agent: {item: rng.randint(0, 6) for item in ITEMS} for agent in AGENTS}
        if any(values["alice"][item] == values["bob"][item] for item in ITEMS):
            continue
        if not all(any(values[a][item] > values[b][item] for item in ITEMS) for a, b in (AGENTS, AGENTS[::-1])):
            continue
        index = len(tasks)
        tasks.append({
            "id": f"negotiation-{index}",
            "prompt": f"Split the pool: {render(pool)}",
            "metadata": {"pool": render(pool), "values": values,
                         "alice_values": render(values["alice"]), "bob_values": render(values["bob"])},
        })
    return tasks


def fair_share(pool: dict, mine: dict, theirs: dict) -> float:
    """My payoff under the efficient split: items I value more are mine, ties halved."""
    return sum(pool[i] * mine[i] if mine[i] > theirs[i] else pool[i] * mine[i] / 2 if mine[i] == theirs[i] else 0
               for i in ITEMS)


def agreement(transcript) -> tuple[str, dict] | None:
    """(proposer, the proposer's claimed items) when the last message ACCEPTs the other agent's
    proposal in the message just before it; None otherwise."""
    messages = [m for m in transcript]
    if len(messages) < 2 or not _ACCEPT.match(messages[-1]["text"]):
        return None
    accepter, previous = messages[-1]["agent"], messages[-2]
    if previous["agent"] == accepter:
        return None
    proposals = _PROPOSE.findall(previous["text"])
    claimed = parse_counts(proposals[-1]) if proposals else None
    return (previous["agent"], claimed) if claimed is not None else None


def last_offers(transcript, pool: dict) -> dict[str, tuple[int, dict]]:
    """Each agent's last proposal that the pool can honour: agent -> (its turn, the claimed items)."""
    offers = {}
    for turn, message in enumerate(transcript):
        for proposal in _PROPOSE.findall(message["text"]):
            claimed = parse_counts(proposal)
            if claimed is not None and all(0 <= claimed[i] <= pool[i] for i in ITEMS):
                offers[message["agent"]] = (turn, claimed)
    return offers


def advantage(pool: dict, values: dict, proposer: str, claimed: dict) -> float:
    """How far a proposal favours its proposer: the proposer's payoff over its fair share minus the
    other's (0.0 for the efficient split; true values, which only the arbitrator knows)."""
    other = next(a for a in AGENTS if a != proposer)
    gets = {proposer: claimed, other: {i: pool[i] - claimed[i] for i in ITEMS}}
    ratio = {agent: sum(gets[agent][i] * values[agent][i] for i in ITEMS)
             / fair_share(pool, values[agent], values[next(a for a in AGENTS if a != agent)]) for agent in AGENTS}
    return ratio[proposer] - ratio[other]


def arbitration(transcript, pool: dict, values: dict) -> tuple[str, dict] | None:
    """Final-offer arbitration: of the agents' last valid proposals, the one that favours its proposer
    less (on a tie the earlier, which the other could have accepted; the only one if one agent never
    proposed); None when neither proposed."""
    offers = last_offers(transcript, pool)
    if not offers:
        return None
    _, _, agent = min((advantage(pool, values, agent, claimed), turn, agent)
                      for agent, (turn, claimed) in offers.items())
    return agent, offers[agent][1]


def split(transcript, meta: dict) -> tuple[str, dict] | None:
    """The split that stands: the accepted proposal, else the arbitrator's choice; None for none."""
    pool = parse_counts(meta["pool"])
    deal = agreement(transcript)
    if deal is not None:
        proposer, claimed = deal
        return deal if all(0 <= claimed[i] <= pool[i] for i in ITEMS) else None  # impossible: no deal
    return arbitration(transcript, pool, meta["values"])


def payoff_score(item, candidate) -> float:
    """The candidate agent's payoff over twice its fair share, clipped to [0, 1] (the efficient split
    is 0.5); 0 when no split stands. The transcript is parsed inside `candidate_input`: a proposal
    no parser survives (a count past int's digit limit) is the agents' own 0, never a masked episode."""
    from judges.types import candidate_input

    meta = item.metadata
    pool = parse_counts(meta["pool"])
    with candidate_input("the agreement"):
        standing = split(candidate.transcript, meta)
    if standing is None:
        return 0.0
    proposer, claimed = standing
    agent = candidate.agent
    other = next(a for a in AGENTS if a != agent)
    gets = claimed if agent == proposer else {i: pool[i] - claimed[i] for i in ITEMS}
    mine, theirs = meta["values"][agent], meta["values"][other]
    payoff = sum(gets[i] * mine[i] for i in ITEMS)
    share = fair_share(pool, mine, theirs)
    return 1.0 if share <= 0 else min(1.0, payoff / (2 * share))


# -- the expert -------------------------------------------------------------------------------------

def _last_line_of(observation: str, speaker: str) -> str:
    lines = [line for line in observation.splitlines() if line.startswith(f"{speaker}: ")]
    return lines[-1][len(speaker) + 2:] if lines else ""


def expert(agent: str, observation: str, task) -> str:
    """Honest and efficient: share your values with every message. Before the other's values are known,
    claim the whole pool (an opening bid) and accept a proposal that leaves you half of your total
    value; once they are known, accept a proposal that gives you at least your fair share, else propose
    the efficient split (each item to whoever values it more, ties halved, the proposer keeping an odd
    one). It always leaves an offer standing, so the arbitrator never hands the other a free split."""
    pool = parse_counts(re.search(r"Pool: ([^\n]*)", observation).group(1))
    mine = parse_counts(re.search(r"Your values: ([^\n]*)", observation).group(1))
    other = next(a for a in AGENTS if a != agent)
    said = _last_line_of(observation, other)
    shared = [parse_counts(v) for v in _VALUES.findall("\n".join(
        line for line in observation.splitlines() if line.startswith(f"{other}: ")))]
    theirs = shared[-1] if shared else None
    proposals = _PROPOSE.findall(said)
    if proposals:
        claimed = parse_counts(proposals[-1]) or {}
        gets = {i: pool[i] - claimed.get(i, 0) for i in ITEMS}
        enough = fair_share(pool, mine, theirs) if theirs is not None else sum(pool[i] * mine[i] for i in ITEMS) / 2
        if all(v >= 0 for v in gets.values()) and sum(gets[i] * mine[i] for i in ITEMS) >= enough:
            return "ACCEPT"
    if theirs is None:
        keep = dict(pool)  # an opening bid, the whole pool: the other will counter (or, silent, get nothing)
    else:
        keep = {i: pool[i] if mine[i] > theirs[i] else (pool[i] + 1) // 2 if mine[i] == theirs[i] else 0
                for i in ITEMS}
    return f"VALUES {render(mine)} PROPOSE {render(keep)}"


# -- scripted opponents of graded strength (evaluation only) ----------------------------------------

def _their_offer(agent: str, observation: str, pool: dict) -> dict | None:
    """The items the other agent's last message claims, when the pool can honour them; else None."""
    other = next(a for a in AGENTS if a != agent)
    proposals = _PROPOSE.findall(_last_line_of(observation, other))
    claimed = parse_counts(proposals[-1]) if proposals else None
    return claimed if claimed is not None and all(0 <= claimed[i] <= pool[i] for i in ITEMS) else None


def random_player(agent: str, observation: str, task) -> str:
    """A random message: VALUES, PROPOSE (counts within the pool) or ACCEPT, seeded by the position."""
    pool = parse_counts(task.metadata["pool"])
    rng = random.Random(f"{task.id}:{agent}:{observation.count(chr(10))}")
    kind = rng.choice(("VALUES", "PROPOSE", "PROPOSE", "ACCEPT"))
    if kind == "ACCEPT":
        return "ACCEPT"
    if kind == "VALUES":
        return f"VALUES {render({i: rng.randint(0, 6) for i in ITEMS})}"
    return f"PROPOSE {render({i: rng.randint(0, pool[i]) for i in ITEMS})}"


def greedy_player(agent: str, observation: str, task) -> str:
    """A heuristic: never tells its values; claims every item it values at 4 or more and half (rounded
    up) of the rest; accepts a proposal that leaves it half of its total value or more."""
    pool = parse_counts(task.metadata["pool"])
    mine = task.metadata["values"][agent]
    total = sum(pool[i] * mine[i] for i in ITEMS)
    claimed = _their_offer(agent, observation, pool)
    if claimed is not None and sum((pool[i] - claimed[i]) * mine[i] for i in ITEMS) * 2 >= total:
        return "ACCEPT"
    return f"PROPOSE {render({i: pool[i] if mine[i] >= 4 else (pool[i] + 1) // 2 for i in ITEMS})}"


def strong_player(agent: str, observation: str, task) -> str:
    """Knows both agents' true values: accepts a proposal that leaves it its fair share or more; claims
    the whole pool while the other has made no valid proposal (silence gets nothing), except at
    a last turn the other still answers (alice's third in negotiation.yaml's 3 rounds), and otherwise
    proposes the efficient split, which the arbitrator prefers to any offer that favours its proposer
    more. Nothing beats it; the best reachable is a tie."""
    pool = parse_counts(task.metadata["pool"])
    values = task.metadata["values"]
    other = next(a for a in AGENTS if a != agent)
    mine, theirs = values[agent], values[other]
    claimed = _their_offer(agent, observation, pool)
    if claimed is not None and sum((pool[i] - claimed[i]) * mine[i] for i in ITEMS) >= fair_share(pool, mine, theirs):
        return "ACCEPT"
    own_turns = sum(line.startswith(f"{agent}: ") for line in observation.splitlines())
    answered = own_turns == ROUNDS - 1 and agent != AGENTS[-1]  # its last turn, and the other speaks after it
    if not answered and not last_offers([{"agent": other, "text": line} for line in observation.splitlines()
                                                  if line.startswith(f"{other}: ")], pool):
        return f"PROPOSE {render(pool)}"  # silence gets nothing
    return f"PROPOSE {render({i: pool[i] if mine[i] > theirs[i] else 0 for i in ITEMS})}"
