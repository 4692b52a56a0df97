"""Guards of the GRPO trainer against mode collapse and training collapse (light imports only).

- `self_bleu`, `self_bleu_scores`, `group_self_bleu`: Self-BLEU, equal to the mean over texts of NLTK's
  `sentence_bleu(others, text, weights=(1/max_n,)*max_n, smoothing_function=method1)`, computed in one
  vectorised pass over all texts (numpy, imported on first use) instead of NLTK's quadratic loop.
- `pair_bleu`, `diversity_penalties`, `collapse_alarm`: a reward penalty for near-duplicate completions
  within a group, and an alarm count of groups whose Self-BLEU crosses a threshold.
- `DifficultyBuckets`: a curriculum sampler that draws every batch from one difficulty bucket and
  re-buckets tasks by their observed pass-rate EMA; its state round-trips through JSON.
- `apply_floor_reward`: gives the most promising member of an all-zero group a small floor reward, so
  that the group still carries a GRPO signal.

Texts are tokenised with `str.split()` (whitespace), exactly as the NLTK reference is called.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from itertools import chain, count
from typing import Any

SMOOTHING_EPSILON = 0.1  # NLTK SmoothingFunction().method1's epsilon for zero n-gram matches
MIN_BUCKET_WEIGHT = 0.05  # no bucket's sampling weight drops below this, so none starves
STATE_FORMAT = 1
_INT64_SAFE_BOUND = 2**62  # n-gram keys stay below this, so int64 arithmetic is exact


# --------------------------------------------------------------------------- validation


def _check_texts(texts: Sequence[str]) -> None:
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of strings, got one str; wrap it in a list: [text]")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"texts[{index}] is {type(text).__name__}, expected str (decode completions first)")


def _check_max_n(max_n: int) -> None:
    if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 1:
        raise ValueError(f"max_n={max_n!r} must be an int >= 1 (4 gives BLEU-4)")


def _check_group_size(group_size: int, length: int, name: str) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or length % group_size:
        raise ValueError(
            f"group_size={group_size!r} must be an int >= 1 that divides len({name})={length} "
            f"({name} are grouped contiguously, group_size per prompt)"
        )


def _check_in_range(name: str, value: float, low: float, high: float, high_inclusive: bool = True) -> None:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (is_number and low <= value and (value <= high if high_inclusive else value < high)):
        raise ValueError(f"{name}={value!r} must be a number in [{low}, {high}{']' if high_inclusive else ')'}")


# --------------------------------------------------------------------------- BLEU core


def _all_ngram_counts(tokens: list[str], max_n: int) -> list[Counter]:
    """N-gram counts of one token list for orders 1..max_n (tokens for order 1, tuples above)."""
    return [Counter(tokens)] + [Counter(zip(*(tokens[k:] for k in range(order)))) for order in range(2, max_n + 1)]


def _clipped_matches(np: Any, gram_key: Any, text_of: Any, n_texts: int) -> list[int]:
    """Per text i, the sum over its n-grams g of min(count_i(g), max over the other texts j of count_j(g)).

    `gram_key[p]` identifies the n-gram starting at stream position p (already made distinct across
    groups), `text_of[p]` the text it belongs to. Sorting (gram, text) pairs gives runs (one per n-gram
    of one text, length = its count) and groups of runs (one per n-gram). Within a group,
    min(c_i, max over others) is c_i, except for the unique largest count, which is clipped to the
    second largest (0 when no other text has the n-gram).
    """
    pairs = np.sort(gram_key * n_texts + text_of)
    starts_run = np.empty(pairs.size, dtype=bool)
    starts_run[0] = True
    np.not_equal(pairs[1:], pairs[:-1], out=starts_run[1:])
    run_start = np.flatnonzero(starts_run)
    run_count = np.diff(run_start, append=pairs.size)
    run_gram, run_text = np.divmod(pairs[run_start], n_texts)
    starts_group = np.empty(run_gram.size, dtype=bool)
    starts_group[0] = True
    np.not_equal(run_gram[1:], run_gram[:-1], out=starts_group[1:])
    group_start = np.flatnonzero(starts_group)
    group_of_run = np.cumsum(starts_group) - 1
    largest = np.maximum.reduceat(run_count, group_start)[group_of_run]
    is_largest = run_count == largest
    largest_is_unique = (np.add.reduceat(is_largest, group_start, dtype=np.int64) == 1)[group_of_run]
    second = np.maximum.reduceat(np.where(is_largest, 0, run_count), group_start)[group_of_run]
    clipped = np.where(is_largest & largest_is_unique, second, run_count)
    return np.bincount(run_text, weights=clipped, minlength=n_texts).astype(np.int64).tolist()


def _matches_per_order(token_lists: list[list[str]], group_size: int, max_n: int) -> list[list[int]]:
    """Clipped match counts [order - 1][text] of every text against the other texts of its group.

    All texts are laid out in one integer stream with a distinct separator after each text, so an
    n-gram crossing a text boundary occurs once and is never matched. N-gram keys are built by radix
    arithmetic on token ids, re-ranked (np.unique) whenever the next key could overflow int64.
    """
    import numpy as np  # imported here so that importing this module stays fast

    n_texts = len(token_lists)
    lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=n_texts)
    n_tokens = int(lengths.sum())
    first_position: dict[str, int] = {}
    # a token's id is the stream position of its first occurrence (one C-level pass, no Python loop)
    token_ids = map(first_position.setdefault, chain.from_iterable(token_lists), count())
    token_ids = np.fromiter(token_ids, dtype=np.int64, count=n_tokens)
    stream = np.insert(token_ids, np.cumsum(lengths), n_tokens + np.arange(n_texts))
    text_of = np.repeat(np.arange(n_texts), lengths + 1)
    group_of = text_of // group_size
    n_groups = n_texts // group_size
    radix = n_tokens + n_texts
    key, key_bound = stream, radix  # key < key_bound; order 1 fits while (tokens + texts) * texts**2 < 2**62
    matches = []
    for order in range(1, max_n + 1):
        if order > 1:
            if key_bound * radix * n_groups * n_texts >= _INT64_SAFE_BOUND:
                key_values, key = np.unique(key, return_inverse=True)
                key_bound = key_values.size
            key = key[:-1] * radix + stream[order - 1 :]
            key_bound *= radix
        positions = key.size  # 0 when the stream is shorter than the order: nothing can match
        gram_key = key * n_groups + group_of[:positions]
        matches.append(_clipped_matches(np, gram_key, text_of[:positions], n_texts) if positions else [0] * n_texts)
    return matches


def _closest_other_lengths(lengths: list[int]) -> list[int]:
    """Per text, NLTK's closest reference length among the other texts (ties go to the shorter)."""
    multiplicity = Counter(lengths)
    distinct = sorted(multiplicity)
    position = {length: rank for rank, length in enumerate(distinct)}
    closest = []
    for length in lengths:
        if multiplicity[length] > 1:
            closest.append(length)
            continue
        rank = position[length]
        candidates = distinct[max(0, rank - 1) : rank] + distinct[rank + 1 : rank + 2]
        closest.append(min(candidates, key=lambda other: (abs(other - length), other)))
    return closest


def _bleu_from_matches(matches: Sequence[int], hyp_len: int, ref_len: int, max_n: int) -> float:
    """Sentence BLEU from clipped match counts, replicating NLTK's arithmetic operation for operation."""
    if matches[0] == 0:  # NLTK: no unigram match (this includes an empty hypothesis) gives 0
        return 0.0
    weight = 1 / max_n
    log_terms = []
    for order, matched in enumerate(matches, start=1):
        denominator = max(1, hyp_len - order + 1)
        precision = matched / denominator if matched else SMOOTHING_EPSILON / denominator
        log_terms.append(weight * math.log(precision))
    brevity = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return brevity * math.exp(math.fsum(log_terms))


def _grouped_bleu_scores(texts: Sequence[str], group_size: int, max_n: int) -> list[float]:
    """Per text, BLEU against the other members of its contiguous group (0.0 in groups of one)."""
    if group_size < 2 or not texts:
        return [0.0] * len(texts)
    token_lists = [text.split() for text in texts]
    lengths = [len(tokens) for tokens in token_lists]
    matches_by_order = _matches_per_order(token_lists, group_size, max_n)
    scores = []
    for start in range(0, len(texts), group_size):
        closest = _closest_other_lengths(lengths[start : start + group_size])
        for offset, reference_length in enumerate(closest):
            index = start + offset
            matches = [matches[index] for matches in matches_by_order]
            scores.append(_bleu_from_matches(matches, lengths[index], reference_length, max_n))
    return scores


def self_bleu_scores(texts: Sequence[str], max_n: int = 4) -> list[float]:
    """Per-text Self-BLEU: BLEU of texts[i] against all the other texts as references.

    Equals `[sentence_bleu([t.split() for t in others], texts[i].split(), weights=(1/max_n,)*max_n,
    smoothing_function=SmoothingFunction().method1) ...]` from NLTK to floating-point rounding.
    With fewer than two texts there are no references: every score is 0.0.
    """
    _check_texts(texts)
    _check_max_n(max_n)
    return _grouped_bleu_scores(texts, len(texts), max_n)


def self_bleu(texts: Sequence[str], max_n: int = 4) -> float:
    """Self-BLEU of a set of texts: the mean over i of BLEU(texts[i] | all other texts).

    1.0 means every text is reproduced by the others (mode collapse), values near 0 mean diverse texts.
    Defined as 0.0 for fewer than two texts (a single text has nothing to be similar to).
    """
    scores = self_bleu_scores(texts, max_n)
    if len(scores) < 2:
        return 0.0
    return math.fsum(scores) / len(scores)


def group_self_bleu(texts: Sequence[str], group_size: int, max_n: int = 4) -> list[float]:
    """Self-BLEU of each contiguous group of `group_size` texts (one value per group, in order).

    Equal to `[self_bleu(group, max_n) for group in groups]` (0.0 per group when group_size is 1), but
    computed for all groups in one vectorised pass.
    """
    _check_texts(texts)
    _check_group_size(group_size, len(texts), "texts")
    _check_max_n(max_n)
    if group_size < 2:
        return [0.0] * len(texts)
    scores = _grouped_bleu_scores(texts, group_size, max_n)
    return [math.fsum(scores[start : start + group_size]) / group_size for start in range(0, len(scores), group_size)]


# --------------------------------------------------------------------------- diversity penalty


def _pair_bleu_from_counts(
    hyp_counts: list[Counter], hyp_len: int, ref_counts: list[Counter], ref_len: int, max_n: int
) -> float:
    matches = []
    for hyp_order, ref_order in zip(hyp_counts, ref_counts):
        common = hyp_order.keys() & ref_order.keys()
        matches.append(sum(min(hyp_order[ngram], ref_order[ngram]) for ngram in common))
    return _bleu_from_matches(matches, hyp_len, ref_len, max_n)


def pair_bleu(hypothesis: str, reference: str, max_n: int = 4) -> float:
    """Sentence BLEU of one hypothesis against one reference (NLTK method1 smoothing, uniform weights)."""
    _check_texts([hypothesis, reference])
    _check_max_n(max_n)
    hyp_tokens, ref_tokens = hypothesis.split(), reference.split()
    hyp_counts, ref_counts = _all_ngram_counts(hyp_tokens, max_n), _all_ngram_counts(ref_tokens, max_n)
    return _pair_bleu_from_counts(hyp_counts, len(hyp_tokens), ref_counts, len(ref_tokens), max_n)


def _near_duplicates(group: Sequence[str], threshold: float, max_n: int) -> list[bool]:
    """Per member, whether its similarity to some other member of the group exceeds `threshold`."""
    token_lists = [text.split() for text in group]
    counts = [_all_ngram_counts(tokens, max_n) for tokens in token_lists]

    def similarity(index: int, other: int) -> float:
        hyp_tokens, ref_tokens = token_lists[index], token_lists[other]
        if hyp_tokens == ref_tokens:
            return 1.0  # by definition, also for empty texts or texts shorter than max_n tokens
        return _pair_bleu_from_counts(counts[index], len(hyp_tokens), counts[other], len(ref_tokens), max_n)

    members = range(len(group))
    return [any(similarity(index, other) > threshold for other in members if other != index) for index in members]


def diversity_penalties(
    texts: Sequence[str], group_size: int, threshold: float = 0.8, penalty: float = 0.1, max_n: int = 4
) -> list[float]:
    """Per completion, the amount (0 or `penalty`) to subtract from its reward for being a near-duplicate.

    Texts are grouped contiguously, `group_size` per prompt; groups never affect each other. Member i
    is penalised when its similarity to some other member j of its group exceeds `threshold`, where the
    similarity is `pair_bleu(texts[i], texts[j], max_n)` (BLEU of i with j as the only reference), and
    is 1.0 by definition when the two whitespace-token sequences are identical (so duplicates, even
    empty or shorter than max_n tokens, are always penalised). `threshold` must lie in [0, 1).
    """
    _check_texts(texts)
    _check_group_size(group_size, len(texts), "texts")
    _check_in_range("threshold", threshold, 0.0, 1.0, high_inclusive=False)
    _check_in_range("penalty", penalty, 0.0, math.inf, high_inclusive=False)
    _check_max_n(max_n)
    penalties: list[float] = []
    for start in range(0, len(texts), group_size):
        flagged = _near_duplicates(texts[start : start + group_size], threshold, max_n)
        penalties.extend(float(penalty) if is_duplicate else 0.0 for is_duplicate in flagged)
    return penalties


def collapse_alarm(group_bleus: Sequence[float], threshold: float = 0.9) -> int:
    """Number of groups whose Self-BLEU is above `threshold` (NaN values are ignored); 0 means no alarm."""
    _check_in_range("threshold", threshold, 0.0, 1.0)
    return sum(1 for value in group_bleus if not math.isnan(value) and value > threshold)


# --------------------------------------------------------------------------- floor reward


def _floor_candidate(rewards: Sequence[float], progress: Sequence[float], start: int, stop: int) -> int | None:
    """Index of the member to floor in rewards[start:stop], or None when the group has a positive reward.

    Only non-NaN rewards are considered; the highest progress wins, NaN progress counts as -inf,
    and ties go to the lowest index.
    """
    best_index, best_key = None, None
    for index in range(start, stop):
        reward = rewards[index]
        if math.isnan(reward):
            continue
        if reward > 0:
            return None
        key = -math.inf if math.isnan(progress[index]) else progress[index]
        if best_key is None or key > best_key:
            best_index, best_key = index, key
    return best_index


def apply_floor_reward(
    rewards: Sequence[float], group_size: int, progress: Sequence[float], floor: float = 0.05
) -> tuple[list[float], int]:
    """Give the most promising member of every all-zero group a small `floor` reward.

    Rewards are grouped contiguously, `group_size` per prompt. When every non-NaN reward of a group is
    <= 0, the non-NaN member with the highest `progress` (a partial-progress score from the task, or the
    length-normalised logprob) gets `floor` instead of its reward; ties go to the lowest index. NaN
    rewards stay NaN and are never picked; an all-NaN group is untouched. The input is not modified.
    Returns the new rewards and the number of groups floored.
    """
    _check_group_size(group_size, len(rewards), "rewards")
    if len(progress) != len(rewards):
        raise ValueError(f"len(progress)={len(progress)} must equal len(rewards)={len(rewards)} (one per completion)")
    if not (isinstance(floor, (int, float)) and 0 < floor < math.inf):
        raise ValueError(f"floor={floor!r} must be a finite number > 0 (e.g. 0.05)")
    floored = [float(reward) for reward in rewards]
    n_floored = 0
    for start in range(0, len(rewards), group_size):
        candidate = _floor_candidate(floored, progress, start, start + group_size)
        if candidate is not None:
            floored[candidate] = float(floor)
            n_floored += 1
    return floored, n_floored


# --------------------------------------------------------------------------- difficulty buckets


def _split_in_quantiles(order: list[int], n_buckets: int) -> list[list[int]]:
    """Cut an ordered list into n_buckets contiguous chunks whose sizes differ by at most one."""
    size = len(order)
    return [order[bucket * size // n_buckets : (bucket + 1) * size // n_buckets] for bucket in range(n_buckets)]


class DifficultyBuckets:
    """Curriculum sampler: every batch comes from one difficulty bucket; buckets follow observed pass rates.

    Buckets are numbered from easiest (0) to hardest (n_buckets - 1) and hold equal numbers of tasks
    (sizes differ by at most one). Initially tasks are split by quantiles of their heuristic difficulty.

    Pass rates: `update(task_id, observation)` sets the task's pass-rate EMA to the observation the first
    time, then to (1 - ema) * old + ema * observation. A task not yet observed uses its heuristic bucket's
    prior: the mean EMA of the observed tasks of that same initial bucket, or, when none is observed yet,
    1 - (b + 0.5) / n_buckets for initial bucket b (easier buckets are expected to pass more).

    Re-bucketing (lazily, before the next read): tasks are sorted by estimated difficulty = 1 - pass-rate
    estimate (ties by heuristic difficulty, then input order) and cut into equal-size quantile buckets.

    Bucket choice: bucket b is drawn with probability proportional to max(p_b * (1 - p_b), 0.05), with p_b
    its mean pass-rate estimate, which favours buckets near 50 % passing (where GRPO groups have mixed
    rewards, hence a signal) while never starving any bucket. Within the bucket the least-drawn tasks
    are taken (random among equals): no task repeats before every task of its bucket has been drawn,
    as in an epoch, and a batch larger than the bucket is whole passes plus the remainder. All
    randomness comes from the sampler's own `random.Random(seed)`, whose state is in `state_dict()`.
    """

    def __init__(
        self, task_ids: Sequence[str], heuristic_difficulty: Sequence[float], n_buckets: int = 3, ema: float = 0.1,
        seed: int = 0,
    ) -> None:
        task_ids = list(task_ids)
        heuristic = [float(value) for value in heuristic_difficulty]
        self._check_config(task_ids, heuristic, n_buckets, ema)
        self._task_ids = task_ids
        self._position = {task_id: index for index, task_id in enumerate(task_ids)}
        self._configure(heuristic, n_buckets, ema, seed)
        self._pass_ema: list[float | None] = [None] * len(task_ids)
        self._draws = [0] * len(task_ids)  # times each task was drawn: the least drawn go first
        self._rng = random.Random(seed)

    @staticmethod
    def _check_config(task_ids: list, heuristic: list[float], n_buckets: int, ema: float) -> None:
        if len(set(task_ids)) != len(task_ids):
            raise ValueError(f"task_ids must be unique, got {len(task_ids) - len(set(task_ids))} duplicate(s)")
        if len(heuristic) != len(task_ids):
            raise ValueError(f"len(heuristic_difficulty)={len(heuristic)} must equal len(task_ids)={len(task_ids)}")
        bad = [index for index, value in enumerate(heuristic) if not math.isfinite(value)]
        if bad:
            raise ValueError(f"heuristic_difficulty[{bad[0]}]={heuristic[bad[0]]} must be finite")
        if isinstance(n_buckets, bool) or not isinstance(n_buckets, int) or not 1 <= n_buckets <= len(task_ids):
            raise ValueError(f"n_buckets={n_buckets!r} must be an int in [1, {len(task_ids)}] (at most one per task)")
        if not (isinstance(ema, (int, float)) and 0 < ema <= 1):
            raise ValueError(f"ema={ema!r} must be in (0, 1] (the weight of a new observation, e.g. 0.1)")

    def _configure(self, heuristic: list[float], n_buckets: int, ema: float, seed: int) -> None:
        self._heuristic = heuristic
        self.n_buckets = n_buckets
        self.ema = float(ema)
        self.seed = seed
        by_heuristic = sorted(range(len(heuristic)), key=lambda index: (heuristic[index], index))
        self._initial_bucket = [0] * len(heuristic)
        for bucket, members in enumerate(_split_in_quantiles(by_heuristic, n_buckets)):
            for index in members:
                self._initial_bucket[index] = bucket
        self._members: list[list[int]] | None = None  # None: re-bucket before the next read

    def _estimated_pass_rates(self) -> list[float]:
        """Per task, its pass-rate EMA once observed, else its initial bucket's prior."""
        observed: list[list[float]] = [[] for _ in range(self.n_buckets)]
        for index, value in enumerate(self._pass_ema):
            if value is not None:
                observed[self._initial_bucket[index]].append(value)
        priors = [
            math.fsum(values) / len(values) if values else 1 - (bucket + 0.5) / self.n_buckets
            for bucket, values in enumerate(observed)
        ]
        initial = self._initial_bucket
        return [priors[initial[index]] if value is None else value for index, value in enumerate(self._pass_ema)]

    def _bucket_members(self) -> list[list[int]]:
        if self._members is None:
            estimates, heuristic = self._estimated_pass_rates(), self._heuristic
            order = sorted(range(len(estimates)), key=lambda index: (1 - estimates[index], heuristic[index], index))
            self._members = _split_in_quantiles(order, self.n_buckets)
        return self._members

    def buckets(self) -> list[list[str]]:
        """Task ids per bucket, easiest bucket first."""
        return [[self._task_ids[index] for index in members] for members in self._bucket_members()]

    def bucket_of(self, task_id: str) -> int:
        """Index of the bucket that currently holds `task_id` (0 = easiest)."""
        index = self._index_of(task_id)
        return next(bucket for bucket, members in enumerate(self._bucket_members()) if index in members)

    def _index_of(self, task_id: str) -> int:
        if task_id not in self._position:
            raise ValueError(f"task_id={task_id!r} is not one of the {len(self._task_ids)} tasks of this sampler")
        return self._position[task_id]

    def update(self, task_id: str, pass_rate_observation: float) -> None:
        """Fold one observed pass rate (fraction of a group's completions that passed) into the task's EMA."""
        index = self._index_of(task_id)
        _check_in_range("pass_rate_observation", pass_rate_observation, 0.0, 1.0)
        previous = self._pass_ema[index]
        observation = float(pass_rate_observation)
        self._pass_ema[index] = observation if previous is None else (1 - self.ema) * previous + self.ema * observation
        self._members = None

    def pass_rates(self) -> dict[int, float]:
        """Mean pass-rate estimate per bucket (observed EMAs, priors for unobserved tasks)."""
        estimates = self._estimated_pass_rates()
        return {
            bucket: math.fsum(estimates[index] for index in members) / len(members)
            for bucket, members in enumerate(self._bucket_members())
        }

    def sample_batch(self, n_tasks: int) -> tuple[int, list[str]]:
        """Draw `n_tasks` task ids, all from one bucket; returns (bucket index, task ids)."""
        if isinstance(n_tasks, bool) or not isinstance(n_tasks, int) or n_tasks < 1:
            raise ValueError(f"n_tasks={n_tasks!r} must be an int >= 1")
        members = self._bucket_members()
        rates = self.pass_rates()
        weights = [max(rates[bucket] * (1 - rates[bucket]), MIN_BUCKET_WEIGHT) for bucket in range(self.n_buckets)]
        bucket = self._rng.choices(range(self.n_buckets), weights=weights)[0]
        picked = self._least_drawn(members[bucket], n_tasks)
        return bucket, [self._task_ids[index] for index in picked]

    def _least_drawn(self, pool: list[int], n_tasks: int) -> list[int]:
        """The n least-drawn tasks of the pool (random among equals), so that every task of a bucket
        is visited once before any repeats (an epoch per bucket, robust to re-bucketing)."""
        picked: list[int] = []
        while len(picked) < n_tasks:
            order = sorted(pool, key=lambda index: (self._draws[index], self._rng.random()))
            batch = order[:n_tasks - len(picked)]
            for index in batch:
                self._draws[index] += 1
            picked.extend(batch)
        return picked

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume sampling exactly, as JSON-serialisable plain data."""
        version, internal, gauss_next = self._rng.getstate()
        return {
            "format": STATE_FORMAT,
            "task_ids": list(self._task_ids),
            "heuristic_difficulty": list(self._heuristic),
            "n_buckets": self.n_buckets,
            "ema": self.ema,
            "seed": self.seed,
            "pass_ema": list(self._pass_ema),
            "draws": list(self._draws),
            "rng_state": [version, list(internal), gauss_next],  # JSON has no tuples
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict()` (possibly after a JSON round trip); the task ids must be the same."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"state['format']={state.get('format')!r} != {STATE_FORMAT}; pass a state_dict() result")
        if list(state["task_ids"]) != self._task_ids:
            raise ValueError("state['task_ids'] differ from this sampler's; build the sampler from the same task list")
        heuristic = [float(value) for value in state["heuristic_difficulty"]]
        self._check_config(self._task_ids, heuristic, state["n_buckets"], state["ema"])
        if len(state["pass_ema"]) != len(self._task_ids):
            raise ValueError(f"state['pass_ema'] has {len(state['pass_ema'])} entries, need one per task")
        self._configure(heuristic, state["n_buckets"], state["ema"], state["seed"])
        self._pass_ema = [None if value is None else float(value) for value in state["pass_ema"]]
        self._draws = [int(value) for value in state.get("draws", [0] * len(self._task_ids))]
        version, internal, gauss_next = state["rng_state"]
        self._rng.setstate((version, tuple(internal), gauss_next))
