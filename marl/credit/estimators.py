"""Credit assignment: split a team's value among its agents (cooperative game theory; docs/credit.md).

Every function takes a coalition value `v(frozenset) -> float` (or a 1-D array of per-seed returns, whose
mean is used), the players (hashable names) and returns a `CreditEstimate(values, stderr, n_evals,
method, details)`. `v` may also be a `CachedValue` (its cache is then shared between calls), a
`BatchValue` (scores many coalitions per call: the fast exact path) or a `CoalitionTable` from
`exact_table` (one table serves every exact value).

- `shapley`: methods exact, permutation, antithetic, tmc, stratified, kernel, auto.
- `banzhaf`: exact, msr (maximum sample reuse), auto.  `owen(v, players, unions)`: exact, permutation, auto.
- `myerson(v, graph)`: the Shapley value of v^G(S) = sum over connected components C of S of v(C); only
  connected coalitions are evaluated. Exact (Harsanyi dividends), permutation, antithetic, tmc, auto.
- `difference_rewards`: D_i = v(N) - v(N minus i).  `least_core`: epsilon* and one least-core point (HiGHS).

Budget: the number of distinct coalition evaluations allowed; v(empty) is free (n_evals counts it when it
was used), so n_evals <= budget + 1. `budget=None` means unlimited for `exact` and DEFAULT_BUDGET = 4095
= 2^12 - 1 otherwise, so `auto` is exact up to 12 players. Samplers stop before a new coalition would
exceed the budget, or after `budget` samples; coalitions already evaluated (one cache per call, or a
shared `CachedValue`) are free. A budget below a method's minimum (`minimum_budget`) is a ValueError.

`auto` (montecarlo.choose): exact when every coalition needed fits the budget (2^n - 1, or
the connected coalitions for Myerson); else KernelSHAP for Shapley with n <= 12; else a pilot of 10 % of
the budget (at least two antithetic pairs, none if that is over 40 %) estimates each estimator's
variance per evaluation relative to permutation MC (1): antithetic 1 + rho (rho: correlation of a pair's
two marginals, 1 on self-dual games, -1 on pairwise games), TMC on a monotone game the fraction of each
order it evaluates before v(N) is reached, stratified 2 / gain (gain: the variance reduction of Neyman
allocation over coalition-size bins). The smallest wins; its pilot samples are kept when it can use them.
`details` records the pilot statistics and the choice. Standard errors of sampled values measure the
sampling error only; with per-seed returns, exact Shapley and Banzhaf report the propagated noise of the
means in details["noise_stderr"].
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from marl.credit import montecarlo
from marl.credit.exact import (MAX_LEAST_CORE_PLAYERS, MAX_MYERSON_CONNECTED, BatchValue, CachedValue,
                               CoalitionError, CoalitionTable, CreditEstimate, NonFiniteValue, as_cached_value,
                               banzhaf_weights, connected_coalitions, exact_table, least_core_exact,
                               myerson_from_dividends, owen_exact, semivalue, shapley_weights, validate_players)

__all__ = ["DEFAULT_BUDGET", "BatchValue", "CachedValue", "CoalitionError", "CoalitionTable", "CreditEstimate",
           "NonFiniteValue", "banzhaf", "difference_rewards", "exact_table", "least_core", "minimum_budget", "myerson",
           "owen", "shapley"]

DEFAULT_BUDGET = (1 << 12) - 1
AUTO_KERNEL_MAX_PLAYERS = 12  # auto uses KernelSHAP up to here: its enumerated sizes hold most of the weight
SHAPLEY_METHODS = ("auto", "exact", "permutation", "antithetic", "tmc", "stratified", "kernel")
BANZHAF_METHODS = ("auto", "exact", "msr")
OWEN_METHODS = ("auto", "exact", "permutation")
MYERSON_METHODS = ("auto", "exact", "permutation", "antithetic", "tmc")
_ROW_METHODS = ("permutation", "antithetic", "tmc")


def minimum_budget(method: str, n: int) -> int:
    """The fewest evaluations (v(empty) free) that give a method one complete sample."""
    everything = (1 << n) - 1
    minimums = {"exact": everything, "permutation": n, "tmc": n, "antithetic": max(1, 2 * n - 1),
                "stratified": min(everything, 2 * n * max(0, n - 2) + 2 * n + 1),
                "kernel": min(everything, 2 * n + 1), "msr": 2}
    return minimums[method]


def _check_method(value: str, method: str, allowed: tuple[str, ...]) -> None:
    if method not in allowed:
        raise ValueError(f"unknown {value} method {method!r}; choose one of {', '.join(allowed)}")


def _check_budget(value: str, method: str, n: int, budget: int | None, needed: int | None = None) -> None:
    needed = minimum_budget(method, n) if needed is None else needed
    if budget is not None and budget < needed:
        raise ValueError(f"budget={budget} is too small for {value}/{method} with {n} players: the minimum is "
                         f"{needed} coalition evaluations (v(empty) is free)")


def _budget_or_default(budget: int | None) -> int:
    return DEFAULT_BUDGET if budget is None else budget


def _rng(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _result(players: tuple, values, stderr, n_evals: int, method: str, details: dict | None = None) -> CreditEstimate:
    return CreditEstimate({p: float(x) + 0.0 for p, x in zip(players, values)},
                          {p: float(s) for p, s in zip(players, stderr)}, int(n_evals), method, details or {})


def _exact_semivalue(value: str, cache: CachedValue, players: tuple, budget: int | None, weights) -> CreditEstimate:
    """Shapley or Banzhaf from the one exact table; per-seed noise goes to details["noise_stderr"]."""
    _check_budget(value, "exact", len(players), budget)
    values, noise = semivalue(exact_table(cache, players), weights)
    details = {} if noise is None else {"noise_stderr": dict(zip(players, map(float, noise)))}
    return _result(players, values, np.zeros(len(players)), 1 << len(players), f"{value}/exact", details)


def shapley(v, players: Sequence[Hashable], method: str = "auto", budget: int | None = None, seed=0,
            efficiency_correction: bool = False, *, tolerance: float = 0.0) -> CreditEstimate:
    """Shapley value phi_i = sum over S not containing i of |S|!(n-|S|-1)!/n! [v(S + i) - v(S)].

    `tolerance` is TMC's truncation threshold. `efficiency_correction` adds (v(N) - v(empty) - sum)/n to
    every sampled value so that they sum to v(N) - v(empty) (the stderr is left as estimated)."""
    players = validate_players(players)
    _check_method("shapley", method, SHAPLEY_METHODS)
    cache, n = as_cached_value(v, players), len(players)
    if method == "exact" or (method == "auto" and _budget_or_default(budget) >= minimum_budget("exact", n)):
        estimate = _exact_semivalue("shapley", cache, players, budget, shapley_weights(n))
        return _with_details(estimate, {"requested": method}) if method == "auto" else estimate
    budget = DEFAULT_BUDGET if budget is None else budget
    _check_budget("shapley", "permutation" if method == "auto" else method, n, budget)
    game = montecarlo.Game(cache, players, budget)
    chosen, sampled = _sample(game, method, _rng(seed), tolerance, SHAPLEY_METHODS)
    details = {"requested": method, "budget": budget, **sampled.details}
    values = sampled.values
    if efficiency_correction:
        game.budget = None
        gap = game.value(game.full) - game.value(0) - float(values.sum())
        values, details["efficiency_gap"] = values + gap / n, gap
    return _result(players, values, sampled.stderr, game.n_evals, f"shapley/{chosen}", details)


def _with_details(estimate: CreditEstimate, extra: dict) -> CreditEstimate:
    return CreditEstimate(estimate.values, estimate.stderr, estimate.n_evals, estimate.method,
                          {**estimate.details, **extra})


def _sample(game: montecarlo.Game, method: str, rng: np.random.Generator, tolerance: float,
            allowed: tuple[str, ...]) -> tuple[str, montecarlo.Sampled]:
    """Run one sampled Shapley estimator (or the auto policy) on a game: (estimator used, result)."""
    if method == "auto":
        return _auto(game, rng, tolerance, allowed)
    if method == "stratified":
        return method, montecarlo.stratified(game, rng, game.budget)
    if method == "kernel":
        return method, montecarlo.kernel_shap(game, rng, game.budget)
    return method, _from_rows(_rows(game, method, rng, tolerance))


def _rows(game: montecarlo.Game, method: str, rng: np.random.Generator, tolerance: float) -> np.ndarray:
    if method == "antithetic":
        return montecarlo.antithetic_rows(game, rng, game.budget)
    return montecarlo.permutation_rows(game, rng, game.budget, tolerance if method == "tmc" else None)


def _from_rows(rows: np.ndarray, details: dict | None = None) -> montecarlo.Sampled:
    values, stderr = montecarlo.mean_and_stderr(rows)
    return montecarlo.Sampled(values, stderr, {"samples": len(rows), **(details or {})})


def _auto(game: montecarlo.Game, rng: np.random.Generator, tolerance: float,
          allowed: tuple[str, ...]) -> tuple[str, montecarlo.Sampled]:
    """The sampled part of the auto policy (see the module docstring)."""
    n = game.n
    if "kernel" in allowed and n <= AUTO_KERNEL_MAX_PLAYERS:
        result = montecarlo.kernel_shap(game, rng, game.budget)
        return "kernel", montecarlo.Sampled(result.values, result.stderr,
                                          {**result.details, "auto": f"n <= {AUTO_KERNEL_MAX_PLAYERS}"})
    pilot_evals = max(int(montecarlo.PILOT_FRACTION * game.budget), 2 * minimum_budget("antithetic", n))
    if pilot_evals > montecarlo.PILOT_MAX_FRACTION * game.budget:
        rows = _rows(game, "permutation", rng, tolerance)
        return "permutation", _from_rows(rows, {"auto": "budget too small for a pilot"})
    pilot = montecarlo.run_pilot(game, rng, pilot_evals)
    chosen, stats = montecarlo.choose(game, pilot, allowed, minimum_budget("stratified", n), tolerance)
    if chosen in _ROW_METHODS:
        rows = np.vstack([montecarlo.pilot_rows(pilot, chosen), _rows(game, chosen, rng, tolerance)])
        return chosen, _from_rows(rows, stats)
    result = montecarlo.stratified(game, rng, game.budget)
    return chosen, montecarlo.Sampled(result.values, result.stderr, {**result.details, **stats})


def banzhaf(v, players: Sequence[Hashable], method: str = "exact", budget: int | None = None,
            seed=0) -> CreditEstimate:
    """Raw Banzhaf value beta_i = 2^-(n-1) sum over S not containing i of [v(S + i) - v(S)] (not efficient).

    `msr` samples S with each player in w.p. 1/2; `auto` is exact when 2^n - 1 fits the budget, else msr."""
    players = validate_players(players)
    _check_method("banzhaf", method, BANZHAF_METHODS)
    cache, n = as_cached_value(v, players), len(players)
    if method == "exact" or (method == "auto" and _budget_or_default(budget) >= minimum_budget("exact", n)):
        return _exact_semivalue("banzhaf", cache, players, budget, banzhaf_weights(n))
    budget = DEFAULT_BUDGET if budget is None else budget
    _check_budget("banzhaf", "msr", n, budget)
    game = montecarlo.Game(cache, players, budget)
    result = montecarlo.msr_banzhaf(game, _rng(seed), budget)
    return _result(players, result.values, result.stderr, game.n_evals, "banzhaf/msr",
                   {"requested": method, "budget": budget, **result.details})


def _check_unions(players: tuple, unions) -> list[list[int]]:
    """Unions as lists of player indices; they must partition the players."""
    index = {p: k for k, p in enumerate(players)}
    named = [p for union in unions for p in union]
    unknown = sorted({str(p) for p in named if p not in index})
    if unknown:
        raise ValueError(f"unions name players that are not in the game: {unknown} (players: {list(players)})")
    repeated = sorted({str(p) for p in named if named.count(p) > 1})
    missing = sorted(str(p) for p in players if p not in set(named))
    if repeated or missing:
        raise ValueError(f"unions must partition the players: repeated {repeated}, missing {missing} "
                         "(put a player alone in its own union to keep it apart)")
    return [[index[p] for p in union] for union in unions if len(union)]


def owen(v, players: Sequence[Hashable], unions: Sequence[Sequence[Hashable]], method: str = "exact",
         budget: int | None = None, seed=0) -> CreditEstimate:
    """Owen value for a priori unions (a partition of the players): the average marginal over orders in
    which each union's members are contiguous. Union totals equal the Shapley value of the game between
    unions; singleton unions or one union give the Shapley value."""
    players = validate_players(players)
    _check_method("owen", method, OWEN_METHODS)
    groups = _check_unions(players, unions)
    cache, n = as_cached_value(v, players), len(players)
    if method == "exact" or (method == "auto" and _budget_or_default(budget) >= minimum_budget("exact", n)):
        _check_budget("owen", "exact", n, budget)
        values = owen_exact(exact_table(cache, players), groups)
        return _result(players, values, np.zeros(n), 1 << n, "owen/exact")
    budget = DEFAULT_BUDGET if budget is None else budget
    _check_budget("owen", "permutation", n, budget)
    game, rng = montecarlo.Game(cache, players, budget), _rng(seed)
    rows = montecarlo.permutation_rows(game, rng, budget, order=lambda: montecarlo.owen_order(rng, groups))
    result = _from_rows(rows, {"requested": method, "budget": budget})
    return _result(players, result.values, result.stderr, game.n_evals, "owen/permutation", result.details)


def _graph_players(v, graph, players) -> tuple:
    """The game's players: given, else those of a CachedValue / CoalitionTable, else the graph's nodes."""
    if players is None:
        players = v.players if isinstance(v, (CachedValue, CoalitionTable)) else tuple(graph.nodes)
    players = validate_players(players)
    unknown = sorted(str(node) for node in graph.nodes if node not in set(players))
    if unknown:
        raise ValueError(f"graph nodes {unknown} are not players of the game (players: {list(players)})")
    return players


def myerson(v, graph, method: str = "exact", budget: int | None = None, seed=0, *,
            players: Sequence[Hashable] | None = None, tolerance: float = 0.0) -> CreditEstimate:
    """Myerson value: the Shapley value of v^G(S) = sum over connected components C of S in `graph` of
    v(C) - v(empty). Only connected coalitions are evaluated (a path of 20 agents: 210). A directed graph
    is read as undirected; players outside the graph (given by `players`) are isolated."""
    import networkx as nx

    players = _graph_players(v, graph, players)
    _check_method("myerson", method, MYERSON_METHODS)
    cache, n = as_cached_value(v, players), len(players)
    undirected = nx.Graph(graph)
    index = {p: k for k, p in enumerate(players)}
    adjacency = [sum(1 << index[q] for q in undirected.neighbors(p)) if p in undirected else 0 for p in players]
    connected = _exact_myerson_plan(adjacency, method, budget) if method in ("exact", "auto") else None
    if connected is not None:
        return _myerson_exact(cache, players, connected, method)
    budget = DEFAULT_BUDGET if budget is None else budget
    _check_budget("myerson", "permutation" if method == "auto" else method, n, budget)
    game = montecarlo.GraphGame(cache, players, adjacency, budget)
    chosen, result = _sample(game, method, _rng(seed), tolerance, MYERSON_METHODS)
    return _result(players, result.values, result.stderr, game.n_evals, f"myerson/{chosen}",
                   {"requested": method, "budget": budget, **result.details})


def _exact_myerson_plan(adjacency: list[int], method: str, budget: int | None) -> list[int] | None:
    """The connected coalitions when exact Myerson applies (always for `exact`, within budget for `auto`)."""
    if method == "auto":
        connected = connected_coalitions(adjacency, min(MAX_MYERSON_CONNECTED, _budget_or_default(budget)))
        return connected if connected is not None and len(connected) <= _budget_or_default(budget) else None
    connected = connected_coalitions(adjacency, MAX_MYERSON_CONNECTED)
    if connected is None:
        raise ValueError(f"exact Myerson would evaluate more than {MAX_MYERSON_CONNECTED} connected coalitions; "
                         "use a sampled method (permutation, antithetic, tmc or auto) with a budget")
    _check_budget("myerson", "exact", len(adjacency), budget, needed=len(connected))
    return connected


def _myerson_exact(cache: CachedValue, players: tuple, connected: list[int], method: str) -> CreditEstimate:
    game = montecarlo.Game(cache, players)
    empty = game.value(0)
    values = np.array([game.value(mask) - empty for mask in connected])
    phi = myerson_from_dividends(connected, values, len(players))
    return _result(players, phi, np.zeros(len(players)), game.n_evals, "myerson/exact",
                   {"requested": method, "connected_coalitions": len(connected)})


def difference_rewards(v, players: Sequence[Hashable]) -> CreditEstimate:
    """Difference rewards (wonderful life utility) D_i = v(N) - v(N minus i): n + 1 evaluations, not efficient."""
    players = validate_players(players)
    cache = as_cached_value(v, players)
    game = montecarlo.Game(cache, players)
    values = [game.value(game.full) - game.value(game.full & ~(1 << k)) for k in range(len(players))]
    return _result(players, values, np.zeros(len(players)), game.n_evals, "difference/exact")


def least_core(v, players: Sequence[Hashable]) -> CreditEstimate:
    """Least core (Maschler, Peleg, Shapley 1979): min epsilon such that some split x of v(N) - v(empty)
    gives every proper coalition x(S) >= v(S) - v(empty) - epsilon (HiGHS LP over 2^n - 2 constraints).
    details["epsilon"] is epsilon*; the values are the least-core point nearest the Shapley value (max-norm)."""
    players = validate_players(players)
    n = len(players)
    if n < 2:
        raise ValueError("least_core needs at least 2 players (with one, every epsilon works)")
    if n > MAX_LEAST_CORE_PLAYERS:
        raise ValueError(f"least_core enumerates 2^{n} - 2 constraints; the limit is {MAX_LEAST_CORE_PLAYERS} players")
    table = exact_table(as_cached_value(v, players), players)
    anchor, _ = semivalue(table, shapley_weights(n))
    point, epsilon = least_core_exact(table, anchor)
    return _result(players, point, np.zeros(n), 1 << n, "least_core/exact",
                   {"epsilon": epsilon, "point": "nearest the Shapley value (max-norm) in the least core"})
