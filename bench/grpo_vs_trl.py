"""Benchmark marl's training step against TRL 1.16's `GRPOTrainer` on the addition demo, A/B interleaved.

Ours is the one trainer `marl run` and `marl demo` execute (trainers/team/trainer.py `MultiAgentTrainer`)
on a one-agent scenario: the built-in `addition` scenario (the demo), or, in the realistic setting, a
one-agent scenario built here around the same prompts and reward TRL gets. Each step pays what a marl
run pays: episodes played through the scenario's environment and scored by its reward layers.

Run from a checkout: `python bench/grpo_vs_trl.py` (3 rounds of 30 steps, about 30 s once the tiny
model is cached), or `--quick` (seconds, for tests/integration/test_benchmarks.py: 1 round of 4 steps, held-out
accuracy on the first 64 evaluation prompts with 4 samples each). `--json PATH` also writes every
number as JSON. The last line, `ratio: ...`, is the speed-up over TRL (the anchor) measured in this run.

Both trainers start each run from a fresh copy of the same warmed-up tiny model (trainers.policy.addition_model) and
train on the same 744 prompts with the same settings: G = 8 completions for each of 8 prompts per
step, max 8 new tokens, temperature 1, lr 5e-5 constant, AdamW, grad clip 1.0, beta 0, DAPO loss,
group-scaled advantages, one torch thread. Ours samples prompts uniformly (buckets=1) and gives no
floor reward, like TRL. Round r runs ours then TRL, both with seed `--seed + r`.

Measured per run:
- seconds per step, median over steps 2..N (step 1 pays one-off warm-up costs). Ours is the wall time
  around `trainer.step()`; TRL's is the wall time from `on_step_begin` to `on_step_end` (generation,
  loss, backward, optimizer; its logging after `on_step_end` is left out, which favours TRL);
- held-out accuracy on the 256 evaluation prompts, greedy and sampled (8 samples, temperature 1,
  fixed seed), before and after, with the project's own `trainers.policy.addition_model.held_out_accuracy` for both.

Both run in this one process: the imports are paid once, the accelerator state TRL creates is the
same for every run, and each run builds its own model, optimizer and trainer. TRL reseeds the global
RNGs and our trainer seeds its own generator, so neither run depends on the one before it; the torch
thread count is checked (and reset to 1) before every run.

Speed-up = median TRL s/step / median ours s/step (medians over runs of the per-run medians).
Goals: speed-up >= 3x, and our mean held-out gain >= TRL's (checked for greedy and sampled).

`--setting realistic` (issue 12): a ~30M-parameter Qwen2-architecture model (random init, byte-level BPE
tokenizer trained locally; bench/support/real_model.py, cached under $MARL_CACHE/bench), ChatML prompts
of 100 tokens drawn from the project's own texts, 64 new tokens, G = 8, 2 prompts per step (so 16 rows;
`--prompts-per-step`), lr 1e-5, the same DAPO / AdamW / clip settings on both sides, a text reward (the
share of letters and spaces), no gradient checkpointing on either side. Each run is a fresh subprocess
(A/B per round: ours, then TRL), so each has its own peak memory: on the CPU peak RSS (getrusage) and
its rise over the RSS once the model is loaded (both workers import torch, transformers, TRL and
datasets first); on CUDA `torch.cuda.max_memory_allocated`. Prints seconds per step (median of steps
2..N), completion tokens per second and peak memory of both, then `ratio: X` = steps/s ours over
steps/s TRL, with the peak memory ratio ours / TRL on the same line. Goal: >= 2x and memory <= 1.
Defaults: 1 round of 5 steps (`--rounds`, `--steps`), `--device auto --dtype auto` (cpu float32 here),
`--size 30m` (`0.5b` is Qwen2.5-0.5B's shape; bench/gpu_check.sh runs it). `--setting realistic --quick`
is a small variant (the tiny size, 16 new tokens, 3 steps, under a minute); plain `--quick`, which the
tests run, covers the addition setting only.
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
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marl.addition import addition_splits  # noqa: E402
from trainers.policy.addition_model import chat_splits, demo_policy, held_out_accuracy  # noqa: E402
from trainers.grpo.config import GRPOConfig  # noqa: E402
from trainers.policy.tinylm import load_policy  # noqa: E402

SPEEDUP_GOAL = 3.0
EVAL_SAMPLES = 8
QUICK_EVAL_PROMPTS, QUICK_EVAL_SAMPLES = 64, 4
SHARED = dict(prompts_per_step=8, group_size=8, max_new_tokens=8, temperature=1.0, lr=5e-5, beta=0.0)


def ours_config(steps: int, seed: int) -> GRPOConfig:
    return GRPOConfig(steps=steps, **SHARED, loss_type="dapo", scale_rewards="group", buckets=1,
                      floor_reward=0.0, seed=seed, threads=1)


def trl_config(steps: int, seed: int, output_dir: str, **overrides):
    from trl import GRPOConfig as TRLConfig

    return TRLConfig(**{**dict(
        output_dir=output_dir, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        report_to="none", disable_tqdm=True, log_level="error", logging_steps=1, save_strategy="no",
        per_device_train_batch_size=SHARED["prompts_per_step"] * SHARED["group_size"],
        num_generations=SHARED["group_size"], max_completion_length=SHARED["max_new_tokens"],
        temperature=SHARED["temperature"], top_k=0, top_p=1.0, beta=SHARED["beta"],
        learning_rate=SHARED["lr"], lr_scheduler_type="constant", optim="adamw_torch", weight_decay=0.0,
        max_grad_norm=1.0, loss_type="dapo", scale_rewards="group", max_steps=steps, seed=seed), **overrides})


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


PHASES = ("play", "credit", "update")  # the team trainer's time/* parts of a step


def one_agent_trainer(scenario, model, tokenizer, config: GRPOConfig):
    """marl's trainer on a one-agent scenario, its one agent played by `model` (the run's 'shared' actor)."""
    from trainers.config import resolve_config
    from trainers.policy.actors import ModelActor
    from trainers.team.trainer import MultiAgentTrainer

    (agent,) = scenario.agent_names
    actor = ModelActor("shared", model, tokenizer, trainable=True, temperature=config.temperature,
                       top_p=config.top_p, seed=config.seed)
    return MultiAgentTrainer(scenario, {"shared": actor}, {agent: "shared"}, scenario.split()[0],
                             resolve_config(scenario, grpo=config), log=lambda line: None)


def completion_tokens(trainer) -> float:
    """Completion tokens the trainer's last step sampled."""
    return float(sum(rows.completion_mask.sum().item() for calls in trainer.last_step.batch.generations.values()
                     for rows in calls))


def run_ours(model_dir: Path, splits, steps: int, seed: int, samples: int = EVAL_SAMPLES) -> dict:
    from marl.scenario.load import load_scenario

    ensure_one_thread()
    model, tokenizer = load_policy(model_dir)
    scenario = load_scenario("addition", [f"agents.0.max_tokens={SHARED['max_new_tokens']}"])
    trainer = one_agent_trainer(scenario, model, tokenizer, ours_config(steps, seed))
    wall, metrics = [], []
    for _ in range(steps):
        started = time.perf_counter()
        metrics.append(trainer.step())
        wall.append(time.perf_counter() - started)
    after = held_out_accuracy(model, tokenizer, splits, samples, SHARED["max_new_tokens"])
    phases = {p: step_median([m[f"time/{p}"] for m in metrics]) for p in PHASES}
    return {"trainer": "ours", "seed": seed, "step_seconds": wall, "s_per_step": step_median(wall),
            "phases": phases, "rewards": [m["train/reward"] for m in metrics], "after": after,
            "skipped_spikes": trainer.learners["shared"].skipped_spikes}


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
    phases = {p: statistics.median(r["phases"][p] for r in ours) for p in PHASES}
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
          f"split: play {p['play']:.4f}, credit {p['credit']:.4f}, update {p['update']:.4f}")
    print(f"  TRL:  {t['s_per_step']:.4f} s/step ({1 / t['s_per_step']:.2f} steps/s)")
    print(f"  speed-up (TRL s/step / ours s/step): {summary['speedup']:.2f}x  "
          f"(per round: {', '.join(f'{x:.2f}x' for x in summary['paired_speedups'])})")
    print(f"  mean held-out gain, greedy:  ours {o['gain_greedy']:+.3f}  TRL {t['gain_greedy']:+.3f}")
    print(f"  mean held-out gain, sampled: ours {o['gain_sampled']:+.3f}  TRL {t['gain_sampled']:+.3f}")
    print(f"  speedup >= {SPEEDUP_GOAL:g}x: {yes[summary['goal_speedup']]}")
    print(f"  gain >= TRL's: greedy {yes[summary['goal_gain_greedy']]}, sampled {yes[summary['goal_gain_sampled']]}, "
          f"both {yes[summary['goal_gain_greedy'] and summary['goal_gain_sampled']]}")


# -- the realistic setting: a ~30M Qwen2 with a BPE tokenizer, one subprocess per trainer run ----------

REALISTIC_GOAL = 2.0  # at least 2x TRL's steps per second, with no more peak memory
MiB = 2 ** 20


def bench_cache() -> Path:
    return Path(os.environ.get("MARL_CACHE", Path.home() / ".cache" / "marl")) / "bench"


def realistic_shared(args) -> dict:
    return dict(prompts_per_step=args.prompts_per_step, group_size=8, max_new_tokens=args.new_tokens,
                temperature=1.0, lr=1e-5, beta=0.0)


def realistic_tasks(tokenizer, prompt_tokens: int, count: int = 64):
    from bench.support.real_model import chat_prompts
    from marl.types import Task

    return [Task(id=f"p{i}", prompt=p) for i, p in enumerate(chat_prompts(tokenizer, count, prompt_tokens))]


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class MemoryMeter:
    """Process RSS (and CUDA allocations) after the model is loaded, and their peaks when read."""

    def __init__(self, device: str):
        from bench.support.real_model import current_rss_bytes

        self.cuda = torch.device(device).type == "cuda"
        gc.collect()
        self.base_rss = current_rss_bytes()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base_cuda = torch.cuda.memory_allocated()

    def read(self) -> dict:
        from bench.support.real_model import peak_rss_bytes

        memory = {"peak_rss": peak_rss_bytes(), "base_rss": self.base_rss}
        if self.cuda:
            memory.update(peak_cuda=torch.cuda.max_memory_allocated(), base_cuda=self.base_cuda)
        return memory


def realistic_scenario(tasks, new_tokens: int):
    """A one-agent scenario around the realistic setting's prompts (already ChatML-rendered, so shown as
    they are) and its text reward (bench/support/real_model.py: text_reward_score)."""
    from marl.scenario.load import load_scenario

    return load_scenario({
        "name": "realistic", "agents": [{"name": "writer", "observation": "{prompt}", "max_tokens": new_tokens}],
        "tasks": {"inline": [{"id": task.id, "prompt": task.prompt} for task in tasks]},
        "rewards": {"outcome": [{"kind": "callable", "function": "bench.support.real_model:text_reward_score"}]},
        "chat_template": "none", "observation_max_chars": 1_000_000, "action_max_chars": 1_000_000})


def realistic_ours(args, device: str, dtype: torch.dtype) -> dict:
    model, tokenizer = load_policy(args.model_dir, device=device, dtype=dtype)
    tasks, memory = realistic_tasks(tokenizer, args.prompt_tokens), MemoryMeter(device)
    config = GRPOConfig(steps=args.steps, **realistic_shared(args), loss_type="dapo", scale_rewards="group",
                        buckets=1, floor_reward=0.0, seed=args.seed, threads=args.threads)
    trainer = one_agent_trainer(realistic_scenario(tasks, args.new_tokens), model, tokenizer, config)
    wall, tokens, history = [], [], []
    for _ in range(args.steps):
        started = time.perf_counter()
        history.append(trainer.step())
        sync(device)
        wall.append(time.perf_counter() - started)
        tokens.append(completion_tokens(trainer))
    phases = {p: step_median([m[f"time/{p}"] for m in history]) for p in PHASES}
    return {"trainer": "ours", "step_seconds": wall, "completion_tokens": tokens, "phases": phases, **memory.read()}


def trl_step_timer(device: str):
    """A TrainerCallback timing on_step_begin -> on_step_end and keeping each step's mean completion length."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begin, self.step_seconds, self.lengths = 0.0, [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync(device)
            self.step_seconds.append(time.perf_counter() - self.begin)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.lengths.append(logs["completions/mean_length"])

    return StepTimer()


def realistic_trl(args, device: str, dtype: torch.dtype) -> dict:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer as TRLTrainer

    from bench.support.real_model import text_reward

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype).to(device)
    tasks, memory = realistic_tasks(tokenizer, args.prompt_tokens), MemoryMeter(device)
    dataset = datasets.Dataset.from_dict({"prompt": [t.prompt for t in tasks]})
    shared, timer = realistic_shared(args), trl_step_timer(device)
    output_dir = tempfile.mkdtemp(prefix="grpo_vs_trl_")
    try:
        config = trl_config(args.steps, args.seed, output_dir, **realistic_trl_overrides(shared, device, dtype))
        trainer = TRLTrainer(model=model, reward_funcs=lambda completions, **_: [text_reward(c) for c in completions],
                             args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[timer])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    rows = shared["prompts_per_step"] * shared["group_size"]
    return {"trainer": "trl", "step_seconds": timer.step_seconds,
            "completion_tokens": [length * rows for length in timer.lengths], **memory.read()}


def realistic_trl_overrides(shared: dict, device: str, dtype: torch.dtype) -> dict:
    """What the realistic setting changes in the addition setting's TRL config: batch, lengths, lr, device, dtype."""
    return dict(per_device_train_batch_size=shared["prompts_per_step"] * shared["group_size"],
                   num_generations=shared["group_size"], max_completion_length=shared["max_new_tokens"],
                   learning_rate=shared["lr"], use_cpu=torch.device(device).type == "cpu",
                   bf16=dtype == torch.bfloat16)


def realistic_worker(args) -> int:
    """One trainer run in this process; its result is one `RESULT {json}` line on stdout."""
    import datasets  # noqa: F401 - both workers import the same libraries, so their baselines are alike
    import trl  # noqa: F401

    from trainers.policy.loading import placement

    quiet_trl()
    torch.set_num_threads(args.threads)
    device, dtype = placement(args.device, args.dtype)
    result = (realistic_ours if args.worker == "ours" else realistic_trl)(args, device, dtype)
    print("RESULT " + json.dumps({**result, "seed": args.seed}), flush=True)
    return 0


def spawn_worker(args, side: str, model_dir: Path, seed: int) -> dict:
    """Run one trainer in a fresh interpreter (its own peak RSS) and return its result."""
    import subprocess

    command = [sys.executable, str(Path(__file__).resolve()), "--setting", "realistic", "--worker", side,
               "--model-dir", str(model_dir), "--steps", str(args.steps), "--seed", str(seed),
               "--device", args.device, "--dtype", args.dtype, "--prompts-per-step", str(args.prompts_per_step),
               "--new-tokens", str(args.new_tokens), "--prompt-tokens", str(args.prompt_tokens),
               "--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the {side} worker exited {done.returncode} without a result")
    return json.loads(lines[-1].removeprefix("RESULT "))


def memory_key(runs: list[dict]) -> str:
    return "peak_cuda" if "peak_cuda" in runs[0] else "peak_rss"


def realistic_side(runs: list[dict]) -> dict:
    key = memory_key(runs)
    base_key = key.replace("peak", "base")
    s_per_step = statistics.median(step_median(r["step_seconds"]) for r in runs)
    tokens = statistics.median(statistics.fmean(r["completion_tokens"][1:] or r["completion_tokens"]) for r in runs)
    return {"s_per_step": s_per_step, "tokens_per_s": tokens / s_per_step, "memory": key,
            "peak": max(r[key] for r in runs), "over_base": max(r[key] - r[base_key] for r in runs)}


def print_realistic_run(run: dict) -> None:
    side = realistic_side([run])
    split = ", ".join(f"{p} {s:.3f}" for p, s in run.get("phases", {}).items())
    print(f"  {run['trainer']:<4}  seed {run['seed']:<3}  {side['s_per_step']:.3f} s/step  "
          f"{side['tokens_per_s']:.0f} completion tokens/s  {side['memory']} {side['peak'] / MiB:.0f} MiB "
          f"({side['over_base'] / MiB:+.0f} MiB over the loaded model)" + (f"  split: {split}" if split else ""),
          flush=True)


def print_realistic_summary(ours: dict, trl: dict, rounds: int, steps: int) -> tuple[float, float]:
    speed, memory = trl["s_per_step"] / ours["s_per_step"], ours["peak"] / trl["peak"]
    print(f"\nsummary over {rounds} round(s) of {steps} steps (medians of per-run medians, steps 2..{steps})")
    for name, side in (("ours", ours), ("TRL", trl)):
        print(f"  {name + ':':<5} {side['s_per_step']:.3f} s/step ({1 / side['s_per_step']:.3f} steps/s, "
              f"{side['tokens_per_s']:.0f} completion tokens/s), {side['memory']} {side['peak'] / MiB:.0f} MiB "
              f"({side['over_base'] / MiB:+.0f} MiB over the loaded model)")
    print(f"  steps/s ours / steps/s TRL: {speed:.2f}x  (goal >= {REALISTIC_GOAL:g}x: "
          f"{'yes' if speed >= REALISTIC_GOAL else 'no'})")
    print(f"  peak memory ours / TRL: {memory:.2f}  (over the loaded model: "
          f"{ours['over_base'] / max(trl['over_base'], 1):.2f}; goal <= 1: {'yes' if memory <= 1 else 'no'})")
    return speed, memory


def realistic_main(args) -> int:
    from bench.support.real_model import build_model_dir, parameter_count
    from trainers.policy.loading import placement

    device, dtype = placement(args.device, args.dtype)
    model_dir = args.model_dir or build_model_dir(args.size, bench_cache() / f"qwen2-{args.size}-seed0")
    print(f"realistic setting: Qwen2 {args.size} ({parameter_count(model_dir) / 1e6:.1f}M parameters, random init, "
          f"local byte-level BPE, ChatML prompts of {args.prompt_tokens} tokens) on {device} in {dtype}")
    print(f"settings: {realistic_shared(args)}, DAPO loss, group-scaled advantages, AdamW, grad clip 1.0, "
          f"{args.threads} torch thread(s), no gradient checkpointing; one fresh process per run")
    runs = {"ours": [], "trl": []}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds} (seed {args.seed + r})", flush=True)
        for side in ("ours", "trl"):
            runs[side].append(spawn_worker(args, side, model_dir, args.seed + r))
            print_realistic_run(runs[side][-1])
    ours, trl = realistic_side(runs["ours"]), realistic_side(runs["trl"])
    speed, memory = print_realistic_summary(ours, trl, args.rounds, args.steps)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
                                         "ours": ours, "trl": trl, "speedup": speed, "memory_ratio": memory}, indent=2))
    print(f"ratio: {speed:.2f} (steps/s ours / steps/s TRL; peak memory ours / TRL {memory:.2f}; "
          f"anchor: TRL's GRPOTrainer on the same model and settings, run in this run)")
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=("addition", "realistic"), default="addition",
                        help="addition: the tiny demo model (default); realistic: a ~30M Qwen2 with a BPE tokenizer")
    parser.add_argument("--rounds", type=int, default=None, help="A/B rounds (each runs ours, then TRL; "
                        "default 3 for addition, 1 for realistic)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 30 for "
                        "addition, 5 for realistic)")
    parser.add_argument("--seed", type=int, default=0, help="round r uses seed SEED + r for both trainers")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 round of 5 steps (realistic: the "
                        "tiny size, 16 new tokens, 3 steps)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    realistic = parser.add_argument_group("realistic setting")
    realistic.add_argument("--size", choices=("tiny", "30m", "0.5b"), default="30m", help="model size")
    realistic.add_argument("--device", default="auto", help="auto, cpu or cuda (both trainers)")
    realistic.add_argument("--dtype", default="auto", help="auto, float32 or bfloat16 (both trainers)")
    realistic.add_argument("--prompts-per-step", type=int, default=2, help="prompts per step (x G = 8 rows)")
    realistic.add_argument("--new-tokens", type=int, default=64, help="max new tokens per completion")
    realistic.add_argument("--prompt-tokens", type=int, default=100, help="tokens per prompt")
    realistic.add_argument("--threads", type=int, default=1, help="torch threads in each worker")
    realistic.add_argument("--worker", choices=("ours", "trl"), default=None, help=argparse.SUPPRESS)
    realistic.add_argument("--model-dir", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.setting == "realistic":
        args.rounds, args.steps = args.rounds or 1, args.steps or 5
        if args.quick:
            args.rounds, args.steps, args.size, args.new_tokens = 1, 3, "tiny", 16
    else:
        args.rounds, args.steps = args.rounds or 3, args.steps or 30
        if args.quick:
            args.rounds, args.steps = 1, 5
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return realistic_worker(args)
    if args.setting == "realistic":
        return realistic_main(args)
    torch.set_num_threads(1)
    quiet_trl()
    splits = addition_splits(seed=0)
    model_dir = demo_policy(splits)  # the tiny model is warmed up on the full splits, cached on disk
    samples = QUICK_EVAL_SAMPLES if args.quick else EVAL_SAMPLES
    if args.quick:
        splits = replace(splits, eval=splits.eval[:QUICK_EVAL_PROMPTS])
    model, tokenizer = load_policy(model_dir)
    splits = chat_splits(splits, tokenizer)  # chat turns, as it was warmed up: one string each for both
    before = held_out_accuracy(model, tokenizer, splits, samples, SHARED["max_new_tokens"])
    del model
    print(f"settings: {SHARED}, DAPO loss, group-scaled advantages, AdamW, grad clip 1.0, 1 torch thread")
    print(f"  ours: buckets=1 (uniform prompts), floor_reward=0.0, other GRPOConfig defaults: "
          f"{ {k: v for k, v in ours_config(args.steps, args.seed).model_dump().items() if k not in SHARED} }")
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
