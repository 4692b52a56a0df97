"""Tasks, expert and payoff scorer of the negotiation scenario.

Two agents (alice, bob) split a pool of books, hats and balls. Each has private per-item values
(task metadata). Protocol, in the agents' messages (keywords in any case):
  VALUES books=1 hats=3 balls=2    tell the other your values (optional, may be a bluff)
  PROPOSE books=2 hats=0 balls=1   claim these items for yourself; the other gets the rest
  ACCEPT                           (a message starting with it) accept the other's last proposal;
                                   the episode ends
Payoff: with an agreement, the value of the items an agent gets. Score (rule-verified): payoff divided
by the agent's FAIR SHARE, clipped to 1, where the fair share is its payoff under the efficient split
that gives every item to the agent who values it more (half of the value on a tie); 0 without an
agreement. The generator makes every item type valued differently by the two agents and each agent
value at least one type more than the other, so the fair share is positive and the efficient split
is the unique one that gives both agents 1.
"""

from __future__ import annotations

import random
import re

ITEMS = ("books", "hats", "balls")
AGENTS = ("alice", "bob")
_PAIR = re.compile(r"\b(books?|hats?|balls?)\s*[=:]\s*(\d+)", re.IGNORECASE)
_COUNTS = r"((?:[\s,;]*(?:books?|hats?|balls?)\s*[=:]\s*\d+)+)"
_PROPOSE = re.compile(r"\bPROPOSE\b:?" + _COUNTS, re.IGNORECASE)
_VALUES = re.compile(r"\bVALUES\b:?" + _COUNTS, re.IGNORECASE)
_ACCEPT = re.compile(r"\s*ACCEPT\b", re.IGNORECASE)


def render(counts: dict) -> str:
    """{'books': 2, ...} -> 'books=2 hats=0 balls=1'."""
    return " ".join(f"{item}={counts.get(item, 0)}" for item in ITEMS)


def parse_counts(text: str) -> dict[str, int] | None:
    """'books=2 hats=0 balls=1' -> dict (missing items are 0); None when no item is named."""
    pairs = _PAIR.findall(text or "")
    if not pairs:
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


def payoff_score(item, candidate) -> float:
    """The candidate agent's payoff / fair share, clipped to [0, 1]; 0 without a valid agreement.
    The transcript is parsed inside `candidate_input`: a proposal no parser survives (a count past
    int's digit limit) is the agents' own 0, never a masked episode."""
    from judges.types import candidate_input

    meta = item.metadata
    pool = parse_counts(meta["pool"])
    with candidate_input("the agreement"):
        deal = agreement(candidate.transcript)
    if deal is None:
        return 0.0
    proposer, claimed = deal
    if any(claimed[i] > pool[i] or claimed[i] < 0 for i in ITEMS):
        return 0.0  # an impossible proposal is no deal
    agent = candidate.agent
    other = next(a for a in AGENTS if a != agent)
    gets = claimed if agent == proposer else {i: pool[i] - claimed[i] for i in ITEMS}
    mine, theirs = meta["values"][agent], meta["values"][other]
    payoff = sum(gets[i] * mine[i] for i in ITEMS)
    share = fair_share(pool, mine, theirs)
    return 1.0 if share <= 0 else min(1.0, payoff / share)


# -- the expert -------------------------------------------------------------------------------------

def _last_line_of(observation: str, speaker: str) -> str:
    lines = [line for line in observation.splitlines() if line.startswith(f"{speaker}: ")]
    return lines[-1][len(speaker) + 2:] if lines else ""


def expert(agent: str, observation: str, task) -> str:
    """Honest and efficient: share your values; once the other's values are known, propose the efficient
    split (each item to whoever values it more, ties halved, the proposer keeping an odd one); accept a
    proposal that gives you at least your fair share, else counter with the efficient split."""
    pool = parse_counts(re.search(r"Pool: ([^\n]*)", observation).group(1))
    mine = parse_counts(re.search(r"Your values: ([^\n]*)", observation).group(1))
    other = next(a for a in AGENTS if a != agent)
    said = _last_line_of(observation, other)
    shared = [parse_counts(v) for v in _VALUES.findall("\n".join(
        line for line in observation.splitlines() if line.startswith(f"{other}: ")))]
    theirs = shared[-1] if shared else None
    proposals = _PROPOSE.findall(said)
    if proposals and theirs is not None:
        claimed = parse_counts(proposals[-1]) or {}
        gets = {i: pool[i] - claimed.get(i, 0) for i in ITEMS}
        if all(v >= 0 for v in gets.values()) and \
                sum(gets[i] * mine[i] for i in ITEMS) >= fair_share(pool, mine, theirs):
            return "ACCEPT"
    if theirs is None:
        return f"VALUES {render(mine)}"
    keep = {i: pool[i] if mine[i] > theirs[i] else (pool[i] + 1) // 2 if mine[i] == theirs[i] else 0 for i in ITEMS}
    return f"VALUES {render(mine)} PROPOSE {render(keep)}"
