"""Benchmark our GRPO trainer against TRL 1.16's `GRPOTrainer` on the addition demo, A/B interleaved.

Run from a checkout: `python bench/grpo_vs_trl.py` (3 rounds of 30 steps, about 30 s once the tiny
model is cached), or `--quick` (seconds, for tests/integration/test_benchmarks.py: 1 round of 4 steps, held-out
accuracy on the first 64 evaluation prompts with 4 samples each). `--json PATH` also writes every
number as JSON. The last line, `ratio: ...`, is the speed-up over TRL (the anchor) measured in this run.

Both trainers start each run from a fresh copy of the same warmed-up tiny model (trainers.demo) and
train on the same 744 prompts with the same settings: G = 8 completions for each of 8 prompts per
step, max 8 new tokens, temperature 1, lr 5e-5 constant, AdamW, grad clip 1.0, beta 0, DAPO loss,
group-scaled advantages, one torch thread. Ours samples prompts uniformly (buckets=1) and gives no
floor reward, like TRL. Round r runs ours then TRL, both with seed `--seed + r`.

Measured per run:
- seconds per step, median over steps 2..N (step 1 pays one-off warm-up costs). Ours is the wall time
  around `trainer.step()`; TRL's is the wall time from `on_step_begin` to `on_step_end` (generation,
  loss, backward, optimizer; its logging after `on_step_end` is left out, which favours TRL);
- held-out accuracy on the 256 evaluation prompts, greedy and sampled (8 samples, temperature 1,
  fixed seed), before and after, with the project's own `trainers.demo.held_out_accuracy` for both.

Both run in this one process: the imports are paid once, the accelerator state TRL creates is the
same for every run, and each run builds its own model, optimizer and trainer. TRL reseeds the global
RNGs and our trainer seeds its own generator, so neither run depends on the one before it; the torch
thread count is checked (and reset to 1) before every run.

Speed-up = median TRL s/step / median ours s/step (medians over runs of the per-run medians).
Goals: speed-up >= 3x, and our mean held-out gain >= TRL's (checked for greedy and sampled).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import asdict, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marl.addition import addition_reward, addition_splits  # noqa: E402
from trainers.demo import demo_policy, held_out_accuracy  # noqa: E402
from trainers.grpo.config import GRPOConfig
from trainers.grpo.trainer import GRPOTrainer  # noqa: E402
from trainers.policy.tinylm import load_policy  # noqa: E402

SPEEDUP_GOAL = 3.0
EVAL_SAMPLES = 8
QUICK_EVAL_PROMPTS, QUICK_EVAL_SAMPLES = 64, 4
SHARED = dict(prompts_per_step=8, group_size=8, max_new_tokens=8, temperature=1.0, lr=5e-5, beta=0.0)


def ours_config(steps: int, seed: int) -> GRPOConfig:
    return GRPOConfig(steps=steps, **SHARED, loss_type="dapo", scale_rewards="group", buckets=1,
                      floor_reward=0.0, seed=seed, threads=1)


def trl_config(steps: int, seed: int, output_dir: str):
    from trl import GRPOConfig as TRLConfig

    return TRLConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        report_to="none", disable_tqdm=True, log_level="error", logging_steps=1, save_strategy="no",
        per_device_train_batch_size=SHARED["prompts_per_step"] * SHARED["group_size"],
        num_generations=SHARED["group_size"], max_completion_length=SHARED["max_new_tokens"],
        temperature=SHARED["temperature"], top_k=0, top_p=1.0, beta=SHARED["beta"],
        learning_rate=SHARED["lr"], lr_scheduler_type="constant", optim="adamw_torch", weight_decay=0.0,
        max_grad_norm=1.0, loss_type="dapo", scale_rewards="group", max_steps=steps, seed=seed)


def trl_reward(completions, answer, **_):
    """TRL-side copy of `addition_reward`: 1.0 when the stripped completion is the sum."""
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]


def quiet_trl() -> None:
    """Silence transformers / TRL / datasets logging, progress bars and warnings."""
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")


def ensure_one_thread() -> None:
    if torch.get_num_threads() != 1:
        print(f"  (torch threads were {torch.get_num_threads()}; reset to 1)")
        torch.set_num_threads(1)


def step_median(times: list[float]) -> float:
    """Median seconds per step, skipping the first step when there is more than one."""
    return statistics.median(times[1:] if len(times) > 1 else times)


def reward_trend(rewards: list[float]) -> tuple[float, float]:
    """Mean batch reward over the first 5 and the last 5 steps."""
    k = min(5, len(rewards))
    return statistics.fmean(rewards[:k]), statistics.fmean(rewards[-k:])


def run_ours(model_dir: Path, splits, steps: int, seed: int, samples: int = EVAL_SAMPLES) -> dict:
    ensure_one_thread()
    model, tokenizer = load_policy(model_dir)
    trainer = GRPOTrainer(model, tokenizer, splits.train, addition_reward, ours_config(steps, seed))
    wall, metrics = [], []
    for _ in range(steps):
        started = time.perf_counter()
        metrics.append(trainer.step())
        wall.append(time.perf_counter() - started)
    after = held_out_accuracy(model, tokenizer, splits, samples, SHARED["max_new_tokens"])
    phases = {p: step_median([m[f"time/{p}"] for m in metrics]) for p in ("generate", "score", "update")}
    return {"trainer": "ours", "seed": seed, "step_seconds": wall, "s_per_step": step_median(wall),
            "phases": phases, "rewards": [m["train/reward"] for m in metrics], "after": after,
            "skipped_spikes": trainer.learner.skipped_spikes}


def run_trl(model_dir: Path, splits, steps: int, seed: int, samples: int = EVAL_SAMPLES) -> dict:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer as TRLTrainer

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begin, self.step_seconds, self.rewards = 0.0, [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_seconds.append(time.perf_counter() - self.begin)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.rewards.append(logs["reward"])

    ensure_one_thread()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")  # as load_policy: no BOS
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    dataset = datasets.Dataset.from_dict({"prompt": [t.prompt for t in splits.train],
                                          "answer": [t.answer for t in splits.train]})
    output_dir, timer = tempfile.mkdtemp(prefix="grpo_vs_trl_"), StepTimer()
    try:
        trainer = TRLTrainer(model=model, reward_funcs=trl_reward, args=trl_config(steps, seed, output_dir),
                             train_dataset=dataset, processing_class=tokenizer, callbacks=[timer])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    trained = trainer.model
    del trainer
    after = held_out_accuracy(trained, tokenizer, splits, samples, SHARED["max_new_tokens"])
    return {"trainer": "trl", "seed": seed, "step_seconds": timer.step_seconds,
            "s_per_step": step_median(timer.step_seconds), "rewards": timer.rewards, "after": after}


def print_run(run: dict, before: dict) -> None:
    start, end = reward_trend(run["rewards"]) if run["rewards"] else (float("nan"), float("nan"))
    after = run["after"]
    print(f"  {run['trainer']:<4}  seed {run['seed']:<3}  {run['s_per_step']:.4f} s/step  "
          f"reward {start:.3f} -> {end:.3f}  greedy {before['greedy']:.3f} -> {after['greedy']:.3f} "
          f"({after['greedy'] - before['greedy']:+.3f})  sampled {before['sampled']:.3f} -> {after['sampled']:.3f} "
          f"({after['sampled'] - before['sampled']:+.3f})", flush=True)


def side_summary(runs: list[dict], before: dict) -> dict:
    return {"s_per_step": statistics.median(r["s_per_step"] for r in runs),
            "per_run_s_per_step": [r["s_per_step"] for r in runs],
            "gain_greedy": statistics.fmean(r["after"]["greedy"] - before["greedy"] for r in runs),
            "gain_sampled": statistics.fmean(r["after"]["sampled"] - before["sampled"] for r in runs)}


def summarize(ours: list[dict], trl: list[dict], before: dict) -> dict:
    s_ours, s_trl = side_summary(ours, before), side_summary(trl, before)
    phases = {p: statistics.median(r["phases"][p] for r in ours) for p in ("generate", "score", "update")}
    speedup = s_trl["s_per_step"] / s_ours["s_per_step"]
    return {"ours": s_ours, "trl": s_trl, "ours_phases": phases, "speedup": speedup,
            "paired_speedups": [t["s_per_step"] / o["s_per_step"] for o, t in zip(ours, trl)],
            "goal_speedup": speedup >= SPEEDUP_GOAL,
            "goal_gain_greedy": s_ours["gain_greedy"] >= s_trl["gain_greedy"],
            "goal_gain_sampled": s_ours["gain_sampled"] >= s_trl["gain_sampled"]}


def print_summary(summary: dict, rounds: int, steps: int) -> None:
    yes = {True: "yes", False: "no"}
    o, t, p = summary["ours"], summary["trl"], summary["ours_phases"]
    print(f"\nsummary over {rounds} round(s) of {steps} steps (medians of per-run medians, steps 2..{steps})")
    print(f"  ours: {o['s_per_step']:.4f} s/step ({1 / o['s_per_step']:.2f} steps/s)  "
          f"split: generate {p['generate']:.4f}, score {p['score']:.4f}, update {p['update']:.4f}")
    print(f"  TRL:  {t['s_per_step']:.4f} s/step ({1 / t['s_per_step']:.2f} steps/s)")
    print(f"  speed-up (TRL s/step / ours s/step): {summary['speedup']:.2f}x  "
          f"(per round: {', '.join(f'{x:.2f}x' for x in summary['paired_speedups'])})")
    print(f"  mean held-out gain, greedy:  ours {o['gain_greedy']:+.3f}  TRL {t['gain_greedy']:+.3f}")
    print(f"  mean held-out gain, sampled: ours {o['gain_sampled']:+.3f}  TRL {t['gain_sampled']:+.3f}")
    print(f"  speedup >= {SPEEDUP_GOAL:g}x: {yes[summary['goal_speedup']]}")
    print(f"  gain >= TRL's: greedy {yes[summary['goal_gain_greedy']]}, sampled {yes[summary['goal_gain_sampled']]}, "
          f"both {yes[summary['goal_gain_greedy'] and summary['goal_gain_sampled']]}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds (each runs ours, then TRL)")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    parser.add_argument("--seed", type=int, default=0, help="round r uses seed SEED + r for both trainers")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 round of 5 steps")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 1, 5
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    quiet_trl()
    splits = addition_splits(seed=0)
    model_dir = demo_policy(splits)  # the tiny model is warmed up on the full splits, cached on disk
    samples = QUICK_EVAL_SAMPLES if args.quick else EVAL_SAMPLES
    if args.quick:
        splits = replace(splits, eval=splits.eval[:QUICK_EVAL_PROMPTS])
    model, tokenizer = load_policy(model_dir)
    before = held_out_accuracy(model, tokenizer, splits, samples, SHARED["max_new_tokens"])
    del model
    print(f"settings: {SHARED}, DAPO loss, group-scaled advantages, AdamW, grad clip 1.0, 1 torch thread")
    print(f"  ours: buckets=1 (uniform prompts), floor_reward=0.0, other GRPOConfig defaults: "
          f"{ {k: v for k, v in asdict(ours_config(args.steps, args.seed)).items() if k not in SHARED} }")
    print(f"  TRL: use_cpu, fp32, no gradient checkpointing, top_k=0, top_p=1.0, constant lr, adamw_torch")
    print(f"held-out before ({len(splits.eval)} prompts): greedy {before['greedy']:.3f}, "
          f"sampled {before['sampled']:.3f} ({samples} samples, temperature 1)")
    ours, trl = [], []
    for r in range(args.rounds):
        seed = args.seed + r
        print(f"round {r + 1}/{args.rounds} (seed {seed})", flush=True)
        for runs, run in ((ours, run_ours), (trl, run_trl)):
            runs.append(run(model_dir, splits, args.steps, seed, samples))
            print_run(runs[-1], before)
            gc.collect()
    summary = summarize(ours, trl, before)
    print_summary(summary, args.rounds, args.steps)
    print(f"ratio: {summary['speedup']:.2f} (TRL s/step / ours s/step; anchor: TRL's GRPOTrainer, trained in this run)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "settings": SHARED,
                                         "before": before, "runs": ours + trl, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
