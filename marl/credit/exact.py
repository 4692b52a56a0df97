"""Coalition values and exact credit from one table of all coalitions.

A coalition value maps a frozenset of players to a number: the expected team return when only those
agents act normally (or a 1-D array of per-seed returns, whose mean is used). `CachedValue` wraps it:
it memoises by coalition, counts the distinct calls, checks each result and names the coalition when
the value function fails. `exact_table` evaluates it once on all 2^n coalitions, in bitmask order
(bit k set = `players[k]` present), and every exact value is read from that one table: Shapley and
Banzhaf as semivalues (numpy, one pass per player), Owen and the least core (scipy's HiGHS). Exact
Myerson evaluates only connected coalitions and works with Harsanyi dividends.

Normalisation: credit splits v(N) - v(empty). Myerson and the least core use v(S) - v(empty), so a
constant baseline return never shows up as credit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_EXACT_PLAYERS = 24          # 2^24 coalitions: 128 MiB of float64
MAX_LEAST_CORE_PLAYERS = 16     # 2^16 - 2 LP constraints
MAX_MYERSON_CONNECTED = 1 << 15  # the dividend recursion is quadratic in the number of connected sets
_CHUNK = 1 << 16                 # rows per call of a BatchValue


@dataclass(frozen=True)
class CreditEstimate:
    """Per-player credit with standard errors (0.0 for exact methods) and the evaluations it used.

    `n_evals` counts the distinct coalitions whose value the estimate used, v(empty) included when it
    was needed; `method` reads "value/estimator" (e.g. "shapley/tmc"); `details` holds extras such as the
    least-core epsilon, what `auto` chose and why, or the number of samples."""

    values: dict[Hashable, float]
    stderr: dict[Hashable, float]
    n_evals: int
    method: str
    details: dict[str, Any] = field(default_factory=dict)


def coalition_name(coalition) -> str:
    """A coalition as sorted player names, e.g. "{alice, bob}"."""
    return "{" + ", ".join(sorted(str(p) for p in coalition)) + "}"


class CoalitionError(ValueError):
    """The value of one coalition could not be used; `coalition` says which, the cause is chained."""

    def __init__(self, coalition, reason: str):
        self.coalition = frozenset(coalition)
        super().__init__(f"value of coalition {coalition_name(coalition)}: {reason}")


class NonFiniteValue(CoalitionError):
    """The value function returned NaN or an infinity for a coalition (a failed judge, in replay credit)."""


def validate_players(players: Sequence[Hashable]) -> tuple:
    """The players as a tuple; refuses an empty sequence and duplicate names."""
    if isinstance(players, (str, bytes)):
        raise ValueError(f"players must be a sequence of names, not the single string {players!r}")
    players = tuple(players)
    if not players:
        raise ValueError("players is empty: a game needs at least one player")
    seen, repeated = set(), []
    for player in players:
        if player in seen:
            repeated.append(player)
        seen.add(player)
    if repeated:
        raise ValueError(f"players are listed more than once: {sorted(map(str, repeated))}")
    return players


def check_value(raw, coalition) -> tuple[float, np.ndarray | None]:
    """(value, per-seed returns or None) from what a value function returned, or a CoalitionError."""
    try:
        array = np.asarray(raw, dtype=float)
    except (TypeError, ValueError) as exc:
        raise CoalitionError(coalition, f"the value function returned {raw!r}, not a number") from exc
    if array.ndim > 1 or array.size == 0:
        raise CoalitionError(coalition, f"the value function returned an array of shape {array.shape}; "
                             "expected a number or a non-empty 1-D array of per-seed returns")
    if not np.all(np.isfinite(array)):
        raise NonFiniteValue(coalition, f"the value function returned a non-finite value {raw!r}")
    if array.ndim == 0:
        return float(array), None
    return float(array.mean()), array


class BatchValue:
    """A coalition value that scores many coalitions in one call (the fast path of `exact_table`).

    `fn(membership)` gets a bool array of shape (m, n) whose columns follow `players` and returns m
    values, shape (m,), or m rows of per-seed returns, shape (m, R). The object is also an ordinary
    value function of one frozenset, so every estimator accepts it."""

    def __init__(self, fn: Callable[[np.ndarray], Any], players: Sequence[Hashable]):
        self.fn = fn
        self.players = validate_players(players)
        self._column = {player: k for k, player in enumerate(self.players)}

    def membership(self, coalition) -> np.ndarray:
        """One row of the membership matrix."""
        row = np.zeros((1, len(self.players)), dtype=bool)
        row[0, [self._column[player] for player in coalition]] = True
        return row

    def __call__(self, coalition):
        return np.asarray(self.fn(self.membership(coalition)), dtype=float)[0]


class CoalitionTable(Mapping):
    """The values of all 2^n coalitions in bitmask order; a read-only Mapping frozenset -> float.

    `values[mask]` is v of the coalition whose bit k is set for `players[k]`; `variances[mask]` (or
    None) is the variance of that mean when the value function returned per-seed returns."""

    def __init__(self, players: Sequence[Hashable], values: np.ndarray, variances: np.ndarray | None = None):
        self.players = tuple(players)
        self.player_set = frozenset(self.players)
        self.values = values
        self.variances = variances
        self._bit = {player: 1 << k for k, player in enumerate(self.players)}

    def mask(self, coalition) -> int:
        """The bitmask of a coalition (KeyError for a player outside the table)."""
        return sum(self._bit[player] for player in coalition)

    def coalition(self, mask: int) -> frozenset:
        """The coalition of a bitmask."""
        return frozenset(p for k, p in enumerate(self.players) if mask >> k & 1)

    def __getitem__(self, coalition) -> float:
        return float(self.values[self.mask(coalition)])

    def __iter__(self) -> Iterator[frozenset]:
        return (self.coalition(mask) for mask in range(len(self.values)))

    def __len__(self) -> int:
        return len(self.values)

    def __call__(self, coalition) -> float:
        return self[coalition]


class CachedValue:
    """Wraps a value function v(frozenset): memoised, counted, checked, failures named.

    `n_evals` counts the distinct calls of v. A coalition whose value raises, is not a number or is not
    finite becomes a CoalitionError naming it. Per-seed returns (a 1-D array) are reduced to their mean;
    `per_seed(coalition)` gives them back. Once `exact_table` has run, lookups read the table."""

    def __init__(self, v: Callable, players: Sequence[Hashable]):
        self.v = v
        self.players = validate_players(players)
        self.n_evals = 0
        self.table: CoalitionTable | None = None
        self._memo: dict[frozenset, float] = {}
        self._per_seed: dict[frozenset, np.ndarray] = {}

    def __call__(self, coalition) -> float:
        coalition = frozenset(coalition)
        value = self._memo.get(coalition)
        if value is None:
            if self.table is not None and coalition <= self.table.player_set:
                return self.table[coalition]
            value, per_seed = self.evaluate(coalition)
            self._memo[coalition] = value
            if per_seed is not None:
                self._per_seed[coalition] = per_seed
        return value

    def evaluate(self, coalition: frozenset) -> tuple[float, np.ndarray | None]:
        """One counted, unmemoised call of v: (mean value, per-seed returns or None)."""
        try:
            raw = self.v(coalition)
        except Exception as exc:
            raise CoalitionError(coalition, f"the value function raised {type(exc).__name__}: {exc}") from exc
        self.n_evals += 1
        return check_value(raw, coalition)

    def per_seed(self, coalition) -> np.ndarray | None:
        """The per-seed returns of an evaluated coalition, or None when v returned one number."""
        return self._per_seed.get(frozenset(coalition))


def as_cached_value(v, players: Sequence[Hashable]) -> CachedValue:
    """Reuse a CachedValue (its cache is shared) or wrap a value function, BatchValue or CoalitionTable."""
    players = validate_players(players)
    if isinstance(v, CachedValue):
        cache = v
    else:
        cache = CachedValue(v, v.players if isinstance(v, CoalitionTable) else players)
        if isinstance(v, CoalitionTable):
            cache.table = v
    known = set(cache.players)
    unknown = [p for p in players if p not in known]
    if unknown:
        raise ValueError(f"players {sorted(map(str, unknown))} are not players of the given coalition value "
                         f"(its players: {sorted(map(str, cache.players))})")
    return cache


def popcounts(n: int) -> np.ndarray:
    """Coalition sizes of all 2^n bitmasks, in mask order."""
    sizes = np.zeros(1, dtype=np.int64)
    for _ in range(n):
        sizes = np.concatenate([sizes, sizes + 1])
    return sizes


def membership_rows(masks: np.ndarray, n: int) -> np.ndarray:
    """Bool membership matrix (len(masks), n) of bitmasks."""
    return ((masks[:, None] >> np.arange(n)) & 1).astype(bool)


def exact_table(v, players: Sequence[Hashable]) -> CoalitionTable:
    """v on all 2^n coalitions, once; reused by every exact value (and stored on a shared CachedValue).

    A BatchValue is called on blocks of 65536 coalitions, anything else once per coalition."""
    players = validate_players(players)
    n = len(players)
    if n > MAX_EXACT_PLAYERS:
        raise ValueError(f"an exact table of {n} players needs 2^{n} coalitions; the limit is "
                         f"{MAX_EXACT_PLAYERS} players: use a sampled method with a budget")
    cache = as_cached_value(v, players)
    if cache.table is not None and cache.table.players == players:
        return cache.table
    if isinstance(cache.v, BatchValue) and cache.table is None:
        values, variances = _evaluate_batches(cache, players)
    else:
        values, variances = _evaluate_each(cache, players)
    table = CoalitionTable(players, values, variances)
    cache.table = table
    return table


def _evaluate_each(cache: CachedValue, players: tuple) -> tuple[np.ndarray, np.ndarray | None]:
    """Table by one call of the (cached) value function per coalition."""
    size = 1 << len(players)
    values = np.empty(size)
    variances = None
    for mask in range(size):
        coalition = frozenset(p for k, p in enumerate(players) if mask >> k & 1)
        values[mask] = cache(coalition)  # memoised: a failure later on does not lose these evaluations
        per_seed = cache.per_seed(coalition)
        if per_seed is not None and per_seed.size > 1:
            if variances is None:
                variances = np.zeros(size)
            variances[mask] = per_seed.var(ddof=1) / per_seed.size
    return values, variances


def _evaluate_batches(cache: CachedValue, players: tuple) -> tuple[np.ndarray, np.ndarray | None]:
    """Table by blocks of a BatchValue; a failing block is retried row by row to name the coalition."""
    batch: BatchValue = cache.v
    columns = [batch.players.index(p) for p in players]  # the batch may order (or hold) players differently
    n, size = len(players), 1 << len(players)
    values, variances = np.empty(size), None
    for start in range(0, size, _CHUNK):
        masks = np.arange(start, min(size, start + _CHUNK), dtype=np.int64)
        rows = np.zeros((len(masks), len(batch.players)), dtype=bool)
        rows[:, columns] = membership_rows(masks, n)
        try:
            out = np.asarray(batch.fn(rows), dtype=float)
        except Exception:
            _name_failing_row(cache, masks, players)
            raise
        if out.shape[:1] != (len(masks),) or out.ndim > 2 or not np.all(np.isfinite(out)):
            _name_failing_row(cache, masks, players)
            raise ValueError(f"the batch value function returned shape {out.shape} for {len(masks)} rows")
        values[masks] = out if out.ndim == 1 else out.mean(axis=1)
        if out.ndim == 2 and out.shape[1] > 1:
            variances = np.zeros(size) if variances is None else variances
            variances[masks] = out.var(axis=1, ddof=1) / out.shape[1]
    cache.n_evals += size
    return values, variances


def _name_failing_row(cache: CachedValue, masks: np.ndarray, players: tuple) -> None:
    """Evaluate a block one coalition at a time so that the CoalitionError names the culprit."""
    for mask in masks.tolist():
        cache.evaluate(frozenset(p for k, p in enumerate(players) if mask >> k & 1))


def shapley_weights(n: int) -> np.ndarray:
    """Weight of a marginal at a coalition of size s (not containing the player): s!(n-s-1)!/n!."""
    return np.array([1.0 / (n * math.comb(n - 1, s)) for s in range(n)])


def banzhaf_weights(n: int) -> np.ndarray:
    """Every marginal weighs 1/2^(n-1)."""
    return np.full(n, 0.5 ** (n - 1))


def semivalue(table: CoalitionTable, size_weights: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """sum over S not containing i of weight(|S|) [v(S+i) - v(S)] for every i, and its noise stderr.

    For player i the table viewed as shape (-1, 2, 2^i) puts the coalitions without i at [:, 0, :] and
    their partners with i at [:, 1, :]; marginals are summed per size first (bincount), then weighted.
    The stderr (None unless per-seed returns were given) propagates the variance of each v(S) mean."""
    n = len(table.players)
    sizes = popcounts(n)
    values = np.empty(n)
    noise = None if table.variances is None else np.empty(n)
    for i in range(n):
        without = sizes.reshape(-1, 2, 1 << i)[:, 0, :].ravel()
        pair = table.values.reshape(-1, 2, 1 << i)
        marginals = (pair[:, 1, :] - pair[:, 0, :]).ravel()
        values[i] = np.bincount(without, weights=marginals, minlength=n) @ size_weights
        if noise is not None:
            var = table.variances.reshape(-1, 2, 1 << i)
            summed = (var[:, 1, :] + var[:, 0, :]).ravel()
            noise[i] = math.sqrt(np.bincount(without, weights=summed, minlength=n) @ size_weights ** 2)
    return values, noise


def subset_masks(elements: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(masks, sizes) of all unions of subsets of the given disjoint bitmasks, counted in elements."""
    masks, sizes = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    for element in elements:
        masks = np.concatenate([masks, masks | element])
        sizes = np.concatenate([sizes, sizes + 1])
    return masks, sizes


def owen_exact(table: CoalitionTable, unions: list[list[int]]) -> np.ndarray:
    """Owen value: average marginal over orders that keep every union contiguous.

    phi_i = sum over R (other unions) and T (own union minus i) of
    [r!(m-r-1)!/m!] [t!(b-t-1)!/b!] [v(Q_R + T + i) - v(Q_R + T)]."""
    n, m = len(table.players), len(unions)
    union_masks = [sum(1 << i for i in union) for union in unions]
    phi = np.empty(n)
    for k, union in enumerate(unions):
        other_masks, r = subset_masks([mask for j, mask in enumerate(union_masks) if j != k])
        union_weight = shapley_weights(m)[r]
        for i in union:
            inner_masks, t = subset_masks([1 << j for j in union if j != i])
            weight = union_weight[:, None] * shapley_weights(len(union))[t][None, :]
            base = other_masks[:, None] | inner_masks[None, :]
            marginals = table.values[base | (1 << i)] - table.values[base]
            phi[i] = float(np.sum(weight * marginals))
    return phi


def least_core_exact(table: CoalitionTable, anchor: np.ndarray) -> tuple[np.ndarray, float]:
    """(x, epsilon*): min epsilon s.t. x(S) >= v(S) - v(empty) - epsilon for all proper S, x(N) = v(N) - v(empty).

    The least core is a set; the point returned is the one nearest `anchor` (the Shapley value) in the
    max-norm, found by a second LP with epsilon fixed at epsilon*."""
    from scipy.optimize import linprog

    n = len(table.players)
    values = table.values - table.values[0]
    masks = np.arange(1, (1 << n) - 1, dtype=np.int64)
    members = membership_rows(masks, n).astype(float)
    a_ub = -np.hstack([members, np.ones((len(masks), 1))])
    a_eq = np.append(np.ones(n), 0.0)[None, :]
    first = linprog(np.append(np.zeros(n), 1.0), A_ub=a_ub, b_ub=-values[masks], A_eq=a_eq,
                    b_eq=[values[-1]], bounds=[(None, None)] * (n + 1), method="highs")
    if first.status != 0:
        raise RuntimeError(f"the least-core LP failed: {first.message}")
    epsilon = float(first.x[-1]) + 0.0
    # second LP over (x, t): min t s.t. x(S) >= v(S) - epsilon*, |x_i - anchor_i| <= t, x(N) = v(N)
    eye = np.eye(n)
    a_ub2 = np.vstack([np.hstack([-members, np.zeros((len(masks), 1))]),
                       np.hstack([eye, -np.ones((n, 1))]), np.hstack([-eye, -np.ones((n, 1))])])
    b_ub2 = np.concatenate([-(values[masks] - epsilon), anchor, -anchor])
    second = linprog(np.append(np.zeros(n), 1.0), A_ub=a_ub2, b_ub=b_ub2, A_eq=a_eq, b_eq=[values[-1]],
                     bounds=[(None, None)] * n + [(0, None)], method="highs")
    point = second.x[:n] if second.status == 0 else first.x[:n]
    return point, epsilon


def connected_coalitions(adjacency: Sequence[int], limit: int) -> list[int] | None:
    """Bitmasks of all connected coalitions of a graph (adjacency[k] = neighbour mask of player k),
    grown one neighbour at a time from the singletons; None as soon as there are more than `limit`."""
    found = {1 << k for k in range(len(adjacency))}
    frontier = list(found)
    while frontier:
        grown = []
        for mask in frontier:
            neighbours, rest = 0, mask
            while rest:
                low = rest & -rest
                neighbours |= adjacency[low.bit_length() - 1]
                rest ^= low
            neighbours &= ~mask
            while neighbours:
                low = neighbours & -neighbours
                neighbours ^= low
                if mask | low not in found:
                    found.add(mask | low)
                    grown.append(mask | low)
        if len(found) > limit:
            return None
        frontier = grown
    return sorted(found, key=lambda mask: (bin(mask).count("1"), mask))


def myerson_from_dividends(masks: list[int], values: np.ndarray, n: int) -> np.ndarray:
    """Myerson value from v - v(empty) on the connected coalitions (sorted by size).

    The graph-restricted game has Harsanyi dividends only on connected coalitions, so
    d(S) = v(S) - sum of d(T) over connected T strictly inside S, and phi_i = sum over S containing i of
    d(S)/|S|. Computed one size layer at a time against all smaller layers."""
    masks_array = np.array(masks, dtype=np.int64)
    sizes = np.array([bin(mask).count("1") for mask in masks], dtype=np.int64)
    dividends = np.zeros(len(masks))
    for size in np.unique(sizes):
        layer = np.flatnonzero(sizes == size)
        below = np.flatnonzero(sizes < size)
        for block in np.array_split(layer, max(1, len(layer) * max(1, len(below)) // 4_000_000 + 1)):
            inside = (masks_array[below][None, :] & ~masks_array[block][:, None]) == 0
            dividends[block] = values[block] - inside.astype(float) @ dividends[below]
    members = membership_rows(masks_array, n).astype(float)
    return members.T @ (dividends / sizes)

