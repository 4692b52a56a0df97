"""MultiAgentTrainer with one agent: the addition scenario (`marl demo`), or a one-agent scenario written
here when a test needs its own reward (a `callable` scorer next to the scenario file).

The single-policy case of the one trainer: a step's metrics and an update that moves every parameter,
masked scorer failures counted while training goes on, the floor reward of an all-failed group (and,
without it, no update at all), the diversity penalty on duplicates, the KL term and clipping, and, on
the warmed-up demo model, every update favouring the answers it rewarded. The micro policy plays
(instant, untrained); nothing asserted depends on which tokens it samples: a signal, where one is
needed, comes from `by_seed` (tests/helpers/signal.py), and duplicates from logits pinned on one token.
"""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from marl.scenario.load import load_scenario
from trainers.config import resolve_config
from trainers.grpo.config import GRPOConfig
from trainers.grpo.objective import masked_mean, policy_loss
from trainers.policy.actors import ModelActor
from trainers.policy.generation import completion_logprobs
from trainers.team.trainer import MultiAgentTrainer, StepPlan
from helpers.signal import by_seed

PROMPTS, G = 4, 4
FAST = dict(prompts_per_step=PROMPTS, group_size=G, max_new_tokens=4, lr=1e-3, seed=0)
SIGNAL = StepPlan(reward_transform=by_seed)  # every group has a spread: every step updates
SOLO_YAML = """\
name: solo
agents:
  - {name: solver, observation: "{prompt}", max_tokens: 4}
tasks:
  inline:
    - {prompt: '10+20=', answer: '30'}
    - {prompt: '11+21=', answer: '32'}
    - {prompt: '12+22=', answer: '34'}
    - {prompt: '13+23=', answer: '36'}
rewards:
  outcome:
    - {kind: callable, function: "score_lib:score"}
"""


@pytest.fixture
def solo(micro_policy):
    """Factory of a trainer whose one agent, the solver, is played by a trainable micro model ('shared')."""

    def make(scenario: str = "addition", **knobs):
        spec = load_scenario(scenario)
        model, tokenizer = micro_policy()
        actors = {"shared": ModelActor("shared", model, tokenizer, trainable=True, seed=0)}
        train_tasks, _ = spec.split()
        config = resolve_config(spec, grpo=GRPOConfig(**{**FAST, **knobs}))
        return MultiAgentTrainer(spec, actors, {"solver": "shared"}, train_tasks, config, log=lambda message: None)

    return make


def _scored_by(tmp_path, body: str) -> str:
    """The one-agent scenario above, its outcome scored by `score(item, candidate)` with this body."""
    (tmp_path / "score_lib.py").write_text("import math\n\n\ndef score(item, candidate):\n"
                                           + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n")
    path = tmp_path / "solo.yaml"
    path.write_text(SOLO_YAML)
    return str(path)


def _params(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _model(trainer):
    return trainer.actors["shared"].model


def _pin(trainer, token: str) -> None:
    """Sampling with the logits fixed on `token`: every message is the same on every CPU. Only the actor's
    sampling is pinned; the training forward and its losses are the model's own."""
    actor = trainer.actors["shared"]
    act, token_id = actor.act, actor.tokenizer.convert_tokens_to_ids(token)

    def fix(module, inputs, logits):
        bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
        bias[token_id] = 1e4
        return logits + bias

    def pinned(*args, **kwargs):
        handle = actor.model.lm_head.register_forward_hook(fix)
        try:
            return act(*args, **kwargs)
        finally:
            handle.remove()

    actor.act = pinned


def test_a_step_changes_every_parameter_and_reports_its_metrics(solo):
    trainer = solo()
    before = _params(_model(trainer))
    metrics = trainer.step(SIGNAL)
    for name, param in _model(trainer).named_parameters():
        assert not torch.equal(before[name], param), f"{name} did not change"
    expected = {"train/step", "train/reward", "train/team_success", "train/signal_groups", "train/loss", "train/lr",
                "train/agent/solver/reward", "credit/solver/value", "policy/shared/loss", "policy/shared/grad_norm",
                "policy/shared/clip_fraction", "policy/shared/trained_rows", "time/play", "time/credit",
                "time/update", "time/step", "guard/self_bleu", "guard/floored_groups", "guard/diversity_penalised",
                "judge/masked_episodes", "judge/masked_total", "bucket/0/pass_rate",
                "length/completions_at_limit"}
    assert expected <= metrics.keys(), expected - metrics.keys()
    assert "train/kl" not in metrics and trainer.learners["shared"].reference is None  # beta = 0: no reference
    assert metrics["train/step"] == 1 and metrics["policy/shared/grad_norm"] > 0
    assert 0 < metrics["policy/shared/trained_rows"] <= PROMPTS * G  # a row per episode, duplicates merged
    assert 0.0 <= metrics["train/reward"] <= 1.0  # the logged reward is the scenario's, not the signal's


def test_scorer_failures_are_masked_counted_and_training_continues(solo, tmp_path):
    """Two of the four tasks fail to score on every play: one raises, one returns NaN (half of the episodes)."""
    scenario = _scored_by(tmp_path, """
        if item.prompt == "10+20=":
            raise RuntimeError("judge down")
        return math.nan if item.prompt == "11+21=" else 0.0
    """)
    trainer = solo(scenario, buckets=1)  # one bucket of the four tasks: every step plays them all
    model = _model(trainer)
    before = _params(model)
    for step in (1, 2):
        metrics = trainer.step(SIGNAL)
        assert metrics["judge/masked_episodes"] == 8 and metrics["judge/masked_total"] == 8 * step
        assert metrics["train/reward"] == 0.0  # the mean of the scored episodes
        result = trainer.last_step
        for index, episode in enumerate(result.episodes):
            failed = episode.job.task.prompt in ("10+20=", "11+21=")
            assert math.isnan(result.rewards[index]["solver"]) == failed
            assert (result.advantages["solver"][index] == 0.0) if failed else result.advantages["solver"][index] != 0
        assert 0 < metrics["policy/shared/trained_rows"] <= 8  # the scored episodes train, the masked do not
    assert trainer.totals["masked_episodes"] == 16
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def _mean_logprobs(batch) -> list[float]:
    """The mean token logprob of each episode's one sampled message (the floor's partial progress)."""
    values = []
    for episode in batch.episodes:
        turn, = episode.turns
        rows = batch.generations[turn.actor][turn.batch]
        values.append(masked_mean(rows.logprobs[turn.row], rows.completion_mask[turn.row]).item())
    return values


def test_the_floor_reward_gives_a_signal_to_an_all_failed_group(solo, tmp_path):
    trainer = solo(_scored_by(tmp_path, "return 0.0"))
    metrics = trainer.step()
    assert metrics["guard/floored_groups"] == PROMPTS
    assert metrics["train/reward"] == 0.0  # the logged reward is the raw one
    assert metrics["policy/shared/trained_rows"] > 0
    result, progress = trainer.last_step, _mean_logprobs(trainer.last_step.batch)
    rewards = [row["solver"] for row in result.rewards]
    for start in range(0, len(rewards), G):  # one member per group gets the floor: the most promising one
        group = rewards[start:start + G]
        assert sorted(group) == [0.0] * (G - 1) + [0.05]
        assert progress[start + group.index(0.05)] == max(progress[start:start + G])


def test_without_the_floor_an_all_failed_batch_trains_nothing(solo, tmp_path):
    trainer = solo(_scored_by(tmp_path, "return 0.0"), floor_reward=0.0)
    model = _model(trainer)
    before = _params(model)
    metrics = trainer.step()
    assert metrics["train/signal_groups"] == 0.0 and metrics["guard/floored_groups"] == 0
    assert metrics["policy/shared/trained_rows"] == 0
    assert all(a == 0.0 for a in trainer.last_step.advantages["solver"])
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


def test_the_diversity_penalty_hits_duplicates(solo, tmp_path):
    trainer = solo(_scored_by(tmp_path, "return 1.0 if candidate.text else 0.0"), diversity_penalty=0.5)
    _pin(trainer, "7")  # every message of a group the same: every member is a duplicate
    metrics = trainer.step()
    result = trainer.last_step
    assert {turn.text for episode in result.episodes for turn in episode.turns} == {"7777"}
    assert metrics["guard/diversity_penalised"] == PROMPTS * G
    assert 0.0 < metrics["guard/self_bleu"] <= 1.0  # the duplicates share n-grams
    assert metrics["train/reward"] == 1.0  # the logged reward is the raw one
    assert [row["solver"] for row in result.rewards] == pytest.approx([0.5] * (PROMPTS * G))  # 1 - 0.5 each


def test_the_kl_term_is_logged_with_beta_and_mu_gives_clipping(solo):
    trainer = solo(lr=3e-2, beta=0.04, mu=3)
    reference = trainer.learners["shared"].reference
    assert reference is not None and not any(p.requires_grad for p in reference.parameters())
    metrics = [trainer.step(SIGNAL) for _ in range(3)]
    assert all("train/kl" in m and m["train/kl"] >= 0 for m in metrics)
    assert metrics[-1]["train/kl"] > 0
    assert any(m["policy/shared/clip_fraction"] > 0 for m in metrics)


@pytest.mark.slow
def test_every_update_on_the_demo_model_favours_the_answers_it_rewarded(demo_model_dir):
    """`marl demo`'s training on the warmed-up demo model: the addition scenario at its own settings, scored by
    its exact-match reward. Every update, measured teacher-forced on its own batch, raises the likelihood of
    the messages with a positive advantage against those with a negative one (the clipped surrogate on that
    batch falls).

    What the model samples differs across CPUs, so whether held-out accuracy has risen after N steps is not
    a property a test can hold on every machine (bench/ measures it); this one holds for any samples. A
    tie-break of 0.5 on every odd seed gives every group a spread, so every step updates."""
    from trainers.policy.actors import build_actors

    spec = load_scenario("addition", ["train.steps=3"])
    actors, seats = build_actors(spec, demo_model_dir, seed=0)
    config = resolve_config(spec)
    train_tasks, _ = spec.split()
    trainer = MultiAgentTrainer(spec, actors, seats, train_tasks, config, log=lambda message: None)
    model, learner = actors["shared"].model, trainer.learners["shared"]
    cfg, update, surrogates = config.grpo, learner.update, []

    def surrogate(completions, advantages, old):
        with torch.no_grad():
            loss, _ = policy_loss(completion_logprobs(model, completions), old, None, advantages,
                                  completions.completion_mask, loss_type=cfg.loss_type,
                                  max_completion_length=cfg.max_new_tokens)
        return loss.item()

    def measured(completions, advantages, **kwargs):
        with torch.no_grad():
            old = completion_logprobs(model, completions)
        before = surrogate(completions, advantages, old)
        stats = update(completions, advantages, **kwargs)
        surrogates.append((before, surrogate(completions, advantages, old), stats["trained_rows"]))
        return stats

    learner.update = measured
    tie_break = StepPlan(reward_transform=lambda episode, agent, reward: reward + 0.5 * (episode.job.seed % 2))
    for _ in range(cfg.steps):
        trainer.step(tie_break)
    assert len(surrogates) == 3 and all(rows > 0 for _, _, rows in surrogates)
    for before, after, _ in surrogates:
        assert after < before - 1e-4, surrogates
