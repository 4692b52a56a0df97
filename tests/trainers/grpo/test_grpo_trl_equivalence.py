"""The GRPO objective (`trainers/grpo/objective.py`: `policy_loss`, `group_advantages`) against TRL 1.16's
REAL, unmodified GRPOTrainer code.

Three kinds of checks:

1. Loss: `GRPOTrainer._compute_loss` runs on fixed float64 tensors through a stub trainer made with
   `object.__new__(trl.GRPOTrainer)`. The stub has only the attributes `_compute_loss` reads, copied from a
   real `trl.GRPOConfig` the way `GRPOTrainer.__init__` copies them; only `_get_per_token_logps_and_entropies`
   (the model forward) is replaced, by a function returning our fixed logps leaf. TRL's loss and
   d(loss)/d(logps) must equal `policy_loss`'s to 1e-8, for every loss type x beta x on/off-policy x
   symmetric/asymmetric clipping.
2. Advantages: TRL computes them inline in `_generate_and_score_completions`, which cannot be called on its own.
   (a) a copy of TRL's expression sequence, using TRL's own `trl.trainer.utils.nanstd`, against
   `group_advantages` on hand-made edge cases (NaN rewards, constant groups, single and zero valid rewards);
   (b) end to end: a real tiny `trl.GRPOTrainer` trains 1-2 steps on a tiny random Llama; the rewards its
   reward function returned and the advantages it computed are captured and `group_advantages` must give
   exactly the same advantages. The same run also checks `policy_loss` against the real `_compute_loss` on the
   model's own logps (float32).
3. Negative controls prove the comparisons can fail, and bad inputs raise ValueErrors that name the tensors.
"""

from __future__ import annotations

import math
import types
from collections import defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainers.grpo.objective import LOSS_TYPES, group_advantages, policy_loss

# TRL 1.16 sets `gradient_checkpointing`, which transformers 5 renames to `activation_checkpointing` (noise only).
pytestmark = pytest.mark.filterwarnings("ignore:.*gradient_checkpointing. is deprecated:FutureWarning")

ATOL = 1e-8
MAX_COMPLETION_LENGTH = 7  # TRL's args.max_completion_length in the stub tests; larger than T = 5 on purpose


# --------------------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def trl():
    import trl  # slow import (several seconds): once per module
    import trl.trainer.utils  # noqa: F401  (nanstd)

    assert trl.__version__ == "1.16.0", f"these checks are pinned to TRL 1.16.0, found {trl.__version__}"
    return trl


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("grpo_trl_out"))


def _fixed_batch() -> dict[str, torch.Tensor]:
    """B = 6 completions, T = 5 tokens, float64, variable lengths (one completion fully masked)."""
    gen = torch.Generator().manual_seed(1234)
    lengths = [5, 3, 1, 4, 0, 2]
    B, T, P = len(lengths), 5, 3
    mask = torch.zeros(B, T, dtype=torch.long)  # TRL's completion_mask is an integer tensor
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    logps = -(0.05 + 2.5 * torch.rand(B, T, generator=gen, dtype=torch.float64))
    # log(ratio) = logps - old. Hand-placed so that, among unmasked tokens, every clipping branch occurs:
    #  * ratio > 1.28 with A > 0: high-clipped under both epsilon settings
    #  * 1.2 < ratio < 1.28 with A > 0: high-clipped only when epsilon_high == 0.2 (tells 0.2 from 0.28 apart)
    #  * ratio < 0.8 with A < 0: low-clipped
    #  * ratio < 0.8 with A > 0 and ratio > 1.2 with A < 0: outside the band but the unclipped term wins the min
    log_ratio = torch.tensor(
        [
            [0.50, 0.22, -0.50, 0.05, -0.10],  # A > 0
            [-0.50, 0.50, -0.10, 0.30, 0.40],  # A < 0 (last two masked)
            [0.30, -0.40, 0.10, 0.00, 0.00],  # A > 0 (only the first token is real)
            [-0.30, 0.21, 0.15, -0.60, 0.90],  # A < 0 (last masked)
            [0.70, -0.70, 0.10, 0.20, 0.30],  # A > 0, fully masked
            [0.02, -0.25, 0.80, -0.80, 0.00],  # A = 0 (last three masked)
        ],
        dtype=torch.float64,
    )
    old = logps - log_ratio
    ref = logps + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    advantages = torch.tensor([1.3, -0.7, 0.9, -1.5, 0.4, 0.0], dtype=torch.float64)
    entropies = 1.0 + torch.rand(B, T, generator=gen, dtype=torch.float64)
    return dict(
        logps=logps,
        old=old,
        ref=ref,
        advantages=advantages,
        mask=mask,
        entropies=entropies,
        prompt_ids=torch.randint(4, 16, (B, P), generator=gen),
        prompt_mask=torch.ones(B, P, dtype=torch.long),
        completion_ids=torch.randint(4, 16, (B, T), generator=gen),
    )


@pytest.fixture(scope="module")
def batch():
    return _fixed_batch()


# --------------------------------------------------------------------------------------------------------------
# The stub trainer around TRL's real _compute_loss


class _SingleProcessAccelerator:
    """What `_compute_loss` uses of `accelerate.Accelerator`, for one process."""

    num_processes = 1
    process_index = 0
    is_main_process = True
    sync_gradients = True
    device = torch.device("cpu")

    @staticmethod
    def gather(tensor):
        return tensor

    @staticmethod
    def gather_for_metrics(tensor):
        return tensor

    @staticmethod
    def reduce(tensor, reduction="sum"):
        return tensor


def _grpo_config(trl, out_dir, **overrides):
    kwargs = dict(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        report_to="none",
        max_completion_length=MAX_COMPLETION_LENGTH,
        gradient_accumulation_steps=1,
    )
    kwargs.update(overrides)
    args = trl.GRPOConfig(**kwargs)
    # One generation batch per optimizer step, no accumulation: TRL's dapo normaliser is then exactly
    # num_items_in_batch = completion_mask.sum(), the normaliser policy_loss uses.
    assert args.steps_per_generation == args.gradient_accumulation_steps == 1
    return args


def _trl_stub(trl, args, logps: torch.Tensor, entropies: torch.Tensor, expected_input_len: int, T: int):
    """A GRPOTrainer with no __init__ run: only what `_compute_loss` reads, set as GRPOTrainer.__init__ does."""
    trainer = object.__new__(trl.GRPOTrainer)
    trainer.args = args
    trainer.max_completion_length = args.max_completion_length
    trainer.use_vllm = args.use_vllm
    trainer.loss_type = args.loss_type
    trainer.importance_sampling_level = args.importance_sampling_level
    trainer.off_policy_mask_threshold = args.off_policy_mask_threshold
    trainer.top_entropy_quantile = args.top_entropy_quantile
    trainer._entropy_bonus_enabled = args.entropy_coef != 0.0 or args.use_adaptive_entropy
    trainer.epsilon_low = args.epsilon
    trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    trainer.beta = args.beta
    trainer.aux_loss_enabled = False  # no MoE router: GRPOTrainer.__init__ sets False for dense models
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer.model = types.SimpleNamespace(training=True)
    trainer.current_gradient_accumulation_steps = 1
    trainer.accelerator = _SingleProcessAccelerator()
    # The defaults leave every optional branch of _compute_loss off; the comparison relies on that.
    assert not trainer.use_vllm and trainer.importance_sampling_level == "token"
    assert trainer.off_policy_mask_threshold is None and trainer.top_entropy_quantile == 1.0
    assert not trainer._entropy_bonus_enabled and args.delta is None

    def fixed_logps(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        assert tuple(input_ids.shape) == tuple(attention_mask.shape) == (logps.shape[0], expected_input_len)
        assert logits_to_keep == T and kwargs.get("compute_entropy") is True
        return logps, entropies, None

    trainer._get_per_token_logps_and_entropies = fixed_logps
    return trainer


def run_trl_loss(trl, out_dir, batch, *, loss_type, beta, off_policy, epsilon_low, epsilon_high, **config):
    """TRL's own `_compute_loss` on the fixed batch: (loss, d loss / d logps, TRL's logged metrics)."""
    args = _grpo_config(
        trl, out_dir, loss_type=loss_type, beta=beta, epsilon=epsilon_low, epsilon_high=epsilon_high, **config
    )
    logps = batch["logps"].clone().requires_grad_(True)
    T = batch["completion_ids"].shape[1]
    stub = _trl_stub(trl, args, logps, batch["entropies"], batch["prompt_ids"].shape[1] + T, T)
    inputs = {
        "prompt_ids": batch["prompt_ids"],
        "prompt_mask": batch["prompt_mask"],
        "completion_ids": batch["completion_ids"],
        "completion_mask": batch["mask"],
        "advantages": batch["advantages"],
        "num_items_in_batch": batch["mask"].sum(),
    }
    if off_policy:
        inputs["old_per_token_logps"] = batch["old"]
    if beta != 0.0:
        inputs["ref_per_token_logps"] = batch["ref"]
    loss = trl.GRPOTrainer._compute_loss(stub, stub.model, inputs)
    (grad,) = torch.autograd.grad(loss, logps)
    metrics = {k: v[-1] for k, v in stub._metrics["train"].items()}
    return loss.detach(), grad, metrics, args


def run_our_loss(batch, *, loss_type, beta, off_policy, epsilon_low, epsilon_high, max_completion_length):
    logps = batch["logps"].clone().requires_grad_(True)
    loss, stats = policy_loss(
        logps,
        batch["old"] if off_policy else None,
        batch["ref"] if beta != 0.0 else None,
        batch["advantages"],
        batch["mask"],
        loss_type=loss_type,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        beta=beta,
        max_completion_length=max_completion_length,
    )
    (grad,) = torch.autograd.grad(loss, logps)
    return loss.detach(), grad, stats


def _max_abs(a, b) -> float:
    return (a - b).abs().max().item()


# --------------------------------------------------------------------------------------------------------------
# 1. Loss and gradient equal to TRL's _compute_loss


EPSILONS = [pytest.param(0.2, 0.2, id="eps=0.2"), pytest.param(0.2, 0.28, id="eps=0.2/0.28")]


@pytest.mark.parametrize("epsilon_low, epsilon_high", EPSILONS)
@pytest.mark.parametrize("off_policy", [False, True], ids=["on_policy", "off_policy"])
@pytest.mark.parametrize("beta", [0.0, 0.04], ids=["beta=0", "beta=0.04"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_and_grad_match_trl(trl, out_dir, batch, loss_type, beta, off_policy, epsilon_low, epsilon_high):
    case = dict(loss_type=loss_type, beta=beta, off_policy=off_policy, epsilon_low=epsilon_low, epsilon_high=epsilon_high)
    trl_loss, trl_grad, metrics, args = run_trl_loss(trl, out_dir, batch, **case)
    our_loss, our_grad, stats = run_our_loss(batch, max_completion_length=args.max_completion_length, **case)

    assert trl_loss.dtype == our_loss.dtype == torch.float64
    torch.testing.assert_close(our_loss, trl_loss, atol=ATOL, rtol=0)
    torch.testing.assert_close(our_grad, trl_grad, atol=ATOL, rtol=0)
    # Not a trivial match: the gradient is non-zero, and zero on padding.
    assert trl_grad.abs().max() > 1e-3
    assert torch.all(trl_grad[batch["mask"] == 0] == 0)

    # The diagnostics are TRL's logged metrics (token means over the batch). TRL counts clipped tokens in
    # float32 (`is_low_clipped.float()`), hence the float32 tolerance there; its KL stays float64.
    assert stats.low_clip_fraction == pytest.approx(metrics["clip_ratio/low_mean"], abs=1e-7)
    assert stats.high_clip_fraction == pytest.approx(metrics["clip_ratio/high_mean"], abs=1e-7)
    assert stats.clip_fraction == pytest.approx(metrics["clip_ratio/region_mean"], abs=1e-7)
    if beta != 0.0:
        assert stats.kl == pytest.approx(metrics["kl"], abs=1e-12)
    else:
        assert stats.kl is None and "kl" not in metrics


@pytest.mark.parametrize("epsilon_low, epsilon_high", EPSILONS)
def test_fixture_exercises_both_clipping_sides(trl, out_dir, batch, epsilon_low, epsilon_high):
    """The off-policy fixture really clips, low and high, as counted by TRL itself."""
    _, _, metrics, _ = run_trl_loss(
        trl, out_dir, batch, loss_type="dapo", beta=0.0, off_policy=True, epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
    )
    assert metrics["clip_ratio/low_mean"] > 0
    assert metrics["clip_ratio/high_mean"] > 0
    # Some masked-in token has 1.2 < ratio < 1.28 and A > 0: clipped at eps_high = 0.2 but not at 0.28.
    ratio = torch.exp(batch["logps"] - batch["old"])
    between = (ratio > 1.2) & (ratio < 1.28) & (batch["advantages"][:, None] > 0) & (batch["mask"] == 1)
    assert between.any()
    # A fully masked completion and T < max_completion_length: the normalisers really differ.
    assert (batch["mask"].sum(-1) == 0).any() and batch["mask"].shape[1] < MAX_COMPLETION_LENGTH


def test_advantages_of_shape_b1_match_trl(trl, out_dir, batch):
    """TRL accepts (B, 1) advantages as well as (B,); so does policy_loss."""
    case = dict(loss_type="grpo", beta=0.04, off_policy=True, epsilon_low=0.2, epsilon_high=0.28)
    trl_loss, trl_grad, _, _ = run_trl_loss(trl, out_dir, batch, **case)
    b1 = dict(batch, advantages=batch["advantages"][:, None])
    our_loss, our_grad, _ = run_our_loss(b1, max_completion_length=MAX_COMPLETION_LENGTH, **case)
    torch.testing.assert_close(our_loss, trl_loss, atol=ATOL, rtol=0)
    torch.testing.assert_close(our_grad, trl_grad, atol=ATOL, rtol=0)


# Negative controls: each is a plausible mistake; TRL must disagree with it by far more than the tolerance,
# which shows that the 1e-8 comparison above can fail.


def _loss_gap(trl, out_dir, batch, trl_case: dict, our_case: dict) -> tuple[float, float]:
    trl_loss, trl_grad, _, args = run_trl_loss(trl, out_dir, batch, **trl_case)
    our_case = {"max_completion_length": args.max_completion_length, **our_case}
    our_loss, our_grad, _ = run_our_loss(batch, **our_case)
    return abs(our_loss.item() - trl_loss.item()), _max_abs(our_grad, trl_grad)


BASE = dict(loss_type="dapo", beta=0.04, off_policy=True, epsilon_low=0.2, epsilon_high=0.28)


@pytest.mark.parametrize(
    "trl_change, our_change",
    [
        pytest.param({}, {"loss_type": "grpo"}, id="grpo-vs-dapo-aggregation"),
        pytest.param({"loss_type": "bnpo"}, {"loss_type": "grpo"}, id="grpo-vs-bnpo-aggregation"),
        pytest.param({"loss_type": "dr_grpo"}, {"loss_type": "dr_grpo", "max_completion_length": None},
                     id="dr_grpo-normaliser-T-instead-of-max_completion_length"),
        pytest.param({}, {"epsilon_high": 0.2}, id="epsilon_high-ignored"),
        pytest.param({"epsilon_high": 0.2}, {"epsilon_high": 0.2, "epsilon_low": 0.28}, id="epsilon_low-wrong"),
        pytest.param({}, {"beta": 0.02, "off_policy": True}, id="beta-wrong"),
        pytest.param({}, {"off_policy": False}, id="old-logprobs-ignored"),
    ],
)
def test_negative_controls_loss(trl, out_dir, batch, trl_change, our_change):
    loss_gap, grad_gap = _loss_gap(trl, out_dir, batch, {**BASE, **trl_change}, {**BASE, **trl_change, **our_change})
    assert max(loss_gap, grad_gap) > 1e-4, (loss_gap, grad_gap)


def test_negative_control_kl_without_ratio(trl, out_dir, batch):
    """TRL 1.16 multiplies the k3 KL by the ratio (use_bias_correction_kl=True, the default); with that off,
    TRL's gradient differs from ours even on-policy, where the ratio's value is 1 but its gradient is not 0."""
    for off_policy in (False, True):
        case = dict(BASE, off_policy=off_policy)
        trl_loss, trl_grad, _, _ = run_trl_loss(trl, out_dir, batch, use_bias_correction_kl=False, **case)
        our_loss, our_grad, _ = run_our_loss(batch, max_completion_length=MAX_COMPLETION_LENGTH, **case)
        assert _max_abs(our_grad, trl_grad) > 1e-4


# --------------------------------------------------------------------------------------------------------------
# 2a. Advantages: TRL's expression sequence (copied from GRPOTrainer._generate_and_score_completions, TRL 1.16,
# multi_objective_aggregation="sum_then_normalize", one reward function of weight 1) with TRL's own nanstd.


def trl_reference_advantages(trl, rewards: torch.Tensor, num_generations: int, scale_rewards: str,
                             *, std_eps: float = 1e-4, std_fn=None) -> torch.Tensor:
    nanstd = std_fn if std_fn is not None else trl.trainer.utils.nanstd
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        if num_generations > 1:
            std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
            std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
        else:
            std_rewards = torch.zeros_like(rewards)
    elif scale_rewards == "batch":
        if rewards.numel() > 1:
            std_rewards = nanstd(rewards).expand_as(rewards)
        else:
            std_rewards = torch.zeros_like(rewards)
    else:
        raise ValueError(scale_rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + std_eps)
    return torch.nan_to_num(advantages, nan=0.0)


NAN = float("nan")
ADVANTAGE_CASES = {
    # name: (rewards, G)
    "plain": ([0.1, 0.9, 0.4, 0.7, 2.0, -1.0, 0.5, 0.25, 3.0, 3.5, 2.0, 1.0], 4),
    "nan-rewards": ([1.0, NAN, 0.0, 0.5, NAN, 2.0, 1.0, -1.0, 0.3, 0.3, NAN, 0.9], 4),
    "constant-group": ([0.5, 0.5, 0.5, 0.5, 0.0, 1.0, 0.0, 1.0], 4),
    "constant-with-nan": ([1.0, NAN, 1.0, 1.0, 0.2, 0.4, 0.8, 1.6], 4),
    "single-valid-value": ([NAN, 2.0, NAN, NAN, 0.0, 1.0, 3.0, 1.0], 4),
    "all-nan-group": ([NAN, NAN, NAN, NAN, 0.0, 1.0, 3.0, 1.0, 5.0, 4.0, 4.5, 2.0], 4),
    "all-nan-batch": ([NAN, NAN, NAN, NAN], 2),
    "G=1": ([0.3, 1.0, NAN, -2.0], 1),
    "single-reward": ([0.7], 1),
    "G=2-large-values": ([1e4, 1e4 + 3.0, -250.5, 17.25, 0.0, 1e-3], 2),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("case", list(ADVANTAGE_CASES))
def test_group_advantages_match_trl_formula(trl, case, scale, dtype):
    values, G = ADVANTAGE_CASES[case]
    rewards = torch.tensor(values, dtype=dtype)
    expected = trl_reference_advantages(trl, rewards.clone(), G, scale)
    got = group_advantages(rewards.clone(), G, scale)
    assert got.dtype == dtype and not torch.isnan(got).any()
    torch.testing.assert_close(got, expected, atol=0, rtol=0)  # bit-identical


def test_group_advantages_edge_case_values(trl):
    """What the edge cases come to (under TRL's formula too, by the test above)."""
    adv = group_advantages(torch.tensor(ADVANTAGE_CASES["nan-rewards"][0]), 4, "group")
    assert torch.all(adv[torch.isnan(torch.tensor(ADVANTAGE_CASES["nan-rewards"][0]))] == 0)
    assert torch.all(group_advantages(torch.tensor(ADVANTAGE_CASES["constant-group"][0]), 4, "group")[:4] == 0)
    assert torch.all(group_advantages(torch.tensor(ADVANTAGE_CASES["single-valid-value"][0]), 4, "group")[:4] == 0)
    # With scale="none" the single valid value still has advantage r - mean = 0; with "batch" too.
    for scale in ("none", "batch"):
        assert group_advantages(torch.tensor(ADVANTAGE_CASES["single-valid-value"][0]), 4, scale)[1] == 0
    all_nan = group_advantages(torch.tensor(ADVANTAGE_CASES["all-nan-group"][0]), 4, "group")
    assert torch.all(all_nan[:4] == 0) and torch.all(all_nan[4:] != 0)
    # TRL's eps: a 2-reward group {0, 1} has Bessel std sqrt(0.5), so A = +-0.5 / (sqrt(0.5) + 1e-4).
    two = group_advantages(torch.tensor([0.0, 1.0], dtype=torch.float64), 2, "group")
    assert two[1].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-4), abs=1e-15)


@settings(max_examples=200, deadline=None)
@given(
    G=st.integers(1, 5),
    groups=st.integers(1, 4),
    scale=st.sampled_from(["group", "batch", "none"]),
    data=st.data(),
)
def test_group_advantages_match_trl_formula_property(trl, G, groups, scale, data):
    # Rewards on a coarse grid (ties, constant groups) plus NaNs; hypothesis shrinks failures to small cases.
    values = data.draw(
        st.lists(st.one_of(st.just(NAN), st.integers(-8, 8).map(lambda k: k / 4), st.floats(-1e3, 1e3)),
                 min_size=G * groups, max_size=G * groups)
    )
    rewards = torch.tensor(values, dtype=torch.float32)
    torch.testing.assert_close(
        group_advantages(rewards, G, scale), trl_reference_advantages(trl, rewards, G, scale), atol=0, rtol=0
    )


# Negative controls for advantages: the usual mistakes are far more than 1e-8 away from TRL.


def _population_nanstd(x, dim=None):
    keep = {} if dim is None else {"dim": dim, "keepdim": True}
    mean = torch.nanmean(x, **keep)
    std = torch.sqrt(torch.nanmean((x - mean) ** 2, **keep))
    return std.reshape(()) if dim is None else std.squeeze(dim)


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_negative_controls_advantages(trl, scale):
    rewards = torch.tensor(ADVANTAGE_CASES["plain"][0], dtype=torch.float64)
    ours = group_advantages(rewards, 4, scale)
    assert _max_abs(ours, trl_reference_advantages(trl, rewards, 4, scale, std_fn=_population_nanstd)) > 1e-2
    assert _max_abs(ours, trl_reference_advantages(trl, rewards, 4, scale, std_eps=1e-8)) > 1e-5
    # Even torch.std (also Bessel-corrected, no NaNs here) is told apart, in float64: TRL's nanstd computes the
    # Bessel factor count / (count - 1) from integer counts, i.e. in float32 (4/3 -> 1.33333337), ~2e-8 away.
    torch_std = lambda x, dim=None: x.std() if dim is None else x.std(dim=dim)  # noqa: E731
    assert 1e-8 < _max_abs(ours, trl_reference_advantages(trl, rewards, 4, scale, std_fn=torch_std)) < 1e-6


def test_negative_control_nan_as_zero_reward(trl):
    """Treating a missing (None) reward as 0 instead of leaving it out changes the other advantages."""
    rewards = torch.tensor(ADVANTAGE_CASES["nan-rewards"][0], dtype=torch.float64)
    assert _max_abs(group_advantages(rewards, 4), trl_reference_advantages(trl, rewards.nan_to_num(0.0), 4, "group")) > 1e-2


# --------------------------------------------------------------------------------------------------------------
# 2b. End to end: a real tiny GRPOTrainer; its own rewards and advantages are captured.


PROMPTS = ["12+35=", "7+8=", "40+2=", "9+90="]
G_E2E = 4


def _tiny_model_dir(path) -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + list("0123456789+="))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        padding_side="left",
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=32, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return _tiny_model_dir(tmp_path_factory.mktemp("tiny_llama"))


def make_reward_fn(constant_second_group: bool, log: list):
    """Deterministic in (position in the generation batch, completion text); None for completion 1."""

    def digits_reward(prompts, completions, completion_ids, **kwargs):
        out = []
        for i, completion in enumerate(completions):
            if i == 1:
                out.append(None)  # unscorable: TRL turns it into NaN
            elif constant_second_group and i >= G_E2E:
                out.append(1.5)  # a zero-std group
            else:
                out.append(float(sum(ch.isdigit() for ch in completion)) + 0.25 * i + 0.1 * len(completion))
        log.append({"prompts": list(prompts), "completions": list(completions), "rewards": list(out)})
        return out

    return digits_reward


E2E_CASES = [
    # scale_rewards, loss_type, beta, num_iterations (2: step 2 reuses the generation -> old logps, ratio != 1)
    pytest.param("group", "dapo", 0.0, 1, True, id="group-dapo-on_policy"),
    pytest.param("batch", "grpo", 0.04, 2, False, id="batch-grpo-beta-off_policy"),
    pytest.param("none", "dr_grpo", 0.0, 2, False, id="none-dr_grpo-off_policy"),
    pytest.param("group", "bnpo", 0.04, 1, False, id="group-bnpo-beta-on_policy"),
]


@pytest.mark.parametrize("scale, loss_type, beta, num_iterations, constant_second_group", E2E_CASES)
def test_real_trainer_advantages_and_loss(trl, tiny_model_dir, tmp_path, scale, loss_type, beta, num_iterations,
                                          constant_second_group):
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tokenizer.padding_side == "left"
    reward_log: list = []
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
        num_generations=G_E2E, per_device_train_batch_size=8, max_completion_length=4, max_steps=num_iterations,
        num_iterations=num_iterations, learning_rate=1e-5, scale_rewards=scale, loss_type=loss_type, beta=beta,
        epsilon=0.2, epsilon_high=0.28, save_strategy="no", disable_tqdm=True, seed=0,
    )
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=make_reward_fn(constant_second_group, reward_log), args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}), processing_class=tokenizer,
    )

    # Capture what TRL computes, calling its real methods unchanged.
    generated: list[dict] = []
    orig_generate = trainer._generate_and_score_completions

    def capture_generate(*a, **k):
        out = orig_generate(*a, **k)
        generated.append({key: v.detach().clone() if torch.is_tensor(v) else v for key, v in out.items()})
        return out

    forward: dict = {}
    orig_logps = trainer._get_per_token_logps_and_entropies

    def capture_logps(*a, **k):
        out = orig_logps(*a, **k)
        if k.get("compute_entropy"):  # the call from _compute_loss (generation-time calls don't need entropies)
            forward["logps"] = out[0]
        return out

    loss_checks: list[dict] = []
    orig_loss = trainer._compute_loss

    def check_loss(model_, inputs):
        forward.clear()
        trl_loss = orig_loss(model_, inputs)
        logps = forward["logps"]
        assert logps.requires_grad and logps.dtype == torch.float32
        assert torch.equal(inputs["num_items_in_batch"], inputs["completion_mask"].sum())
        our_loss, _ = policy_loss(
            logps, inputs.get("old_per_token_logps"), inputs.get("ref_per_token_logps"), inputs["advantages"],
            inputs["completion_mask"], loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28, beta=beta,
            max_completion_length=args.max_completion_length,
        )
        (trl_grad,) = torch.autograd.grad(trl_loss, logps, retain_graph=True)
        (our_grad,) = torch.autograd.grad(our_loss, logps, retain_graph=True)
        old = inputs.get("old_per_token_logps")
        loss_checks.append({
            "trl": trl_loss.detach().clone(), "ours": our_loss.detach().clone(), "trl_grad": trl_grad,
            "our_grad": our_grad, "off_policy": old is not None and not torch.equal(old, logps.detach()),
        })
        return trl_loss

    trainer._generate_and_score_completions = capture_generate
    trainer._get_per_token_logps_and_entropies = capture_logps
    trainer._compute_loss = check_loss
    trainer.train()

    # One generation batch (num_iterations=2 reuses it), scored once by the reward function.
    assert len(generated) == 1 and len(reward_log) == 1
    prompts = reward_log[0]["prompts"]
    assert len(prompts) == 8 and all(p == prompts[g * G_E2E] for g in range(2) for p in prompts[g * G_E2E:(g + 1) * G_E2E])
    rewards = torch.tensor([math.nan if r is None else r for r in reward_log[0]["rewards"]], dtype=torch.float32)
    trl_advantages = generated[0]["advantages"]

    ours = group_advantages(rewards, G_E2E, scale)
    torch.testing.assert_close(ours, trl_advantages, atol=0, rtol=0)  # bit-identical
    assert trl_advantages[1] == 0  # the None reward
    assert (trl_advantages[:G_E2E].abs() > 0.1).sum() >= 2  # non-trivial advantages in the varied group
    if constant_second_group:
        assert torch.all(trl_advantages[G_E2E:] == 0)

    # The loss TRL trained on, recomputed by policy_loss from the same logps (float32 model, so float32 tolerance).
    assert len(loss_checks) == num_iterations
    if num_iterations > 1:
        assert loss_checks[-1]["off_policy"]  # the reused generation batch really has old logps != logps
    for check in loss_checks:
        torch.testing.assert_close(check["ours"], check["trl"], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(check["our_grad"], check["trl_grad"], atol=1e-7, rtol=1e-6)
        assert check["trl_grad"].abs().max() > 0


# --------------------------------------------------------------------------------------------------------------
# 3. Bad inputs raise ValueErrors that name the tensors


def _ok(B=3, T=4):
    return dict(
        logprobs=-torch.rand(B, T, dtype=torch.float64),
        old_logprobs=-torch.rand(B, T, dtype=torch.float64),
        ref_logprobs=-torch.rand(B, T, dtype=torch.float64),
        advantages=torch.randn(B, dtype=torch.float64),
        mask=torch.ones(B, T, dtype=torch.long),
    )


def _call(beta=0.04, loss_type="dapo", **overrides):
    kw = {**_ok(), **overrides}
    return policy_loss(kw["logprobs"], kw["old_logprobs"], kw["ref_logprobs"], kw["advantages"], kw["mask"],
                       loss_type=loss_type, beta=beta)


def test_valid_inputs_do_not_raise():
    loss, _ = _call()
    assert loss.dim() == 0 and torch.isfinite(loss)


@pytest.mark.parametrize("name", ["mask", "old_logprobs", "ref_logprobs"])
def test_wrong_shape_names_tensor_and_both_shapes(name):
    with pytest.raises(ValueError) as info:
        _call(**{name: _ok(3, 5)[name]})
    message = str(info.value)
    assert name in message and "(3, 5)" in message and "(3, 4)" in message


def test_logprobs_must_be_2d():
    with pytest.raises(ValueError, match=r"logprobs.*\(B, T\).*\(12,\)"):
        _call(logprobs=torch.zeros(12, dtype=torch.float64))


def test_integer_logprobs_rejected():
    with pytest.raises(ValueError, match=r"logprobs.*floating.*int64"):
        _call(logprobs=torch.zeros(3, 4, dtype=torch.long))


def test_integer_advantages_rejected():
    with pytest.raises(ValueError, match=r"advantages.*floating.*int64"):
        _call(advantages=torch.ones(3, dtype=torch.long))


@pytest.mark.parametrize("shape", [(4,), (3, 4), (1, 3)])
def test_wrong_advantages_shape(shape):
    with pytest.raises(ValueError, match=r"advantages.*\(3,\)"):
        _call(advantages=torch.zeros(shape, dtype=torch.float64))


def test_missing_ref_logprobs_with_beta():
    with pytest.raises(ValueError, match="ref_logprobs"):
        _call(beta=0.04, ref_logprobs=None)
    _call(beta=0.0, ref_logprobs=None)  # not needed without the KL term


def test_unknown_loss_type():
    with pytest.raises(ValueError, match="loss_type"):
        _call(loss_type="cispo")


def test_group_advantages_bad_inputs():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(4), 0)
    with pytest.raises(ValueError, match=r"rewards.*1-D.*\(2, 2\)"):
        group_advantages(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.zeros(4), 2, "std")
