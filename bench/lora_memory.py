"""Benchmark the memory of three `own` agents with LoRA adapters against the same agents as full copies.

Run from a checkout: `python bench/lora_memory.py` (the ~30M Qwen2 of bench/support/real_model.py, 3 team
steps per mode, a few minutes on a small CPU), or `--quick` (the tiny Qwen2, 1 step per mode, seconds plus
two interpreter starts; for tests/integration/test_benchmarks.py). `--json PATH` also writes the numbers.

The scenario is relay with all three agents `policy: own` (no warm-up, beta 0, G = 8, 2 prompts per
step; each reward gets a bonus of its episode seed's parity, so groups differ and every step updates
every learner) on a randomly initialised Qwen2 with a byte-level BPE tokenizer. Two modes, each in a fresh
interpreter so the kernel's peak RSS (`resource.getrusage`) is that mode's alone:
- full (the anchor): `own` deep-copies the base, one AdamW per copy;
- lora: `train.lora.r=16` (alpha 32, all linear layers): one frozen base, one adapter per agent.
Measured per mode after the steps: model bytes (every distinct parameter tensor of every actor, so one
shared base counts once), trainable bytes, optimizer state bytes, and the process's peak RSS and its
rise over the RSS after imports (before the base model is loaded). The last line, `ratio: ...`, is the
full mode's parameter + optimizer bytes over LoRA's (how many times smaller LoRA's state is).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 2 ** 20
OWN_AGENTS = ["agents.0.policy=own", "agents.1.policy=own", "agents.2.policy=own"]


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct tensors given (a tensor shared by several actors counts once)."""
    seen = {}
    for tensor in tensors:
        seen.setdefault((tensor.data_ptr(), tensor.numel()), tensor.numel() * tensor.element_size())
    return sum(seen.values())


def actor_tensors(actor) -> list:
    """Every parameter tensor an actor's model reaches (the whole peft model for an adapter policy)."""
    model = actor.model
    whole = getattr(model, "peft_model", model)
    return [p.data for p in whole.parameters()]


def optimizer_bytes(trainer) -> int:
    return tensor_bytes(t for learner in trainer.learners.values() for state in learner.optimizer.state.values()
                        for t in state.values() if hasattr(t, "data_ptr") and t.dim() > 0)


def build_trainer(model_dir: Path, mode: str, seed: int = 0):
    from marl.scenario.load import load_scenario
    from trainers.grpo.config import GRPOConfig
    from trainers.policy.actors import build_actors
    from trainers.config import resolve_config
    from trainers.team.trainer import MultiAgentTrainer

    overrides = OWN_AGENTS + ["tasks.count=40", "tasks.eval_count=4", "credit.absent=null_message",
                              "train.threads=1", f"train.model={model_dir}"]
    if mode == "lora":
        overrides.append("train.lora.r=16")
    scenario = load_scenario("relay", overrides)
    actors, seats = build_actors(scenario, model_dir, seed=seed, lora=scenario.spec.train.lora)
    config = GRPOConfig(steps=3, prompts_per_step=2, group_size=8, max_new_tokens=4, lr=1e-5, beta=0.0, seed=seed,
                        floor_reward=0.0, threads=1)
    return MultiAgentTrainer(scenario, actors, seats, scenario.split()[0], resolve_config(scenario, grpo=config), log=lambda message: None)


def worker(model_dir: Path, mode: str, steps: int) -> dict:
    """One mode in this process: build the team, run `steps` steps, read the memory."""
    import torch  # noqa: F401 - imported before the baseline, like every library the run needs
    import peft  # noqa: F401
    import transformers  # noqa: F401

    from bench.support.real_model import current_rss_bytes, peak_rss_bytes
    from trainers.team.trainer import StepPlan

    base_rss = current_rss_bytes()
    trainer = build_trainer(model_dir, mode)
    for _ in range(steps):  # a random model earns equal rewards: a seed-parity bonus makes every step train
        trainer.step(StepPlan(reward_transform=lambda episode, agent, reward: reward + episode.job.seed % 2))
    tensors = [t for actor in trainer.actors.values() if getattr(actor, "model", None) is not None
               for t in actor_tensors(actor)]
    trainable = tensor_bytes(p.data for learner in trainer.learners.values() for p in learner.model.parameters())
    return {"mode": mode, "learners": len(trainer.learners), "model_bytes": tensor_bytes(tensors),
            "trainable_bytes": trainable, "optimizer_bytes": optimizer_bytes(trainer),
            "peak_rss": peak_rss_bytes(), "base_rss": base_rss}


def spawn(model_dir: Path, mode: str, steps: int) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--model-dir", str(model_dir),
               "--steps", str(steps)]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the {mode} worker exited {done.returncode} without a result")
    return json.loads(lines[-1].removeprefix("RESULT "))


def print_mode(result: dict) -> None:
    state = result["model_bytes"] + result["optimizer_bytes"]
    print(f"  {result['mode']:<4}  {result['learners']} learners  models {result['model_bytes'] / MiB:7.1f} MiB  "
          f"trainable {result['trainable_bytes'] / MiB:7.2f} MiB  optimizer {result['optimizer_bytes'] / MiB:7.2f} MiB  "
          f"params+optimizer {state / MiB:7.1f} MiB  peak RSS {result['peak_rss'] / MiB:6.0f} MiB "
          f"({(result['peak_rss'] - result['base_rss']) / MiB:+.0f} MiB over imports)", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("tiny", "30m", "0.5b"), default="30m", help="Qwen2 size")
    parser.add_argument("--steps", type=int, default=3, help="team steps per mode")
    parser.add_argument("--quick", action="store_true", help="smoke test: the tiny size, 1 step per mode")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--worker", choices=("full", "lora"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.steps = "tiny", 1
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args.model_dir, args.worker, args.steps)), flush=True)
        return 0
    from bench.support.real_model import build_model_dir, parameter_count

    cache = Path(os.environ.get("MARL_CACHE", Path.home() / ".cache" / "marl")) / "bench"
    model_dir = build_model_dir(args.size, cache / f"qwen2-{args.size}-seed0")
    print(f"relay, three `own` agents, on Qwen2 {args.size} ({parameter_count(model_dir) / 1e6:.1f}M parameters, "
          f"float32, cpu); {args.steps} team step(s) per mode, one fresh process per mode")
    full, lora = spawn(model_dir, "full", args.steps), spawn(model_dir, "lora", args.steps)
    print_mode(full), print_mode(lora)
    state = {r["mode"]: r["model_bytes"] + r["optimizer_bytes"] for r in (full, lora)}
    rise = {r["mode"]: r["peak_rss"] - r["base_rss"] for r in (full, lora)}
    print(f"  LoRA / full: params+optimizer {state['lora'] / state['full']:.3f}, peak RSS "
          f"{lora['peak_rss'] / full['peak_rss']:.3f}, peak RSS over imports {rise['lora'] / max(rise['full'], 1):.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"size": args.size, "steps": args.steps, "full": full, "lora": lora}, indent=2))
    print(f"ratio: {state['full'] / state['lora']:.2f} (params+optimizer bytes, full copies / LoRA; peak RSS "
          f"LoRA / full {lora['peak_rss'] / full['peak_rss']:.2f}; anchor: the three agents as full copies, in this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
