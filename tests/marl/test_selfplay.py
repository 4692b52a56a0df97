"""Self-play opponent pool: Elo and TrueSkill ratings, eviction, sampling strategies, exact resume, and
real debate episodes in which a scripted stronger learner's rating rises above its weak opponents'."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from marl.env import make_env
from marl.policies import Policy, get_policy, rollout
from marl.scenario.load import load_scenario
from marl.selfplay import (LEARNER, RATING_KINDS, EloRatings, OpponentPool, TrueSkillRatings, make_ratings,
                               match_score)

# -- ratings ----------------------------------------------------------------------------------------


def test_elo_expected_scores_are_symmetric_and_follow_the_logistic_curve():
    elo = EloRatings(ratings={"a": 1400.0, "b": 1000.0, "c": 1000.0})
    assert elo.expected("b", "c") == pytest.approx(0.5)
    assert elo.expected("a", "b") == pytest.approx(10 / 11)  # a 400-point lead is 10:1 odds
    for x, y in (("a", "b"), ("b", "c"), ("a", "new")):
        assert elo.expected(x, y) + elo.expected(y, x) == pytest.approx(1.0)
    assert elo.rating("new") == 1000.0


def test_elo_updates_conserve_the_rating_total_and_move_the_winner_up():
    elo = EloRatings(k_factor=24)
    rng = random.Random(3)
    players = ["a", "b", "c", "d"]
    for player in players:
        elo.rating(player)
    for _ in range(200):
        a, b = rng.sample(players, 2)
        elo.update(a, b, rng.choice((0.0, 0.5, 1.0)))
    assert sum(elo.rating(p) for p in players) == pytest.approx(4000.0)
    before_a, before_b = elo.rating("a"), elo.rating("b")
    expected = elo.expected("a", "b")
    elo.update("a", "b", 1.0)
    assert elo.rating("a") - before_a == pytest.approx(24 * (1 - expected))
    assert elo.rating("b") - before_b == pytest.approx(-24 * (1 - expected))


def test_trueskill_sigma_shrinks_with_games_and_the_winner_gains_mu():
    ts = TrueSkillRatings()
    sigmas = [ts.sigma("a")]
    for _ in range(6):
        ts.update("a", "b", 1.0)
        sigmas.append(ts.sigma("a"))
    assert all(later < earlier for earlier, later in zip(sigmas, sigmas[1:]))
    assert ts.mu("a") > 25.0 > ts.mu("b")
    assert ts.rating("a") == pytest.approx(ts.mu("a") - 3 * ts.sigma("a"))
    assert ts.expected("a", "b") > 0.5 and ts.expected("a", "b") + ts.expected("b", "a") == pytest.approx(1.0)


def test_trueskill_draw_between_equals_keeps_mu_and_a_loss_is_a_win_for_the_other():
    ts = TrueSkillRatings()
    ts.update("a", "b", 0.5)
    assert ts.mu("a") == pytest.approx(25.0) and ts.mu("b") == pytest.approx(25.0)
    assert ts.sigma("a") < 25 / 3
    first, second = TrueSkillRatings(), TrueSkillRatings()
    first.update("x", "y", 0.0)
    second.update("y", "x", 1.0)
    assert (first.mu("y"), first.sigma("y")) == pytest.approx((second.mu("y"), second.sigma("y")))


def test_make_ratings_builds_both_kinds_and_names_the_valid_ones():
    assert make_ratings("elo", k_factor=16).k_factor == 16
    assert make_ratings("trueskill", initial_mu=30.0).mu("anyone") == 30.0
    with pytest.raises(ValueError, match="elo, trueskill"):
        make_ratings("glicko")


def test_rating_errors_are_clear():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        EloRatings().update("a", "b", 2.0)
    with pytest.raises(ValueError, match="k_factor"):
        EloRatings(k_factor=0)
    with pytest.raises(ValueError, match="cannot load 'elo' ratings into 'trueskill'"):
        TrueSkillRatings().load_state_dict(EloRatings().state_dict())


# -- the pool ---------------------------------------------------------------------------------------


def test_eviction_drops_the_oldest_and_keeps_the_latest():
    pool = OpponentPool(max_size=2)
    ids = [pool.add_snapshot(step, {"step": step}) for step in (10, 20, 30, 40)]
    assert ids == ["step-10", "step-20", "step-30", "step-40"]
    assert pool.ids() == ["step-30", "step-40"]
    metrics = pool.ratings_metrics()
    assert set(metrics) == {"selfplay/rating/learner", "selfplay/rating/step-30", "selfplay/rating/step-40",
                            "selfplay/pool_size"}
    assert metrics["selfplay/pool_size"] == 2.0
    single = OpponentPool(max_size=1)
    single.add_snapshot(1, "old")
    single.add_snapshot(2, "new")
    assert single.sample() == ("step-2", "new")


def test_a_new_snapshot_starts_at_the_learners_current_rating():
    pool = OpponentPool(ratings="elo")
    pool.add_snapshot(0, "first")
    for _ in range(5):
        pool.record("step-0", 1.0)
    learner = pool.ratings.rating(LEARNER)
    assert learner > 1000.0
    pool.add_snapshot(5, "second")
    assert pool.ratings_metrics()["selfplay/rating/step-5"] == pytest.approx(learner)


def test_latest_always_samples_the_newest():
    pool = OpponentPool(strategy="latest")
    for step in range(4):
        pool.add_snapshot(step, f"snapshot {step}")
        assert {pool.sample() for _ in range(20)} == {(f"step-{step}", f"snapshot {step}")}


def test_uniform_covers_every_opponent_about_equally():
    pool = OpponentPool(strategy="uniform", seed=1)
    for step in range(4):
        pool.add_snapshot(step, step)
    counts = Counter(pool.sample()[0] for _ in range(4000))
    assert set(counts) == set(pool.ids())
    assert all(850 < count < 1150 for count in counts.values()), counts


@pytest.mark.parametrize("kind", RATING_KINDS)
def test_prioritised_favours_the_opponent_that_beats_the_learner(kind):
    pool = OpponentPool(strategy="prioritised", ratings=kind, seed=2)
    for step in range(3):
        pool.add_snapshot(step, step)
    for _ in range(4):
        pool.record("step-0", 1.0)
        pool.record("step-1", 0.0)  # step-1 keeps beating the learner
        pool.record("step-2", 1.0)
    weights = pool.priorities()
    assert max(weights, key=weights.get) == "step-1"
    raw = {i: (1 - pool.ratings.expected(LEARNER, i)) ** 2 for i in pool.ids()}
    assert weights == pytest.approx({i: w / sum(raw.values()) for i, w in raw.items()})
    counts = Counter(pool.sample()[0] for _ in range(3000))
    assert counts.most_common(1)[0][0] == "step-1"
    for opponent_id, weight in weights.items():
        assert counts[opponent_id] / 3000 == pytest.approx(weight, abs=0.04)


@pytest.mark.parametrize("kind", RATING_KINDS)
def test_state_dict_round_trip_continues_the_same_samples_and_ratings(kind):
    pool = OpponentPool(max_size=3, strategy="prioritised", ratings=kind, seed=7)
    for step in range(5):
        pool.add_snapshot(step, {"weights": [step, step + 0.5]})
        opponent_id, _ = pool.sample()
        pool.record(opponent_id, step % 2)
    state = json.loads(json.dumps(pool.state_dict()))  # also survives a trip through JSON
    resumed = OpponentPool(ratings=kind, seed=999)
    resumed.load_state_dict(state)
    assert resumed.ids() == pool.ids() and resumed.ratings_metrics() == pool.ratings_metrics()
    for game in range(30):
        sampled = pool.sample()
        assert resumed.sample() == sampled
        pool.record(sampled[0], game % 3 / 2)
        resumed.record(sampled[0], game % 3 / 2)
    assert resumed.ratings_metrics() == pool.ratings_metrics()


def test_pool_errors_say_what_to_do():
    with pytest.raises(ValueError, match="latest, uniform, prioritised"):
        OpponentPool(strategy="best")
    with pytest.raises(ValueError, match="at least 1"):
        OpponentPool(max_size=0)
    with pytest.raises(ValueError, match="add a snapshot first"):
        OpponentPool().sample()
    with pytest.raises(ValueError, match="elo, trueskill"):
        OpponentPool(ratings="glicko")
    pool = OpponentPool()
    pool.add_snapshot(3, "x")
    with pytest.raises(ValueError, match="already holds"):
        pool.add_snapshot(3, "y")
    with pytest.raises(ValueError, match="not in the pool"):
        pool.record("step-99", 1.0)


def test_match_score_compares_the_sides_totals():
    rewards = {"a": 0.5, "b": -0.5, "c": 0.25, "d": -0.25}
    assert match_score(rewards, ["a"], ["b"]) == 1.0
    assert match_score(rewards, ["b"], ["a"]) == 0.0
    assert match_score({"a": 0.1 + 0.2, "b": 0.3}, ["a"], ["b"]) == 0.5
    assert match_score(rewards, ["b", "c"], ["a", "d"]) == 0.0
    with pytest.raises(ValueError, match="no reward for agents"):
        match_score(rewards, ["a"], ["z"])
    with pytest.raises(ValueError, match="both sides"):
        match_score(rewards, ["a"], ["a", "b"])


# -- real episodes ----------------------------------------------------------------------------------

EPISODES = 24


def versus(policies: dict[str, Policy]) -> Policy:
    """One policy per agent name: two different players in one episode."""

    def act(agent, observation, task):
        return policies[agent](agent, observation, task)

    return act


def play_debates(learner_policy: str, opponent_policies: tuple[str, ...], kind: str):
    """The learner (`learner_policy`) against a pool of snapshots that play `opponent_policies`, in real
    debate episodes with seats alternating; returns the pool, the learner's starting rating and its scores."""
    scenario = load_scenario("debate")
    env = make_env(scenario)
    learner = get_policy(learner_policy, scenario)
    pool = OpponentPool(max_size=3, strategy="uniform", ratings=kind, seed=0)
    for step, name in enumerate(opponent_policies):
        pool.add_snapshot(10 * step, {"policy": name, "seed": step})
    start, scores = pool.ratings.rating(LEARNER), []
    for episode in range(EPISODES):
        opponent_id, snapshot = pool.sample()
        opponent = get_policy(snapshot["policy"], scenario, seed=snapshot["seed"])
        seat, other = env.possible_agents[episode % 2], env.possible_agents[1 - episode % 2]
        result = rollout(env, versus({seat: learner, other: opponent}), task=episode, seed=episode)
        scores.append(match_score(result.rewards, [seat], [other]))
        pool.record(opponent_id, scores[-1])
    return pool, start, scores


@pytest.mark.parametrize("kind", RATING_KINDS)
def test_a_scripted_stronger_learner_rises_above_its_pool_in_real_debates(kind):
    pool, start, scores = play_debates("expert", ("null", "random", "random"), kind)
    assert scores == [1.0] * EPISODES  # the expert beats null and noise in every debate, from either seat
    metrics = pool.ratings_metrics()
    learner = metrics["selfplay/rating/learner"]
    assert learner > start
    assert all(learner > metrics[f"selfplay/rating/{opponent_id}"] for opponent_id in pool.ids())


@pytest.mark.parametrize("kind", RATING_KINDS)
def test_a_weak_learner_against_stronger_snapshots_falls_below_them(kind):
    pool, start, scores = play_debates("null", ("expert", "expert", "expert"), kind)
    assert scores == [0.0] * EPISODES
    metrics = pool.ratings_metrics()
    learner = metrics["selfplay/rating/learner"]
    assert learner < start
    assert all(learner < metrics[f"selfplay/rating/{opponent_id}"] for opponent_id in pool.ids())
