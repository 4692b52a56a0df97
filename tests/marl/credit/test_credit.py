"""marl.credit.estimators: exact values on games with closed-form values (unanimity, airport, weighted voting...), axioms on random small
games, sampled estimators against exact answers at fixed seeds, budgets, caches and bad input."""

from __future__ import annotations

import math
from fractions import Fraction as F
from itertools import combinations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marl.credit.estimators import (BatchValue, CachedValue, CoalitionError, banzhaf, difference_rewards, exact_table,
                         least_core, myerson, owen, shapley)

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True)


def names(n: int) -> list[str]:
    return [f"p{i}" for i in range(n)]


def assert_values(estimate, expected, tol=1e-12):
    """Estimate values (player order) equal to expected numbers or Fractions."""
    got = list(estimate.values.values())
    assert len(got) == len(expected)
    for value, want in zip(got, expected):
        assert abs(value - float(want)) < tol, (got, [float(w) for w in expected])


def weighted(quota, weights, players=None):
    """Weighted majority game [quota; weights] over players p0.. (or the given names)."""
    players = players or names(len(weights))
    weight = dict(zip(players, weights))
    return lambda s: float(sum(weight[p] for p in s) >= quota)


def unanimity(carrier):
    return lambda s: float(set(carrier) <= s)


def batch_weighted(weights, quota=None):
    """Weighted voting as a BatchValue (quota: half the total weight plus one)."""
    weights = np.asarray(weights)
    quota = weights.sum() // 2 + 1 if quota is None else quota
    return BatchValue(lambda m: (m @ weights >= quota).astype(float), names(len(weights)))


def batch_airport(costs):
    costs = np.asarray(costs, dtype=float)
    return BatchValue(lambda m: (m * costs).max(axis=1, initial=0.0), names(len(costs)))


def batch_quadratic(n, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), np.triu(rng.normal(size=(n, n)), 1)
    return BatchValue(lambda m: m @ a + ((m.astype(float) @ b) * m).sum(axis=1), names(n))


def exact_array(v, players):
    return np.array(list(shapley(v, players, method="exact").values.values()))


def array(estimate):
    return np.array(list(estimate.values.values()))


# ---------------------------------------------------------------- closed-form games (section 2)

def test_glove_games():
    glove = lambda s: min(len(s & {"L"}), len(s & {"R1", "R2"}))  # noqa: E731
    assert_values(shapley(glove, ["L", "R1", "R2"]), [F(2, 3), F(1, 6), F(1, 6)])
    assert_values(banzhaf(glove, ["L", "R1", "R2"]), [F(3, 4), F(1, 4), F(1, 4)])
    assert_values(difference_rewards(glove, ["L", "R1", "R2"]), [1, 0, 0])
    five = lambda s: min(len(s & {"p0", "p1"}), len(s & {"p2", "p3", "p4"}))  # noqa: E731
    assert_values(shapley(five, names(5)), [F(13, 20)] * 2 + [F(7, 30)] * 3)
    assert_values(banzhaf(five, names(5)), [F(11, 16)] * 2 + [F(5, 16)] * 3)


@pytest.mark.parametrize("costs, expected, banzhaf_expected", [
    ((1, 2, 3), [F(1, 3), F(5, 6), F(11, 6)], [F(1, 4), F(3, 4), F(7, 4)]),
    ((8, 11, 13, 18), [2, 3, 4, 9], [1, F(7, 4), F(11, 4), F(31, 4)]),
    ((1, 1, 4, 6, 10), [F(1, 5), F(1, 5), F(6, 5), F(11, 5), F(31, 5)], None),
])
def test_airport_games(costs, expected, banzhaf_expected):
    cost = dict(zip(names(len(costs)), costs))
    airport = lambda s: max((cost[p] for p in s), default=0)  # noqa: E731
    assert_values(shapley(airport, names(len(costs))), expected)
    assert_values(shapley(batch_airport(costs), names(len(costs)), method="exact"), expected)
    if banzhaf_expected:
        assert_values(banzhaf(airport, names(len(costs))), banzhaf_expected)


@pytest.mark.parametrize("quota, weights, expected", [
    (4, (3, 2, 1, 1), [F(1, 2), F(1, 6), F(1, 6), F(1, 6)]),
    (6, (4, 3, 2, 1), [F(5, 12), F(1, 4), F(1, 4), F(1, 12)]),
    (51, (49, 48, 3), [F(1, 3)] * 3),
    (2, (1, 1, 1), [F(1, 3)] * 3),
])
def test_weighted_majority_games(quota, weights, expected):
    assert_values(shapley(weighted(quota, weights), names(len(weights))), expected)


def test_un_security_council_shapley_banzhaf_difference_and_least_core():
    unsc, players = weighted(39, [7] * 5 + [1] * 10), names(15)
    assert_values(shapley(unsc, players, method="exact"), [F(421, 2145)] * 5 + [F(4, 2145)] * 10)
    assert_values(banzhaf(unsc, players), [F(53, 1024)] * 5 + [F(21, 4096)] * 10)
    assert_values(difference_rewards(unsc, players), [1] * 5 + [0] * 10)
    core = least_core(unsc, players)
    assert abs(core.details["epsilon"]) < 1e-9
    point = array(core)
    assert np.all(point[:5] >= -1e-9) and np.allclose(point[5:], 0, atol=1e-9) and abs(point.sum() - 1) < 1e-9


def test_unanimity_games_and_harsanyi_dividends():
    assert_values(shapley(unanimity({"p0", "p1"}), names(5)), [F(1, 2), F(1, 2), 0, 0, 0])
    assert_values(shapley(unanimity({"p1", "p2", "p4"}), names(5)), [0, F(1, 3), F(1, 3), 0, F(1, 3)])
    assert_values(banzhaf(unanimity({"p1", "p2", "p4"}), names(5)), [0, F(1, 4), F(1, 4), 0, F(1, 4)])
    assert_values(banzhaf(unanimity(names(5)), names(5)), [F(1, 16)] * 5)
    assert_values(shapley(unanimity({"p3"}), names(5)), [0, 0, 0, 1, 0])
    mixed = lambda s: (3 * unanimity({"p0", "p1"})(s) + 2 * unanimity({"p1", "p2", "p3"})(s)  # noqa: E731
                       - unanimity({"p0", "p3"})(s))
    assert_values(shapley(mixed, names(4)), [1, F(13, 6), F(2, 3), F(1, 6)])
    assert_values(banzhaf(mixed, names(4)), [1, 2, F(1, 2), 0])


@pytest.mark.parametrize("graph, game, expected", [
    (nx.path_graph(names(3)), unanimity({"p0", "p2"}), [F(1, 3)] * 3),
    (nx.path_graph(names(3)), weighted(2, (1, 1, 1)), [F(1, 6), F(2, 3), F(1, 6)]),
    (nx.star_graph(names(4)), lambda s: float(len(s) >= 2), [F(3, 4), F(1, 12), F(1, 12), F(1, 12)]),
    (nx.star_graph(names(4)), lambda s: max(len(s) - 1.0, 0.0), [F(3, 2), F(1, 2), F(1, 2), F(1, 2)]),
    (nx.path_graph(names(4)), lambda s: float(len(s) ** 2), [F(19, 6), F(29, 6), F(29, 6), F(19, 6)]),
])
def test_myerson_values(graph, game, expected):
    assert_values(myerson(game, graph), expected)


@pytest.mark.parametrize("game, unions, expected", [
    (weighted(2, (1, 1, 1)), [["p0", "p1"], ["p2"]], [F(1, 2), F(1, 2), 0]),
    (weighted(4, (3, 2, 1, 1)), [["p0"], ["p1", "p2", "p3"]], [0, F(1, 3), F(1, 3), F(1, 3)]),
    (weighted(4, (3, 2, 1, 1)), [["p0", "p1"], ["p2", "p3"]], [F(1, 2), F(1, 2), 0, 0]),
    (lambda s: min(len(s & {"p0", "p1"}), len(s & {"p2", "p3", "p4"})),
     [["p0", "p1"], ["p2", "p3", "p4"]], [F(1, 2), F(1, 2), F(1, 3), F(1, 3), F(1, 3)]),
    (lambda s: min(len(s & {"p0", "p1"}), len(s & {"p2", "p3", "p4"})),
     [["p0", "p2"], ["p1", "p3"], ["p4"]], [F(3, 4), F(3, 4), F(1, 4), F(1, 4), 0]),
])
def test_owen_values(game, unions, expected):
    assert_values(owen(game, names(len(expected)), unions), expected)


@pytest.mark.parametrize("game, n, epsilon, point", [
    (weighted(4, (3, 2, 1, 1)), 4, F(2, 5), [F(2, 5), F(1, 5), F(1, 5), F(1, 5)]),
    (weighted(2, (1, 1, 1)), 3, F(1, 3), [F(1, 3)] * 3),
    (weighted(3, (1, 1, 1)), 3, F(-1, 3), [F(1, 3)] * 3),
    (weighted(51, (49, 48, 3)), 3, F(1, 3), [F(1, 3)] * 3),
    (lambda s: min(len(s & {"p0"}), len(s & {"p1", "p2"})), 3, 0, [1, 0, 0]),
])
def test_least_core(game, n, epsilon, point):
    core = least_core(game, names(n))
    assert abs(core.details["epsilon"] - float(epsilon)) < 1e-9
    assert_values(core, point, tol=1e-9)


def test_relay_team_where_every_agent_is_indispensable():
    relay, players = unanimity({"planner", "relay", "solver"}), ["planner", "relay", "solver"]
    assert_values(shapley(relay, players), [F(1, 3)] * 3)
    difference = difference_rewards(relay, players)
    assert_values(difference, [1, 1, 1])
    assert difference.n_evals == 4 and difference.method == "difference/exact"


# ---------------------------------------------------------------- axioms on random small games

@st.composite
def games(draw, min_players=1, max_players=6):
    """(players, v) with integer values on all coalitions (v(empty) included)."""
    n = draw(st.integers(min_players, max_players))
    values = draw(st.lists(st.integers(-10, 10), min_size=1 << n, max_size=1 << n))
    players = names(n)
    index = {p: k for k, p in enumerate(players)}
    return players, lambda s: float(values[sum(1 << index[p] for p in s)])


@PROPERTY
@given(games())
def test_shapley_efficiency(game):
    players, v = game
    assert abs(sum(shapley(v, players).values.values()) - (v(frozenset(players)) - v(frozenset()))) < 1e-9


@PROPERTY
@given(games(min_players=2), st.data())
def test_shapley_and_banzhaf_symmetry(game, data):
    players, v = game
    i, j = data.draw(st.lists(st.sampled_from(players), min_size=2, max_size=2, unique=True))
    swap = {i: j, j: i}
    symmetric = lambda s: (v(s) + v(frozenset(swap.get(p, p) for p in s))) / 2  # noqa: E731
    for value in (shapley, banzhaf):
        estimate = value(symmetric, players)
        assert abs(estimate.values[i] - estimate.values[j]) < 1e-9


@PROPERTY
@given(games(max_players=5), st.integers(-5, 5))
def test_dummy_player_gets_its_constant_contribution(game, contribution):
    players, v = game
    with_dummy = lambda s: v(s - {"dummy"}) + contribution * ("dummy" in s)  # noqa: E731
    for value in (shapley, banzhaf):
        assert abs(value(with_dummy, players + ["dummy"]).values["dummy"] - contribution) < 1e-9


@PROPERTY
@given(games(), st.integers(0, 2 ** 31))
def test_shapley_additivity(game, seed):
    players, v = game
    noise = np.random.default_rng(seed).normal(size=1 << len(players))
    w = lambda s: float(noise[sum(1 << int(p[1:]) for p in s)])  # noqa: E731
    total = lambda s: v(s) + w(s)  # noqa: E731
    assert np.allclose(array(shapley(total, players)), array(shapley(v, players)) + array(shapley(w, players)))


@st.composite
def graph_games(draw):
    players, v = draw(games(min_players=2))
    edges = [pair for pair in combinations(players, 2) if draw(st.booleans())]
    graph = nx.Graph(edges)
    graph.add_nodes_from(players)
    return players, v, graph


@PROPERTY
@given(graph_games())
def test_myerson_component_efficiency_and_fairness(case):
    players, v, graph = case
    values = myerson(v, graph).values
    for component in nx.connected_components(graph):
        assert abs(sum(values[p] for p in component) - (v(frozenset(component)) - v(frozenset()))) < 1e-9
    for i, j in list(graph.edges)[:3]:
        cut = graph.copy()
        cut.remove_edge(i, j)
        without = myerson(v, cut).values
        assert abs((values[i] - without[i]) - (values[j] - without[j])) < 1e-9


@PROPERTY
@given(games())
def test_myerson_on_a_complete_graph_is_shapley(game):
    players, v = game
    assert np.allclose(array(myerson(v, nx.complete_graph(players))), array(shapley(v, players)), atol=1e-9)


@PROPERTY
@given(games(min_players=2), st.data())
def test_owen_quotient_property_and_trivial_structures(game, data):
    players, v = game
    labels = data.draw(st.lists(st.integers(0, 2), min_size=len(players), max_size=len(players)))
    unions = [[p for p, label in zip(players, labels) if label == k] for k in range(3)]
    unions = [union for union in unions if union]
    values = owen(v, players, unions).values
    quotient = lambda r: v(frozenset(p for k in r for p in unions[int(k)]))  # noqa: E731
    between = shapley(quotient, [str(k) for k in range(len(unions))]).values
    for k, union in enumerate(unions):
        assert abs(sum(values[p] for p in union) - between[str(k)]) < 1e-9
    plain = array(shapley(v, players))
    assert np.allclose(array(owen(v, players, [[p] for p in players])), plain, atol=1e-9)
    assert np.allclose(array(owen(v, players, [players])), plain, atol=1e-9)


@PROPERTY
@given(games(min_players=2, max_players=5))
def test_least_core_point_satisfies_every_constraint(game):
    players, v = game
    core = least_core(v, players)
    epsilon, empty = core.details["epsilon"], v(frozenset())
    assert abs(sum(core.values.values()) - (v(frozenset(players)) - empty)) < 1e-7
    for size in range(1, len(players)):
        for coalition in combinations(players, size):
            assert sum(core.values[p] for p in coalition) >= v(frozenset(coalition)) - empty - epsilon - 1e-7


# ---------------------------------------------------------------- sampled estimators

def test_permutation_mc_on_weighted_voting_n10():
    v = batch_weighted(np.random.default_rng(0).integers(1, 21, 10))
    estimate = shapley(v, names(10), method="permutation", budget=5000, seed=0)
    assert np.abs(array(estimate) - exact_array(v, names(10))).mean() < 0.03
    assert estimate.n_evals <= 5001 and estimate.method == "shapley/permutation"


# the mean absolute errors measured at these seeds are a third of these bounds or less
@pytest.mark.parametrize("method, bound", [("permutation", 0.045), ("antithetic", 0.06), ("tmc", 0.04),
                                           ("stratified", 0.06), ("kernel", 0.06), ("auto", 0.04)])
def test_sampled_estimators_on_weighted_voting_n16(method, bound):
    v = batch_weighted(np.random.default_rng(1).integers(1, 21, 16))
    estimate = shapley(v, names(16), method=method, budget=2000, seed=0)
    assert np.abs(array(estimate) - exact_array(v, names(16))).mean() < bound
    assert estimate.n_evals <= 2001


@pytest.mark.parametrize("method, bound", [("permutation", 0.015), ("antithetic", 0.017), ("tmc", 0.014),
                                           ("stratified", 0.011), ("kernel", 0.016)])
def test_sampled_estimators_on_an_airport_game_n20(method, bound):
    v = batch_airport(np.sort(np.random.default_rng(2).uniform(0, 1, 20)))
    estimate = shapley(v, names(20), method=method, budget=3000, seed=1)
    assert np.abs(array(estimate) - exact_array(v, names(20))).mean() < bound


def test_antithetic_pair_is_exact_on_a_quadratic_game():
    v = batch_quadratic(12, seed=3)
    estimate = shapley(v, names(12), method="antithetic", budget=2 * 12 - 1, seed=5)
    assert np.allclose(array(estimate), exact_array(v, names(12)), atol=1e-9)
    assert estimate.details["samples"] == 1 and all(math.isnan(s) for s in estimate.stderr.values())


def test_tmc_is_unbiased_on_a_monotone_simple_game():
    v = batch_weighted([5, 4, 3, 3, 2, 2, 1, 1], quota=12)
    players, exact = names(8), exact_array(v, names(8))
    runs = np.array([array(shapley(v, players, method="tmc", budget=30, seed=seed)) for seed in range(200)])
    mean, stderr = runs.mean(axis=0), runs.std(axis=0, ddof=1) / math.sqrt(len(runs))
    assert np.all(np.abs(mean - exact) < 4 * stderr + 1e-12)


@pytest.mark.parametrize("method, budget, low, high", [("permutation", 300, 0.6, 1.5), ("stratified", 1200, 0.5, 1.8),
                                                       ("kernel", 400, 0.4, 2.0)])
def test_stderr_matches_the_observed_error(method, budget, low, high):
    v = batch_airport(np.sort(np.random.default_rng(4).uniform(0, 1, 14)))
    exact = exact_array(v, names(14))
    errors, stderrs = [], []
    for seed in range(30):
        estimate = shapley(v, names(14), method=method, budget=budget, seed=seed)
        errors.extend(array(estimate) - exact)
        stderrs.extend(estimate.stderr.values())
    assert low < math.sqrt(np.mean(np.square(errors)) / np.mean(np.square(stderrs))) < high


def test_auto_choices():
    assert shapley(weighted(4, (3, 2, 1, 1)), names(4)).method == "shapley/exact"
    assert shapley(batch_weighted(range(1, 11)), names(10), budget=1023).method == "shapley/exact"
    assert shapley(batch_weighted(range(1, 11)), names(10), budget=300).method == "shapley/kernel"
    voting = shapley(batch_weighted(np.random.default_rng(1).integers(1, 21, 16)), names(16), budget=2000)
    assert voting.method == "shapley/tmc" and voting.details["monotone"]
    quadratic = shapley(batch_quadratic(16, seed=2), names(16), budget=2000)
    assert quadratic.method == "shapley/antithetic" and quadratic.details["pilot_rho"] < -0.999
    assert np.allclose(array(quadratic), exact_array(batch_quadratic(16, seed=2), names(16)), atol=1e-9)


def test_self_dual_majority_pairs_carry_identical_marginals():
    v = batch_weighted([3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])  # total 17 (odd): self-dual
    estimate = shapley(v, names(15), budget=2000, seed=0)
    assert estimate.details["pilot_rho"] == pytest.approx(1.0)
    assert estimate.method != "shapley/antithetic"


def test_efficiency_correction_makes_sampled_values_sum_to_the_grand_coalition():
    v = batch_airport(np.sort(np.random.default_rng(5).uniform(0, 1, 14)))
    corrected = shapley(v, names(14), method="stratified", budget=800, seed=0, efficiency_correction=True)
    assert abs(sum(corrected.values.values()) - v(frozenset(names(14)))) < 1e-9
    plain = shapley(v, names(14), method="stratified", budget=800, seed=0)
    assert abs(corrected.details["efficiency_gap"] - (v(frozenset(names(14))) - sum(plain.values.values()))) < 1e-9


@pytest.mark.parametrize("method", ["permutation", "antithetic", "tmc", "stratified", "kernel", "auto"])
def test_sampled_estimators_respect_the_budget_and_are_reproducible(method):
    v = batch_airport(np.sort(np.random.default_rng(6).uniform(0, 1, 13)))
    cache = CachedValue(v, names(13))
    first = shapley(cache, names(13), method=method, budget=700, seed=3)
    calls = cache.n_evals
    second = shapley(cache, names(13), method=method, budget=700, seed=3)
    assert first.n_evals <= 701 and calls <= 701
    assert cache.n_evals == calls and first.values == second.values  # shared cache: no new evaluation


def test_banzhaf_msr_owen_permutation_and_sampled_myerson():
    v, players = batch_weighted(np.random.default_rng(7).integers(1, 21, 12)), names(12)
    msr = banzhaf(v, players, method="msr", budget=3000, seed=0)
    assert np.abs(array(msr) - array(banzhaf(v, players))).mean() < 0.065
    unions = [players[:4], players[4:9], players[9:]]
    sampled = owen(v, players, unions, method="permutation", budget=3000, seed=0)
    assert np.abs(array(sampled) - array(owen(v, players, unions))).mean() < 0.02
    star = nx.star_graph(players)
    assert myerson(v, star, method="auto", budget=1000).method != "myerson/exact"  # 2^11 + 11 connected sets
    for method in ("permutation", "antithetic", "tmc", "auto"):
        estimate = myerson(v, star, method=method, budget=1500, seed=0)
        assert np.abs(array(estimate) - array(myerson(v, star))).mean() < 0.03, method
        assert estimate.n_evals <= 1501


# ---------------------------------------------------------------- tables, caches, per-seed returns

def test_one_exact_table_serves_every_exact_value():
    calls = []
    v = lambda s: calls.append(s) or weighted(4, (3, 2, 1, 1))(s)  # noqa: E731
    cache = CachedValue(v, names(4))
    table = exact_table(cache, names(4))
    for estimate in (shapley(cache, names(4)), banzhaf(cache, names(4)), owen(cache, names(4), [["p0"], names(4)[1:]]),
                     least_core(cache, names(4)), shapley(table, names(4), method="exact")):
        assert estimate.n_evals == 16
    assert len(calls) == 16 and cache.n_evals == 16 and table[frozenset({"p0", "p1"})] == 1.0


def test_batch_value_matches_a_plain_value_function():
    weights = np.random.default_rng(8).integers(1, 21, 9)
    batch, plain = batch_weighted(weights), weighted(weights.sum() // 2 + 1, weights)
    assert np.allclose(exact_array(batch, names(9)), exact_array(plain, names(9)), atol=1e-12)
    for subset in (names(9)[::-1], ["p7", "p2", "p5"]):  # other orders and sub-games read the right columns
        assert np.allclose(exact_array(batch, subset), exact_array(plain, subset), atol=1e-12)


def test_per_seed_returns_are_averaged_and_their_noise_propagated():
    rng = np.random.default_rng(9)
    returns = {frozenset(s): rng.normal(len(s), 1.0, size=4) for k in range(4) for s in combinations(names(3), k)}
    cache = CachedValue(lambda s: returns[s], names(3))
    estimate = shapley(cache, names(3), method="exact")
    assert cache.per_seed(frozenset({"p0"})) is returns[frozenset({"p0"})]
    weight = {0: F(1, 3), 1: F(1, 6), 2: F(1, 3)}
    for player in names(3):
        exact = variance = 0.0
        for coalition, seeds in returns.items():
            coefficient = float(weight[len(coalition) - 1] if player in coalition else -weight[len(coalition)])
            exact += coefficient * seeds.mean()
            variance += coefficient ** 2 * seeds.var(ddof=1) / 4
        assert abs(estimate.values[player] - exact) < 1e-12
        assert abs(estimate.details["noise_stderr"][player] - math.sqrt(variance)) < 1e-12


def test_myerson_evaluates_only_connected_coalitions():
    path = nx.path_graph(names(20))

    def v(coalition):
        assert coalition == set() or nx.is_connected(path.subgraph(coalition)), coalition
        return float(len(coalition) ** 2)
    estimate = myerson(v, path)
    assert estimate.n_evals == 211 and estimate.details["connected_coalitions"] == 210
    assert abs(sum(estimate.values.values()) - 400) < 1e-9


# ---------------------------------------------------------------- bad input

def test_a_failing_coalition_is_named_with_its_cause():
    def v(coalition):
        if coalition == {"alice", "carol"}:
            raise ZeroDivisionError("no rollout")
        return float(len(coalition))
    with pytest.raises(CoalitionError, match=r"\{alice, carol\}.*ZeroDivisionError") as failure:
        shapley(v, ["alice", "bob", "carol"])
    assert failure.value.coalition == {"alice", "carol"}
    assert isinstance(failure.value.__cause__, ZeroDivisionError)
    with pytest.raises(CoalitionError, match=r"\{alice, carol\}"):
        shapley(v, ["alice", "bob", "carol"], method="permutation", budget=50)


def test_a_failing_batch_names_the_coalition():
    def fn(membership):
        if (membership == [True, False, True]).all(axis=1).any():
            raise RuntimeError("judge down")
        return membership.sum(axis=1).astype(float)
    with pytest.raises(CoalitionError, match=r"\{p0, p2\}.*judge down"):
        shapley(BatchValue(fn, names(3)), names(3), method="exact")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "high", [[1.0, 2.0]], []])
def test_a_value_that_is_not_a_finite_number_is_named(bad):
    v = lambda s: bad if s == {"p1"} else 1.0  # noqa: E731
    with pytest.raises(CoalitionError, match=r"\{p1\}"):
        banzhaf(v, names(3))


@pytest.mark.parametrize("call, minimum", [
    (lambda v: shapley(v, names(4), method="antithetic", budget=5), 7),
    (lambda v: shapley(v, names(4), method="exact", budget=10), 15),
    (lambda v: shapley(v, names(6), method="kernel", budget=10), 13),
    (lambda v: shapley(v, names(6), method="stratified", budget=40), 61),
    (lambda v: shapley(v, names(6), budget=3), 6),
    (lambda v: banzhaf(v, names(6), method="msr", budget=1), 2),
    (lambda v: myerson(v, nx.path_graph(names(6)), budget=20), 21),
])
def test_a_budget_below_the_minimum_says_the_minimum(call, minimum):
    with pytest.raises(ValueError, match=rf"the minimum is {minimum} "):
        call(lambda s: float(len(s)))


def test_players_outside_the_game_are_named():
    v = lambda s: float(len(s))  # noqa: E731
    graph = nx.path_graph(["p0", "p1", "ghost"])
    with pytest.raises(ValueError, match="ghost"):
        myerson(v, graph, players=["p0", "p1"])
    with pytest.raises(ValueError, match="ghost"):
        myerson(CachedValue(v, ["p0", "p1"]), graph)
    with pytest.raises(ValueError, match="ghost"):
        owen(v, names(3), [["p0", "ghost"], ["p1", "p2"]])
    with pytest.raises(ValueError, match=r"missing \['p2'\]"):
        owen(v, names(3), [["p0"], ["p1"]])
    with pytest.raises(ValueError, match="ghost"):
        shapley(CachedValue(v, names(2)), names(2) + ["ghost"])


def test_other_bad_arguments():
    v = lambda s: float(len(s))  # noqa: E731
    with pytest.raises(ValueError, match="unknown shapley method 'montecarlo'"):
        shapley(v, names(3), method="montecarlo")
    with pytest.raises(ValueError, match="more than once"):
        shapley(v, ["a", "b", "a"])
    with pytest.raises(ValueError, match="empty"):
        banzhaf(v, [])
    with pytest.raises(ValueError, match="at least 2 players"):
        least_core(v, ["solo"])
