"""Sampled credit estimators over one shared evaluation cache, and the `auto` choice between them.

The budget is a number of distinct coalition evaluations: every estimate looks coalitions up through
one `Game`, which memoises them (so overlapping permutations and the auto pilot cost nothing twice),
counts the distinct non-empty coalitions (v(empty) is free) and stops the sampler, between samples,
before the next new coalition would exceed the budget. A partly drawn sample is dropped. Sampling also
stops after `budget` samples, so a game whose coalitions are all cached cannot loop forever.

Estimators: permutation Monte Carlo (Castro et al. 2009), antithetic
pairs (pi, reversed pi), truncated MC (TMC, Ghorbani and Zou 2019: marginals after the prefix value is
within `tolerance` of v(N) are 0; unbiased with tolerance 0 on monotone games whose maximum is v(N)),
stratified by player x coalition size with Neyman allocation (Maleki et al. 2013; Castro et al. 2017),
KernelSHAP with the extreme coalition sizes enumerated (Lundberg and Lee 2017, as shap's
KernelExplainer), Banzhaf by maximum sample reuse (Wang and Jia 2023) and Owen by permutations that keep
every union contiguous. Standard errors: sample sd / sqrt(samples) for Monte Carlo (NaN with fewer than 2
samples), the per-stratum variances for stratified, a bootstrap over the random draws for KernelSHAP.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from marl.credit.exact import CachedValue

PILOT_FRACTION = 0.1      # of the budget, but at least two antithetic pairs
PILOT_MAX_FRACTION = 0.4  # no pilot when two pairs would cost more than this
BOOTSTRAP_ROUNDS = 100


class BudgetExhausted(Exception):
    """Raised by Game.value when one more new coalition would exceed the budget."""


@dataclass
class Sampled:
    """What a sampler returns: values and stderr per player (in player order) and details."""

    values: np.ndarray
    stderr: np.ndarray
    details: dict = field(default_factory=dict)


class Game:
    """Coalitions as bitmasks over `players` (bit k = players[k]), memoised for one estimate."""

    def __init__(self, cache: CachedValue, players: tuple, budget: int | None = None):
        self.cache = cache
        self.players = players
        self.n = len(players)
        self.full = (1 << self.n) - 1
        self.budget = budget
        self.spent = 0
        self._memo: dict[int, float] = {}

    @property
    def n_evals(self) -> int:
        """Distinct coalitions looked up so far, v(empty) included."""
        return len(self._memo)

    def coalition(self, mask: int) -> frozenset:
        return frozenset(p for k, p in enumerate(self.players) if mask >> k & 1)

    def value(self, mask: int) -> float:
        """v of a bitmask; raises BudgetExhausted instead of a new evaluation beyond the budget."""
        value = self._memo.get(mask)
        if value is None:
            if mask:
                if self.budget is not None and self.spent >= self.budget:
                    raise BudgetExhausted
                self.spent += 1
            value = self._memo[mask] = self.cache(self.coalition(mask))
        return value

    def seen_values(self) -> list[float]:
        """Every game value looked up so far (used by the pilot to spot binary games)."""
        return list(self._memo.values())


def components(mask: int, adjacency: list[int]) -> list[int]:
    """Connected components (bitmasks) of the subgraph induced by a coalition."""
    found, rest = [], mask
    while rest:
        component = frontier = rest & -rest
        while frontier:
            reach = 0
            while frontier:
                low = frontier & -frontier
                reach |= adjacency[low.bit_length() - 1]
                frontier ^= low
            frontier = reach & rest & ~component
            component |= frontier
        found.append(component)
        rest &= ~component
    return found


class GraphGame(Game):
    """The graph-restricted game v^G(S) = sum over components C of S of (v(C) - v(empty)).

    Only connected coalitions reach v, so the budget and n_evals count connected coalitions."""

    def __init__(self, cache: CachedValue, players: tuple, adjacency: list[int], budget: int | None = None):
        super().__init__(cache, players, budget)
        self.adjacency = adjacency
        self._restricted: dict[int, float] = {}

    def value(self, mask: int) -> float:
        value = self._restricted.get(mask)
        if value is None:
            empty = Game.value(self, 0)
            value = sum(Game.value(self, part) - empty for part in components(mask, self.adjacency))
            self._restricted[mask] = value
        return value

    def seen_values(self) -> list[float]:
        return list(self._restricted.values())


def collect(draw: Callable[[], np.ndarray], limit: int, width: int) -> np.ndarray:
    """Rows from draw() until the budget runs out or `limit` rows; shape (rows, width)."""
    rows = []
    try:
        while len(rows) < limit:
            rows.append(draw())
    except BudgetExhausted:
        pass
    return np.array(rows, dtype=float).reshape(len(rows), width)


def mean_and_stderr(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and sd / sqrt(rows) (NaN with fewer than two rows)."""
    if len(rows) == 0:
        nan = np.full(rows.shape[1], np.nan)
        return nan, nan
    stderr = rows.std(axis=0, ddof=1) / math.sqrt(len(rows)) if len(rows) > 1 else np.full(rows.shape[1], np.nan)
    return rows.mean(axis=0), stderr


def marginals_along(game: Game, order: np.ndarray, tolerance: float | None = None) -> np.ndarray:
    """Marginal of each player when players join in `order`; with a tolerance (TMC) the scan stops
    once the prefix value is within it of v(N), and the remaining marginals are 0."""
    marginals = np.zeros(game.n)
    target = game.value(game.full) if tolerance is not None else None
    prefix, previous = 0, game.value(0)
    for index in order.tolist():
        if target is not None and abs(target - previous) <= tolerance:
            break
        prefix |= 1 << index
        current = game.value(prefix)
        marginals[index] = current - previous
        previous = current
    return marginals


def permutation_rows(game: Game, rng: np.random.Generator, limit: int, tolerance: float | None = None,
                     order: Callable[[], np.ndarray] | None = None) -> np.ndarray:
    """One row of marginals per random order (plain MC, or TMC with a tolerance)."""
    order = order or (lambda: rng.permutation(game.n))
    return collect(lambda: marginals_along(game, order(), tolerance), limit, game.n)


def antithetic_rows(game: Game, rng: np.random.Generator, limit: int) -> np.ndarray:
    """One row per pair (pi, reversed pi): the mean of the two marginal vectors."""
    def pair() -> np.ndarray:
        order = rng.permutation(game.n)
        return (marginals_along(game, order) + marginals_along(game, order[::-1])) / 2
    return collect(pair, limit, game.n)


def owen_order(rng: np.random.Generator, unions: list[list[int]]) -> np.ndarray:
    """A random order that keeps each union contiguous: unions shuffled, then members inside each."""
    return np.concatenate([rng.permutation(unions[k]) for k in rng.permutation(len(unions))]).astype(int)


def msr_banzhaf(game: Game, rng: np.random.Generator, limit: int) -> Sampled:
    """Banzhaf by maximum sample reuse: S includes each player w.p. 1/2 and every sample updates every
    player, beta_i = mean{v(S): i in S} - mean{v(S): i not in S} (NaN while a side has no sample)."""
    bits = 1 << np.arange(game.n, dtype=np.int64)
    rows = collect(lambda: _msr_row(game, rng, bits), limit, game.n + 1)
    members, values = rows[:, :-1].astype(bool), rows[:, -1]
    estimate, stderr = np.full(game.n, np.nan), np.full(game.n, np.nan)
    for i in range(game.n):
        inside, outside = values[members[:, i]], values[~members[:, i]]
        if len(inside) and len(outside):
            estimate[i] = inside.mean() - outside.mean()
        if len(inside) > 1 and len(outside) > 1:
            stderr[i] = math.sqrt(inside.var(ddof=1) / len(inside) + outside.var(ddof=1) / len(outside))
    return Sampled(estimate, stderr, {"samples": len(rows)})


def _msr_row(game: Game, rng: np.random.Generator, bits: np.ndarray) -> np.ndarray:
    member = rng.random(game.n) < 0.5
    return np.append(member, game.value(int(bits[member].sum())))


def stratified(game: Game, rng: np.random.Generator, limit: int) -> Sampled:
    """Shapley as the mean over sizes s of E[v(S + i) - v(S)], |S| = s, per player: sizes 0 and n-1 are
    single coalitions (exact); the others get equal samples on half the budget, then Neyman allocation
    (proportional to each stratum's sd) on the rest."""
    n = game.n
    ends = _end_strata(game)
    strata = [(i, s) for i in range(n) for s in range(1, n - 1)]
    draws: list[list[float]] = [[] for _ in strata]
    if strata:
        others = [np.delete(np.arange(n), i) for i in range(n)]
        draw = lambda k: draws[k].append(_stratum_marginal(game, rng, strata[k], others))  # noqa: E731
        remaining = (game.budget or limit) - game.spent
        first_rounds = max(1, remaining // (4 * len(strata)))
        _sample_in_order(draw, [k for _ in range(first_rounds) for k in range(len(strata))])
        extra = _neyman(draws, max(0, min(limit, (game.budget or limit) - game.spent)), rng)
        _sample_in_order(draw, extra)
    return _stratified_estimate(n, ends, strata, draws)


def _end_strata(game: Game) -> np.ndarray:
    """Per player, the sum of its two single-coalition strata: v({i}) - v(empty) and v(N) - v(N minus i)."""
    empty, grand = game.value(0), game.value(game.full)
    if game.n == 1:
        return np.array([grand - empty])
    return np.array([(game.value(1 << i) - empty) + (grand - game.value(game.full & ~(1 << i)))
                     for i in range(game.n)])


def _stratum_marginal(game: Game, rng: np.random.Generator, stratum: tuple[int, int], others) -> float:
    player, size = stratum
    mask = int((1 << rng.choice(others[player], size, replace=False).astype(np.int64)).sum())
    return game.value(mask | 1 << player) - game.value(mask)


def _sample_in_order(draw: Callable[[int], None], order: list[int]) -> None:
    try:
        for k in order:
            draw(k)
    except BudgetExhausted:
        pass


def _neyman(draws: list[list[float]], total: int, rng: np.random.Generator) -> list[int]:
    """A shuffled list of `total` strata: half in proportion to each stratum's sd (Neyman; a stratum
    with one sample borrows the mean sd), half equally, so that a stratum whose first samples happened
    to agree is still sampled; largest remainders round the counts."""
    sd = np.array([np.std(d, ddof=1) if len(d) > 1 else np.nan for d in draws])
    sd = np.where(np.isnan(sd), np.nanmean(sd) if np.any(~np.isnan(sd)) else 1.0, sd)
    share = 0.5 * (sd / sd.sum() if sd.sum() > 0 else 1.0 / len(draws)) + 0.5 / len(draws)
    counts = np.floor(share * total).astype(int)
    leftover = total - int(counts.sum())
    counts[np.argsort(counts - share * total)[:leftover]] += 1
    return rng.permutation(np.repeat(np.arange(len(draws)), counts)).tolist()


def _stratified_estimate(n: int, ends: np.ndarray, strata, draws) -> Sampled:
    """phi_i = (ends + sum of stratum means) / n; a stratum with one sample borrows the mean variance of
    its player's other strata (of all strata if none; NaN stderr if no stratum has two samples)."""
    totals, variances = ends.astype(float).copy(), np.zeros(n)
    by_player: dict[int, list[float]] = {}
    for (player, _), d in zip(strata, draws):
        if len(d) > 1:
            by_player.setdefault(player, []).append(float(np.var(d, ddof=1)))
    overall = [var for values in by_player.values() for var in values]
    fallback = float(np.mean(overall)) if overall else np.nan
    for (player, _), d in zip(strata, draws):
        totals[player] += np.mean(d)
        var = np.var(d, ddof=1) if len(d) > 1 else float(np.mean(by_player.get(player, [fallback])))
        variances[player] += var / len(d)
    samples = sum(len(d) for d in draws)
    return Sampled(totals / n, np.sqrt(variances) / n, {"samples": samples})


def kernel_shap(game: Game, rng: np.random.Generator, limit: int) -> Sampled:
    """KernelSHAP: weighted least squares with the Shapley kernel and the efficiency constraint.

    As shap's KernelExplainer: whole coalition sizes are enumerated from the extremes inwards (sizes 1
    and n-1, then 2 and n-2, ...) while the budget covers a size pair's share of the kernel weight; the
    rest of the budget draws coalitions of the other sizes by kernel weight, each with its complement,
    and repeated draws add weight instead of evaluations. With every size enumerated the result is the
    exact Shapley value. The stderr comes from a bootstrap over the random draws (0 if there are none)."""
    n = game.n
    empty, grand = game.value(0), game.value(game.full)
    if n == 1:
        return Sampled(np.array([grand - empty]), np.zeros(1), {"rows": 0})
    rows_left = min(limit, (game.budget or limit) - game.spent)
    weights = _kernel_size_weights(n)
    fixed, fixed_weights, enumerated = _enumerate_extremes(n, rows_left, weights)
    drawn, pairs = _draw_coalitions(n, rng, rows_left - len(fixed), weights, enumerated)
    masks = fixed + drawn
    values = np.array([game.value(mask) for mask in masks]) - empty
    members = ((np.array(masks, dtype=np.int64)[:, None] >> np.arange(n)) & 1).astype(float)
    weight_left = float(weights[enumerated:].sum())

    def solve(draw_counts: np.ndarray) -> np.ndarray:
        flat, repeated = pairs.ravel(), np.repeat(draw_counts, 2)
        counts = np.bincount(flat[flat >= 0], weights=repeated[flat >= 0], minlength=len(drawn))
        sampled = counts * (weight_left / counts.sum()) if counts.sum() > 0 else counts
        return _constrained_wls(members, values, np.concatenate([fixed_weights, sampled]), grand - empty)

    estimate = solve(np.ones(len(pairs)))
    stderr = np.zeros(n)
    if len(pairs):
        boot = [solve(np.bincount(rng.integers(0, len(pairs), len(pairs)), minlength=len(pairs)))
                for _ in range(BOOTSTRAP_ROUNDS)]
        stderr = np.std(boot, axis=0, ddof=1)
    details = {"rows": len(masks), "enumerated_sizes": enumerated, "draws": len(pairs),
               "bootstrap_rounds": BOOTSTRAP_ROUNDS if len(pairs) else 0}
    return Sampled(estimate, stderr, details)


def _kernel_size_weights(n: int) -> np.ndarray:
    """Kernel weight of each size s = 1..ceil((n-1)/2) together with its complement size n - s, summing to 1."""
    sizes = np.arange(1, math.ceil((n - 1) / 2) + 1)
    weights = (n - 1) / (sizes * (n - sizes))
    weights[: (n - 1) // 2] *= 2
    return weights / weights.sum()


def _size_masks(n: int, size: int) -> list[int]:
    return [sum(1 << k for k in chosen) for chosen in combinations(range(n), size)]


def _enumerate_extremes(n: int, rows_left: int, weights: np.ndarray) -> tuple[list[int], np.ndarray, int]:
    """(masks, their kernel weights, number of sizes enumerated), shap's rule: enumerate size s (and n-s)
    while the rows left times the share of the remaining weight covers all its coalitions."""
    full = (1 << n) - 1
    masks, fixed_weights = [], []
    remaining = weights.copy()
    enumerated = 0
    for index, size in enumerate(range(1, len(weights) + 1)):
        paired = size <= (n - 1) // 2
        count = math.comb(n, size) * (2 if paired else 1)
        if rows_left * remaining[index] / count < 1.0 - 1e-8:
            break
        enumerated += 1
        rows_left -= count
        if remaining[index] < 1.0:
            remaining /= 1.0 - remaining[index]
        weight = weights[index] / math.comb(n, size) / (2 if paired else 1)
        for mask in _size_masks(n, size):
            masks += [mask, full & ~mask] if paired else [mask]
            fixed_weights += [weight] * (2 if paired else 1)
    return masks, np.array(fixed_weights), enumerated


def _draw_coalitions(n: int, rng: np.random.Generator, rows_left: int, weights: np.ndarray,
                     enumerated: int) -> tuple[list[int], np.ndarray]:
    """New coalitions drawn by kernel weight from the sizes not enumerated, each with its complement.

    Returns the distinct masks and, per draw, the indices of its mask and complement (-1 if none)."""
    if enumerated == len(weights) or rows_left <= 0:
        return [], np.zeros((0, 2), dtype=int)
    share = weights.copy()
    share[: (n - 1) // 2] /= 2
    share = share[enumerated:] / share[enumerated:].sum()
    full, index_of, masks, pairs = (1 << n) - 1, {}, [], []
    for offset in rng.choice(len(share), 4 * rows_left, p=share):
        if rows_left <= 0:
            break
        size = enumerated + 1 + int(offset)
        mask = int((1 << rng.permutation(n)[:size].astype(np.int64)).sum())
        if mask not in index_of:
            index_of[mask] = len(masks)
            masks.append(mask)
            rows_left -= 1
            if size <= (n - 1) // 2 and rows_left > 0:
                index_of[full & ~mask] = len(masks)
                masks.append(full & ~mask)
                rows_left -= 1
        complement = index_of.get(full & ~mask, -1) if size <= (n - 1) // 2 else -1
        pairs.append((index_of[mask], complement))
    return masks, np.array(pairs, dtype=int).reshape(-1, 2)


def _constrained_wls(members: np.ndarray, values: np.ndarray, weights: np.ndarray, total: float) -> np.ndarray:
    """argmin sum w (v(S) - sum_{i in S} phi_i)^2 subject to sum phi = total, by eliminating the last player."""
    design = members[:, :-1] - members[:, -1:]
    target = values - members[:, -1] * total
    root = np.sqrt(weights)
    coef = np.linalg.lstsq(design * root[:, None], target * root, rcond=None)[0]
    return np.append(coef, total - coef.sum())


@dataclass
class Pilot:
    """Antithetic pilot pairs: forward and backward marginals, each player's position in the forward
    order (its prefix size) and v(empty), v(N)."""

    forward: np.ndarray
    backward: np.ndarray
    sizes: np.ndarray
    empty: float
    grand: float

    @property
    def pairs(self) -> int:
        return len(self.forward)

    def correlation(self) -> float:
        """Pooled correlation of the two marginals of a pair (1 for self-dual games, -1 for quadratic)."""
        centre = (self.forward.mean(axis=0) + self.backward.mean(axis=0)) / 2
        a, b = self.forward - centre, self.backward - centre
        scale = math.sqrt(float((a * a).sum() * (b * b).sum()))
        return float((a * b).sum() / scale) if scale > 0 else 0.0

    def stratification_gain(self, bins: int = 4) -> float:
        """Expected variance ratio of MC over stratified sampling with Neyman allocation: the marginals'
        variance over (sum_b share_b sd_b)^2, sd_b pooled within (player, size bin) cells (a bin without
        two samples in any cell counts with the overall sd). >= 1 when the spread depends on the size."""
        marginals = np.vstack([self.forward, self.backward])
        n = marginals.shape[1]
        group = np.vstack([self.sizes, n - 1 - self.sizes]) * bins // n
        share = np.bincount(np.arange(n) * bins // n, minlength=bins) / n
        within, within_dof = np.zeros(bins), np.zeros(bins)
        total = total_dof = 0.0
        for i in range(n):
            column = marginals[:, i]
            total, total_dof = total + float(((column - column.mean()) ** 2).sum()), total_dof + len(column) - 1
            for b in range(bins):
                part = column[group[:, i] == b]
                within[b] += float(((part - part.mean()) ** 2).sum()) if len(part) > 1 else 0.0
                within_dof[b] += max(0, len(part) - 1)
        if total_dof <= 0 or total == 0.0:
            return 1.0
        sd = np.where(within_dof > 0, np.sqrt(within / np.maximum(within_dof, 1)), math.sqrt(total / total_dof))
        spread = float(share @ sd)
        return math.inf if spread == 0.0 else (total / total_dof) / spread ** 2

    def monotone(self, largest_seen: float) -> bool:
        """No negative marginal and v(N) the largest value seen: TMC with tolerance 0 is then unbiased."""
        return bool((self.forward >= 0).all() and (self.backward >= 0).all() and self.grand >= largest_seen)

    def saturation(self, tolerance: float) -> float:
        """Mean fraction of a forward scan that TMC would evaluate before truncating."""
        n = self.forward.shape[1]
        order = np.argsort(self.sizes, axis=1)
        steps = np.cumsum(np.take_along_axis(self.forward, order, axis=1), axis=1)[:, :-1]
        before = self.empty + np.hstack([np.zeros((len(steps), 1)), steps])
        done = np.abs(self.grand - before) <= tolerance + 1e-9 * max(1.0, abs(self.grand))
        return float(np.where(done.any(axis=1), done.argmax(axis=1), n).mean() / n)


def run_pilot(game: Game, rng: np.random.Generator, evaluations: int) -> Pilot:
    """Antithetic pairs on a sub-budget of `evaluations` new coalitions."""
    forward, backward, sizes = [], [], []
    saved, game.budget = game.budget, game.spent + evaluations
    try:
        while True:
            order = rng.permutation(game.n)
            pair = (marginals_along(game, order), marginals_along(game, order[::-1]))
            forward.append(pair[0])
            backward.append(pair[1])
            sizes.append(np.argsort(order))
    except BudgetExhausted:
        pass
    finally:
        game.budget = saved
    shape = (len(forward), game.n)
    return Pilot(np.array(forward).reshape(shape), np.array(backward).reshape(shape),
                 np.array(sizes).reshape(shape), game.value(0), game.value(game.full))


def choose(game: Game, pilot: Pilot, allowed: tuple[str, ...], stratified_minimum: int,
           tolerance: float) -> tuple[str, dict]:
    """After the pilot: the estimator with the smallest expected variance
    per evaluation, relative to permutation MC (1): antithetic 1 + rho; TMC, for a monotone game, the
    fraction of each order it evaluates; stratified 2 / gain (two evaluations per marginal), only when
    the rest of the budget fills its strata."""
    rho, gain = pilot.correlation(), pilot.stratification_gain()
    factors = {"permutation": 1.0, "antithetic": 1.0 + rho}
    monotone = pilot.monotone(max(game.seen_values()))
    if "tmc" in allowed and monotone:
        factors["tmc"] = pilot.saturation(tolerance)
    if "stratified" in allowed and (game.budget or 0) - game.spent >= stratified_minimum:
        factors["stratified"] = 2.0 / gain
    choice = min(factors, key=factors.get)
    return choice, {"pilot_pairs": pilot.pairs, "pilot_evals": game.spent, "pilot_rho": rho, "pilot_gain": gain,
                    "monotone": monotone, "variance_factors": factors}


def pilot_rows(pilot: Pilot, method: str) -> np.ndarray:
    """Pilot samples the chosen estimator can keep: pairs for antithetic, forward orders for MC/TMC."""
    if method == "antithetic":
        return (pilot.forward + pilot.backward) / 2
    if method in ("permutation", "tmc"):
        return pilot.forward
    return np.empty((0, pilot.forward.shape[1]))
