"""The turn and visibility graph of a scenario (networkx).

- Visibility: a directed edge speaker -> listener means the listener sees the speaker's messages.
  Every agent sees its own messages. No edges given = everyone sees everyone.
- Turn order, one round = a list of turns, each turn a set of agents acting together:
  `round_robin` (one agent a turn, in the order of `agents`), `topological` (the layers of the DAG:
  an agent acts once everyone it listens to has), or an explicit `schedule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from marl.scenario.spec import GraphSpec


@dataclass(frozen=True)
class GraphProblem:
    """A problem in the graph section: the key path inside `graph` and what is wrong."""

    path: tuple
    message: str


def build_visibility(agent_names: list[str], graph: GraphSpec) -> nx.DiGraph:
    """The directed visibility graph (speaker -> listener) over all agents."""
    visibility = nx.DiGraph()
    visibility.add_nodes_from(agent_names)
    if graph.edges is None:
        visibility.add_edges_from((a, b) for a in agent_names for b in agent_names if a != b)
    else:
        visibility.add_edges_from(graph.edges)
    return visibility


def check_graph(agent_names: list[str], graph: GraphSpec) -> list[GraphProblem]:
    """Unknown agent names, isolated agents, cycles where a DAG order is needed, bad schedules."""
    known = set(agent_names)
    problems = []
    for index, edge in enumerate(graph.edges or []):
        for side, name in enumerate(edge):
            if name not in known:
                problems.append(GraphProblem(("edges", index, side), f"unknown agent {name!r} "
                                             f"(known agents: {', '.join(agent_names)})"))
    for index, turn in enumerate(graph.schedule or []):
        for name in [turn] if isinstance(turn, str) else turn:
            if name not in known:
                problems.append(GraphProblem(("schedule", index), f"unknown agent {name!r} "
                                             f"(known agents: {', '.join(agent_names)})"))
    if problems:
        return problems
    visibility = build_visibility(agent_names, graph)
    if graph.edges is not None and len(agent_names) > 1:
        for name in agent_names:
            if visibility.degree(name) == 0:
                problems.append(GraphProblem(("edges",), f"agent {name!r} is isolated: nobody sees it and it sees "
                                             "nobody (add an edge to or from it, or remove the agent)"))
    if graph.order == "topological" and not nx.is_directed_acyclic_graph(visibility):
        cycle = " -> ".join(a for a, _ in nx.find_cycle(visibility))
        problems.append(GraphProblem(("order",), f"order 'topological' needs a DAG but the edges have a cycle "
                                     f"({cycle}); remove an edge or use order 'round_robin' or 'schedule'"))
    if graph.order == "schedule" and not graph.schedule:
        problems.append(GraphProblem(("schedule",), "order 'schedule' needs a non-empty schedule list"))
    if graph.order != "schedule" and graph.schedule is not None:
        problems.append(GraphProblem(("schedule",), f"a schedule is only read with order 'schedule' (order is "
                                     f"{graph.order!r}); set order: schedule or remove the schedule"))
    return problems


def turn_order(agent_names: list[str], graph: GraphSpec) -> list[tuple[str, ...]]:
    """The turns of one round; each turn is the tuple of agents that act together."""
    if graph.order == "round_robin":
        return [(name,) for name in agent_names]
    if graph.order == "schedule":
        return [(turn,) if isinstance(turn, str) else tuple(turn) for turn in graph.schedule or []]
    visibility = build_visibility(agent_names, graph)
    rank = {name: index for index, name in enumerate(agent_names)}
    return [tuple(sorted(layer, key=rank.__getitem__)) for layer in nx.topological_generations(visibility)]


class TurnSchedule(Sequence):
    """The turns of a whole episode, `rounds` repetitions of one round, computed on demand (never a list
    as long as rounds x turns: a huge `rounds` costs no memory)."""

    def __init__(self, one_round: list[tuple[str, ...]], rounds: int):
        self.one_round, self.rounds = list(one_round), int(rounds)

    def __len__(self) -> int:
        return len(self.one_round) * self.rounds

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("turn index out of range")
        return self.one_round[index % len(self.one_round)]


def episode_turns(agent_names: list[str], graph: GraphSpec) -> TurnSchedule:
    """Every turn of an episode: the round's turn order, `graph.rounds` times (lazily)."""
    return TurnSchedule(turn_order(agent_names, graph), graph.rounds)


def visible_speakers(visibility: nx.DiGraph, listener: str) -> set[str]:
    """Agents whose messages `listener` sees (itself included)."""
    return set(visibility.predecessors(listener)) | {listener}
