"""Seconds per step of relay with Shapley credit: the local backend against 1 and 2 Ray rollout workers.

Run from a checkout: `python bench/ray_scaling.py` (5 timed steps per condition after one untimed
step, relay's own settings: 8 prompts x 8 episodes, 6 coalitions replayed per episode), or `--quick`
(1 timed step of 2 prompts x 2, for tests/integration/test_benchmarks.py). Needs the ray extra
(`pip install -e '.[ray]'`); without it the last line says so.

Each condition trains the same run (same seed, max_staleness 0): the Ray backend plays the same
episodes as the local one, so the conditions differ only in where play and replays happen. A step's
time is split as the trainer logs it: play (the main episodes, with the weight broadcast), replays
(`time/credit`: the counterfactual replays and the credit), update (the GRPO update, always on the
driver), and of play the broadcast (`RayPlayer.timing`).

A small model of a step on N workers, fitted here: t(N) = W / N + c + u + b, with W the local
backend's play + replay seconds (the work that spreads), u the update, b the broadcast, and c the
per-step overhead of dispatching to workers, fitted as the mean of what the measured Ray conditions
leave unexplained. On this 2-core box the workers share the cores with the driver, so W / N cannot
shrink past the cores; on a cluster N counts real machines.

The last line, `ratio: ...`, is the 2-worker Ray backend's seconds per step over the local
backend's (the anchor, measured in this run).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def settings(backend: str, workers: int, args) -> list[str]:
    """--set overrides of one condition."""
    base = ["train.seed=0", "train.threads=1", "credit.method=shapley", f"train.backend={backend}",
            f"train.ray.rollout_workers={workers}", f"train.ray.num_cpus={args.cpus_per_worker}"]
    if args.quick:
        base += ["train.prompts_per_step=2", "train.group_size=2"]
    return base


def measure(backend: str, workers: int, args) -> dict:
    """Mean seconds per step and their split, over args.steps steps after one untimed step."""
    from trainers.run import RunOptions, prepare

    _, _, _, trainer, _ = prepare(RunOptions("relay", settings(backend, workers, args)), log=lambda message: None)
    try:
        trainer.step()  # untimed: first broadcast, caches
        player = trainer.player
        broadcast_before = getattr(player, "timing", {}).get("broadcast", 0.0)
        rows = [trainer.step() for _ in range(args.steps)]
        broadcast = (getattr(player, "timing", {}).get("broadcast", 0.0) - broadcast_before) / args.steps
    finally:
        close = getattr(trainer.player, "close", None)
        if close is not None:
            close()
    mean = {key: statistics.fmean(row[f"time/{key}"] for row in rows) for key in ("step", "play", "credit", "update")}
    return {**mean, "broadcast": broadcast}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per condition (default 5)")
    parser.add_argument("--workers", default="1,2", help="Ray worker counts, comma-separated (default 1,2)")
    parser.add_argument("--cpus-per-worker", type=float, default=0.5,
                        help="train.ray.num_cpus (default 0.5: two workers fit beside the driver on 2 cores)")
    parser.add_argument("--quick", action="store_true", help="1 timed step of 2 prompts x 2, 2 Ray workers only")
    args = parser.parse_args()
    if args.quick:  # one Ray condition (the ratio's): each condition is a cluster's worth of start-up
        args.steps, args.workers = 1, "2"
    sys.path.insert(0, str(ROOT))
    if importlib.util.find_spec("ray") is None:
        print("ratio: skipped (ray is not installed: pip install -e '.[ray]'; anchor: the local backend)")
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    from support.runtime import one_quiet_thread
    from marl.scenario.spec import RaySpec
    from trainers.ray.cluster import connect, shutdown

    one_quiet_thread()
    counts = [int(n) for n in args.workers.split(",")]
    print(f"relay, Shapley credit; {args.steps} timed step(s) per condition"
          f"{' (quick: 2 prompts x 2)' if args.quick else ' (8 prompts x 8)'}; Ray workers x {args.cpus_per_worker:g} CPU")
    results = {"local": measure("local", 1, args)}
    connect(RaySpec(), log=print)
    try:
        for n in counts:
            results[f"ray x{n}"] = measure("ray", n, args)
    finally:
        shutdown()
    print(f"{'backend':<10} {'s/step':>8} {'play':>8} {'replays':>8} {'update':>8} {'broadcast':>10}")
    for name, r in results.items():
        print(f"{name:<10} {r['step']:8.3f} {r['play'] - r['broadcast']:8.3f} {r['credit']:8.3f} {r['update']:8.3f} "
              f"{r['broadcast']:10.4f}")
    local = results["local"]
    work = local["play"] + local["credit"]
    overheads = [results[f"ray x{n}"]["step"] - (work / n + local["update"] + results[f"ray x{n}"]["broadcast"])
                 for n in counts]
    overhead = statistics.fmean(overheads)
    broadcast = statistics.fmean(results[f"ray x{n}"]["broadcast"] for n in counts)
    print(f"model: t(N) = {work:.3f} / N + {overhead:.3f} + {local['update']:.3f} + {broadcast:.4f} s "
          "(play and replays spread over N workers; dispatch overhead; update; broadcast)")
    for n in (1, 2, 4, 8, 16):
        print(f"  predicted N={n:<2} {work / n + overhead + local['update'] + broadcast:7.3f} s/step")
    last = f"ray x{counts[-1]}"
    print(f"ratio: {results[last]['step'] / local['step']:.2f} ({last} seconds per step / the local backend's; "
          "anchor: the local backend, measured in this run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
