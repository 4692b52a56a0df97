#!/usr/bin/env bash
# GPU check: a 0.5B-size randomly initialised Qwen2 (Qwen2.5-0.5B's shape: 24 layers, hidden 896, vocabulary
# 151936; bench/support/real_model.py, local byte-level BPE tokenizer) on one CUDA device in bfloat16:
#   1. `marl run relay` with LoRA (r = 16; left and right `own`: two roles in one mixed-adapter batch) for a few
#      steps (train.stages=[main]: no warm-up), on the in-process engine, printing s/step, agent turns/s, an upper
#      bound on generated tokens/s, and peak CUDA memory; then the same run generating through the HTTP engine
#      against `marl serve --enable-lora` on the same GPU (its adapters published by version each step);
#   2. bench/grpo_vs_trl.py --setting realistic on the same model: marl's training step (the one trainer) against TRL 1.16's
#      (full fine-tuning, 8 prompts x G = 8, 100-token prompts, 64 new tokens), printing s/step,
#      completion tokens/s and peak CUDA memory (torch.cuda.max_memory_allocated) of both, and the ratio.
# Where torch sees no CUDA device it prints one line saying so and exits 0 (nothing depends on a GPU).
# Sized to finish in well under 8 minutes on one H200; each part has its own timeout.
# Usage: bench/gpu_check.sh [WORK_DIR]   (default: a fresh temporary directory; PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA device (torch.cuda.is_available() is false); nothing to check, exiting 0"
  exit 0
fi
WORK=${1:-$(mktemp -d)}
mkdir -p "$WORK"
"$PY" -c "import torch; print('gpu_check on', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
MODEL=$(timeout 180 "$PY" -c "import sys; sys.path.insert(0, '.'); from bench.support.real_model import build_model_dir
print(build_model_dir('0.5b', sys.argv[1]))" "$WORK/qwen2-0.5b")
echo "model: $MODEL"
status=0
timeout 180 "$PY" bench/support/gpu_relay.py "$MODEL" "$WORK/relay-run" 5 || { echo "relay part failed ($?)"; status=1; }
PORT=${MARL_GPU_CHECK_PORT:-8765}
"$PY" -m trainers.cli.main serve "$MODEL" --enable-lora --device cuda --dtype bfloat16 --port "$PORT" \
  > "$WORK/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 120); do grep -q "^serving" "$WORK/serve.log" 2>/dev/null && break; sleep 1; done
timeout 180 "$PY" bench/support/gpu_relay.py "$MODEL" "$WORK/relay-http" 5 cuda bfloat16 "http://127.0.0.1:$PORT/v1" \
  || { echo "relay through marl serve failed ($?); server log: $(tail -3 "$WORK/serve.log")"; status=1; }
kill "$SERVER" 2>/dev/null || true
timeout 240 "$PY" bench/grpo_vs_trl.py --setting realistic --size 0.5b --model-dir "$MODEL" --device cuda \
  --dtype bfloat16 --prompts-per-step 8 --steps 4 --threads 4 --json "$WORK/grpo_vs_trl_0.5b.json" \
  || { echo "TRL comparison failed ($?)"; status=1; }
exit $status
