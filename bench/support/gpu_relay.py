"""The relay part of bench/gpu_check.sh: `marl run relay` on a model directory (CUDA, bfloat16, LoRA r = 16,
left and right `own` roles: two adapters of their own, sampled in one mixed-adapter batch, and final's shared
one), run in this process so that torch.cuda.max_memory_allocated covers the whole run, then its figures.

    python bench/support/gpu_relay.py MODEL_DIR RUN_DIR [STEPS [DEVICE DTYPE [ENGINE_URL]]]   (default 5 cuda
                            bfloat16 in-process; cpu float32 only to try the script without a GPU; ENGINE_URL:
                            generate through the HTTP engine against that server, `marl serve --enable-lora`)

Prints seconds per step (median over steps 2..N of the run's own `time/step`), agent turns per second
(prompts_per_step x G x 3 agents per step, credit episodes not counted) and generated tokens per
second as an upper bound (each turn at most the agents' max_tokens, 4 in relay), and peak CUDA memory.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PROMPTS, GROUP, AGENTS, MAX_TOKENS = 8, 8, 3, 4  # relay's defaults: prompts_per_step, group_size, agents, max_tokens


def relay_argv(model_dir: Path, run_dir: Path, steps: int, device: str, dtype: str, engine: str | None = None) -> list[str]:
    overrides = [f"train.model={model_dir}", f"train.device={device}", f"train.dtype={dtype}", "train.lora.r=16",
                 f"train.steps={steps}", "train.stages=[main]", "tasks.count=64", "tasks.eval_count=8",
                 "agents.0.policy=own", "agents.1.policy=own"]
    if engine:
        overrides += ["train.engine.kind=http", f"train.engine.url={engine}"]
    return ["run", "relay", *[part for o in overrides for part in ("--set", o)], "--tracker", "none",
            "--out", str(run_dir)]


def main(argv: list[str]) -> int:
    import torch

    from trainers.cli.main import main as marl

    model_dir, run_dir = Path(argv[0]).resolve(), Path(argv[1]).resolve()
    steps = int(argv[2]) if len(argv) > 2 else 5
    device, dtype = (argv[3], argv[4]) if len(argv) > 4 else ("cuda", "bfloat16")
    engine = argv[5] if len(argv) > 5 else None
    cuda = device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    code = marl(relay_argv(model_dir, run_dir, steps, device, dtype, engine))
    if code != 0:
        print(f"relay: marl run exited {code}")
        return code
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = [r["time/step"] for r in rows if "time/step" in r]
    s_per_step = statistics.median(times[1:] if len(times) > 1 else times)
    turns = PROMPTS * GROUP * AGENTS / s_per_step
    from bench.support.real_model import peak_rss_bytes

    memory = (f"peak CUDA memory {torch.cuda.max_memory_allocated() / 2 ** 30:.2f} GiB, " if cuda else "")
    where = f"HTTP engine at {engine}" if engine else "in-process engine"
    print(f"relay (marl run, LoRA r=16 x 3 roles, {dtype}, {device}, {where}): {len(times)} steps, {s_per_step:.3f} s/step, "
          f"{turns:.0f} agent turns/s, <= {turns * MAX_TOKENS:.0f} generated tokens/s, {memory}"
          f"peak RSS {peak_rss_bytes() / 2 ** 30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
