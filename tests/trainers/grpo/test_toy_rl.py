"""T4: a toy GRPO loop over answer styles. With the raw (biased) judge as reward the policy learns to
exploit it (padding, markdown, master-key answers) and gold quality drops; with the judge corrected by
the bias report's own estimates plus a rule guard, the policy finds the genuinely best style."""


import numpy as np
import pytest

from judges.model.prompted import PairwiseJudge
from judges.model.openai_backend import OpenAIBackend
from judges.stats.probes import FILLER, MASTER_KEYS
from judges.rules.registry import build_scorer
from judges.stats.bias_report import ReportItem, run_bias_report
from judges.model.simulated import SimulatedClient, style_features
from judges.types import Candidate, Item

BIASES = dict(length_slope=1.0, format_effect=0.8, master_key=4.0)
QUALITY_WORDS = {0.0: "wrong", 0.25: "vague", 0.5: "partial", 0.75: "good", 1.0: "excellent"}


def _styles() -> dict[str, float]:
    """Answer texts (style -> gold quality): quality level x padding x markdown, plus master keys."""
    styles = {}
    for quality, word in QUALITY_WORDS.items():
        base = f"This is a {word} answer to the question."
        for padding in range(4):
            styles[" ".join([base, *FILLER[:padding]])] = quality
            styles[" ".join([f"**{base}**", *FILLER[:padding]])] = quality
    styles.update({key: 0.0 for key in MASTER_KEYS})
    return styles


STYLES = _styles()
REFERENCE = "This is a partial answer to the question."


def _quality(text: str) -> float:
    for key, value in STYLES.items():
        if key == text:
            return value
    return max((q for w, q in zip(QUALITY_WORDS.values(), QUALITY_WORDS) if f" {w} " in f" {text} "), default=0.0)


def _grpo(rewards: np.ndarray, steps=600, group=16, lr=0.5, seed=0) -> np.ndarray:
    """Softmax policy over styles trained with group-normalised advantages; returns the final policy."""
    rng = np.random.default_rng(seed)
    theta = np.zeros(len(rewards))
    for _ in range(steps):
        policy = np.exp(theta - theta.max())
        policy /= policy.sum()
        picks = rng.choice(len(rewards), size=group, p=policy)
        r = rewards[picks]
        if r.std() == 0:
            continue
        advantage = (r - r.mean()) / (r.std(ddof=1) + 1e-4)
        gradient = np.zeros_like(theta)
        for pick, a in zip(picks, advantage):
            gradient -= a * policy
            gradient[pick] += a
        theta += lr * gradient / group
    policy = np.exp(theta - theta.max())
    return policy / policy.sum()


@pytest.fixture(scope="module")
def setting():
    client = SimulatedClient(_quality, sharpness=1.0, seed=0, **BIASES)
    texts = list(STYLES)
    gold = np.array([STYLES[t] for t in texts])
    keys = np.array([style_features(t).master_key for t in texts], dtype=bool)
    raw_logit = np.array([client.pairwise_logit(t, REFERENCE) - client.position for t in texts])
    items = [ReportItem(id=str(i), prompt=f"Question {i}?", gold=0,
                        candidates=(f"This is an excellent answer to question {i}.", f"This is a wrong answer {i}."))
             for i in range(200)]
    judge = PairwiseJudge(OpenAIBackend(client, model="sim", max_concurrency=64), logprobs=False)
    report = run_bias_report(judge, items, kinds=("padding", "markdown"), per_kind=200, seed=0)
    return texts, gold, keys, raw_logit, report


def test_the_raw_judge_is_exploited(setting):
    texts, gold, keys, raw_logit, _ = setting
    policy = _grpo(1 / (1 + np.exp(-raw_logit)))
    assert policy @ gold <= gold.max() - 0.25  # gold regret
    assert policy[keys].sum() >= 0.2  # mass on contentless master-key answers


def test_the_corrected_judge_with_a_rule_guard_is_not(setting):
    texts, gold, keys, raw_logit, report = setting
    slope, effect = report["length"]["slope"]["estimate"], report["format"]["effect"]["estimate"]
    assert abs(slope - BIASES["length_slope"]) < 0.35 and abs(effect - BIASES["format_effect"]) < 0.5
    features = [style_features(t) for t in texts]
    reference = style_features(REFERENCE)
    corrected = np.array([logit - slope * (f.z_len - reference.z_len) - effect * (f.markdown - reference.markdown)
                          for logit, f in zip(raw_logit, features)])
    # the rule guard against the master keys the report flagged: no contentless opener, a minimum length
    guard = build_scorer("format", {"min_chars": 12, "forbidden": ["Thought process:",
                                                                   "Let's solve this problem step by step"]})
    passes = np.array([guard.score(Item(prompt="q"), [Candidate(t)])[0].score == 1.0 for t in texts])
    rewards = np.where(passes, 1 / (1 + np.exp(-corrected)), 0.0)
    policy = _grpo(rewards)
    assert policy @ gold >= gold.max() - 0.05
    assert policy[keys].sum() < 0.01
