"""Tests of trainers/grpo/safeguards.py: Self-BLEU against NLTK, diversity penalty, curriculum buckets, floor reward."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from trainers.grpo import safeguards
from trainers.grpo.safeguards import (
    DifficultyBuckets,
    apply_floor_reward,
    collapse_alarm,
    diversity_penalties,
    group_self_bleu,
    pair_bleu,
    self_bleu,
    self_bleu_scores,
)

SMOOTHING = SmoothingFunction().method1


def nltk_scores(texts: list[str], max_n: int) -> list[float]:
    """The reference loop: BLEU of each text against all the others, exactly as the brief states it."""
    token_lists = [text.split() for text in texts]
    weights = (1 / max_n,) * max_n
    return [
        sentence_bleu(
            [other for j, other in enumerate(token_lists) if j != i], hyp, weights=weights, smoothing_function=SMOOTHING
        )
        for i, hyp in enumerate(token_lists)
    ]


def nltk_self_bleu(texts: list[str], max_n: int) -> float:
    scores = nltk_scores(texts, max_n)
    return sum(scores) / len(scores)


WORDS = st.sampled_from(["a", "b", "c", "d"])
TEXT = st.lists(WORDS, min_size=0, max_size=30).map(" ".join)
TEXTS = st.lists(TEXT, min_size=2, max_size=6)
MAX_N = st.integers(min_value=1, max_value=4)


# --------------------------------------------------------------------------- Self-BLEU


@settings(max_examples=200, deadline=None)
@given(texts=TEXTS, max_n=MAX_N, duplicate=st.booleans())
def test_self_bleu_equals_nltk_loop(texts: list[str], max_n: int, duplicate: bool) -> None:
    if duplicate:
        texts = texts + [texts[0]]
    assert self_bleu(texts, max_n) == pytest.approx(nltk_self_bleu(texts, max_n), abs=1e-9, rel=0)
    for ours, reference in zip(self_bleu_scores(texts, max_n), nltk_scores(texts, max_n)):
        assert abs(ours - reference) < 1e-9


@pytest.mark.parametrize(
    "texts",
    [
        ["", ""],
        ["", "a b c"],
        ["a b c", ""],
        ["a", "a"],
        ["a", "b"],
        ["a", "a b c d e"],
        ["the cat sat", "the cat sat", "the cat sat"],
        ["x y z w v", "x y z w v", "p q r s t"],
        ["  a\tb \n c ", "a b c", "c b a"],
        ["a a a a a a a", "a b", "b a a"],
        ["one two three four five six", "six five four three two one"],
    ],
)
@pytest.mark.parametrize("max_n", [1, 2, 3, 4])
def test_self_bleu_edge_cases_equal_nltk(texts: list[str], max_n: int) -> None:
    assert abs(self_bleu(texts, max_n) - nltk_self_bleu(texts, max_n)) < 1e-9


def test_fewer_than_two_texts_give_zero() -> None:
    assert self_bleu([]) == 0.0
    assert self_bleu(["the same words again"]) == 0.0
    assert self_bleu_scores(["alone"]) == [0.0]


def test_identical_texts_score_one_and_disjoint_texts_zero() -> None:
    assert self_bleu(["a b c d e f"] * 4) == pytest.approx(1.0, abs=1e-12)
    assert self_bleu(["a b c d", "e f g h", "i j k l"]) == 0.0


def test_reranking_path_for_large_keys_still_equals_nltk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safeguards, "_INT64_SAFE_BOUND", 1)  # forces np.unique re-ranking at every order
    rng = random.Random(7)
    for _ in range(20):
        texts = [" ".join(rng.choice("abc") for _ in range(rng.randint(0, 12))) for _ in range(rng.randint(2, 5))]
        max_n = rng.randint(1, 6)
        assert abs(self_bleu(texts, max_n) - nltk_self_bleu(texts, max_n)) < 1e-9


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(TEXT, min_size=1, max_size=4), group_size=st.integers(1, 4), max_n=MAX_N)
def test_group_self_bleu_matches_per_group_self_bleu(texts: list[str], group_size: int, max_n: int) -> None:
    texts = (texts * group_size)[: group_size * max(1, len(texts) // 2)]
    expected = [self_bleu(texts[start : start + group_size], max_n) for start in range(0, len(texts), group_size)]
    assert group_self_bleu(texts, group_size, max_n) == pytest.approx(expected, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(hypothesis=TEXT, reference=TEXT, max_n=MAX_N)
def test_pair_bleu_equals_nltk_sentence_bleu(hypothesis: str, reference: str, max_n: int) -> None:
    expected = sentence_bleu(
        [reference.split()], hypothesis.split(), weights=(1 / max_n,) * max_n, smoothing_function=SMOOTHING
    )
    assert abs(pair_bleu(hypothesis, reference, max_n) - expected) < 1e-9


# --------------------------------------------------------------------------- diversity penalty and alarm


def test_duplicates_are_penalised_and_distinct_texts_are_not() -> None:
    texts = ["the answer is 42 because", "the answer is 42 because", "let me think step by step", "ok"]
    assert diversity_penalties(texts, group_size=4, penalty=0.25) == [0.25, 0.25, 0.0, 0.0]


def test_short_and_empty_duplicates_are_penalised() -> None:
    assert diversity_penalties(["ok", "ok", "", ""], group_size=4) == [0.1, 0.1, 0.1, 0.1]


def test_groups_are_independent() -> None:
    same = "compute the sum of the two numbers"
    texts = [same, "a different first group", same, "another different group"]
    assert diversity_penalties(texts, group_size=2) == [0.0, 0.0, 0.0, 0.0]
    assert diversity_penalties(texts, group_size=4) == [0.1, 0.0, 0.1, 0.0]


def test_threshold_decides_for_near_duplicates() -> None:
    base = "first add the tens then add the units and carry the one to get the result"
    near = base.replace("result", "answer")
    assert pair_bleu(near, base) > 0.8
    assert diversity_penalties([base, near], group_size=2, threshold=0.8) == [0.1, 0.1]
    assert diversity_penalties([base, near], group_size=2, threshold=0.99) == [0.0, 0.0]


def test_collapse_alarm_counts_groups_above_threshold() -> None:
    collapsed = ["the same reply every time"] * 4
    diverse = ["alpha beta gamma delta", "one two three four", "red green blue yellow", "north south east west"]
    bleus = group_self_bleu(collapsed + diverse + collapsed, group_size=4)
    assert collapse_alarm(bleus, threshold=0.9) == 2
    assert collapse_alarm([0.95, float("nan"), 0.5], threshold=0.9) == 1
    assert collapse_alarm([0.95], threshold=0.99) == 0


# --------------------------------------------------------------------------- difficulty buckets


def make_buckets(n_tasks: int = 9, seed: int = 0, n_buckets: int = 3) -> DifficultyBuckets:
    heuristic = [float(index) for index in range(n_tasks)]
    random.Random(99).shuffle(heuristic)
    return DifficultyBuckets([f"t{h:.0f}" for h in heuristic], heuristic, n_buckets=n_buckets, seed=seed)


def test_initial_buckets_are_heuristic_quantiles() -> None:
    sampler = make_buckets()
    assert sampler.buckets() == [["t0", "t1", "t2"], ["t3", "t4", "t5"], ["t6", "t7", "t8"]]
    assert sorted(len(bucket) for bucket in make_buckets(n_tasks=10).buckets()) == [3, 3, 4]
    assert sampler.pass_rates() == pytest.approx({0: 5 / 6, 1: 0.5, 2: 1 / 6})


def test_sample_batch_draws_from_one_bucket_without_replacement() -> None:
    sampler = make_buckets(n_tasks=30)
    for _ in range(20):
        bucket, task_ids = sampler.sample_batch(6)
        assert set(task_ids) <= set(sampler.buckets()[bucket])
        assert len(set(task_ids)) == 6


def test_batch_larger_than_bucket_repeats_tasks_evenly() -> None:
    bucket, task_ids = make_buckets().sample_batch(7)
    counts = Counter(task_ids)
    assert set(counts) == set(make_buckets().buckets()[bucket])
    assert sorted(counts.values()) == [2, 2, 3]


def test_sampling_is_deterministic_for_a_seed() -> None:
    first, second, other = make_buckets(seed=3), make_buckets(seed=3), make_buckets(seed=4)
    batches = [first.sample_batch(2) for _ in range(15)]
    assert batches == [second.sample_batch(2) for _ in range(15)]
    assert batches != [other.sample_batch(2) for _ in range(15)]


def test_updates_move_tasks_between_buckets() -> None:
    sampler = make_buckets()
    assert sampler.bucket_of("t0") == 0
    sampler.update("t0", 0.0)
    assert sampler.bucket_of("t0") == 2
    sampler.update("t8", 1.0)
    assert sampler.bucket_of("t8") == 0


def test_pass_rate_ema_and_bucket_means() -> None:
    sampler = make_buckets(n_tasks=3, n_buckets=3)
    sampler.update("t1", 0.0)
    sampler.update("t1", 1.0)
    for task_id, rate in (("t0", 0.9), ("t2", 0.2)):
        sampler.update(task_id, rate)
    emas = dict(zip(sampler.state_dict()["task_ids"], sampler.state_dict()["pass_ema"]))
    assert emas["t1"] == pytest.approx(0.1)  # first observation sets it, the second moves it by ema=0.1
    assert sampler.pass_rates() == pytest.approx({0: 0.9, 1: 0.2, 2: 0.1})
    assert sampler.buckets() == [["t0"], ["t2"], ["t1"]]


def test_bucket_choice_prefers_pass_rates_near_half() -> None:
    sampler = make_buckets()
    for task_id, rate in zip([f"t{index}" for index in range(9)], [1, 1, 1, 0.5, 0.5, 0.5, 0, 0, 0]):
        sampler.update(task_id, rate)
    chosen = Counter(sampler.sample_batch(1)[0] for _ in range(300))
    assert chosen.most_common(1)[0][0] == 1
    assert chosen[0] > 0 and chosen[2] > 0  # the minimum weight keeps every bucket alive


def test_state_dict_round_trip_resumes_exactly() -> None:
    original = make_buckets(n_tasks=12, seed=5)
    for step in range(6):
        original.sample_batch(3)
        original.update(f"t{step}", step / 6)
    restored = make_buckets(n_tasks=12, seed=123)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    for step in range(10):
        assert restored.sample_batch(4) == original.sample_batch(4)
        original.update(f"t{step}", 1.0)
        restored.update(f"t{step}", 1.0)
    assert restored.pass_rates() == original.pass_rates()
    assert restored.state_dict() == original.state_dict()


def test_load_state_dict_rejects_other_tasks() -> None:
    state = make_buckets(n_tasks=9).state_dict()
    with pytest.raises(ValueError, match="task_ids"):
        make_buckets(n_tasks=10).load_state_dict(state)


# --------------------------------------------------------------------------- floor reward


def test_all_zero_group_is_floored_at_highest_progress() -> None:
    rewards, n_floored = apply_floor_reward([0.0, 0.0, 0.0, 1.0, 0.0, 0.5], 3, [0.1, 0.7, 0.3, 0.9, 0.1, 0.2])
    assert rewards == [0.0, 0.05, 0.0, 1.0, 0.0, 0.5]
    assert n_floored == 1


def test_floor_ties_go_to_lowest_index_and_negatives_count_as_zero() -> None:
    rewards, n_floored = apply_floor_reward([-1.0, 0.0, -0.5, 0.0], 4, [0.4, 0.4, 0.4, 0.1], floor=0.2)
    assert rewards == [0.2, 0.0, -0.5, 0.0]
    assert n_floored == 1


def test_floor_nan_handling() -> None:
    nan = float("nan")
    rewards, n_floored = apply_floor_reward([nan, 0.0, 0.0, nan, nan, nan], 3, [9.0, nan, 0.5, 1.0, 2.0, 3.0])
    assert math.isnan(rewards[0]) and rewards[1:3] == [0.0, 0.05]
    assert all(math.isnan(reward) for reward in rewards[3:])
    assert n_floored == 1


def test_floor_leaves_its_input_unchanged() -> None:
    original = [0.0, 0.0]
    apply_floor_reward(original, 2, [1.0, 2.0])
    assert original == [0.0, 0.0]


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: self_bleu(["a", "b"], max_n=0), "max_n=0"),
        (lambda: self_bleu("a b c"), "wrap it in a list"),
        (lambda: self_bleu(["a", 3]), r"texts\[1\] is int"),
        (lambda: group_self_bleu(["a", "b", "c"], 2), "group_size=2"),
        (lambda: diversity_penalties(["a", "b"], 2, threshold=1.0), "threshold=1.0"),
        (lambda: diversity_penalties(["a", "b"], 2, penalty=-0.1), "penalty=-0.1"),
        (lambda: diversity_penalties(["a", "b"], 0), "group_size=0"),
        (lambda: collapse_alarm([0.5], threshold=1.5), "threshold=1.5"),
        (lambda: apply_floor_reward([0.0, 0.0], 2, [1.0]), r"len\(progress\)=1"),
        (lambda: apply_floor_reward([0.0, 0.0, 0.0], 2, [1.0, 1.0, 1.0]), "group_size=2"),
        (lambda: apply_floor_reward([0.0], 1, [1.0], floor=0.0), "floor=0.0"),
        (lambda: DifficultyBuckets(["a", "a"], [1.0, 2.0]), "unique"),
        (lambda: DifficultyBuckets(["a", "b"], [1.0]), r"len\(heuristic_difficulty\)=1"),
        (lambda: DifficultyBuckets(["a", "b"], [1.0, float("nan")]), r"heuristic_difficulty\[1\]"),
        (lambda: DifficultyBuckets(["a", "b"], [1.0, 2.0], n_buckets=3), "n_buckets=3"),
        (lambda: DifficultyBuckets(["a", "b"], [1.0, 2.0], n_buckets=1, ema=0.0), "ema=0.0"),
        (lambda: make_buckets().update("missing", 0.5), "task_id='missing'"),
        (lambda: make_buckets().update("t0", 1.5), "pass_rate_observation=1.5"),
        (lambda: make_buckets().sample_batch(0), "n_tasks=0"),
    ],
)
def test_invalid_arguments_raise_clear_value_errors(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_sample_batch_visits_every_task_once_before_repeating() -> None:
    from trainers.grpo.safeguards import DifficultyBuckets

    ids = [f"t{i}" for i in range(30)]
    sampler = DifficultyBuckets(ids, [0.0] * 30, n_buckets=1, seed=3)
    drawn = [task for _ in range(5) for task in sampler.sample_batch(6)[1]]
    assert sorted(drawn) == sorted(ids)  # 5 batches of 6 = one full pass, no repeat
    later = [task for _ in range(5) for task in sampler.sample_batch(6)[1]]
    assert sorted(later) == sorted(ids) and later != drawn
