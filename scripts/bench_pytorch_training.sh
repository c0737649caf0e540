#!/usr/bin/env bash
# On the lent GPU machine, after scripts/device_build.sh: FlashLab inside PyTorch training, beside SDPA in the same
# run: a flashlab.torch call's host time (scripts/torch_overhead.py), and a 4-layer Llama's training step with
# transformers' "sdpa" and with flashlab.hf's backend, eager and under torch.compile (scripts/llama_step_bench.py).
# Writes <gpu>-torch-overhead_<date>.json and <gpu>-llama-step-{eager,compiled}_<date>.json into $1 (default $OUT),
# named as bench/results/ keeps them.
#   device run: bash scripts/device_build.sh && bash scripts/bench_pytorch_training.sh "$OUT"     (carry .deps)
set -euo pipefail
out=${1:-${OUT:?name a folder}}
mkdir -p "$out"
source scripts/python_path.sh build-device >/dev/null
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
date=$(date -u +%Y-%m-%d)
python3 scripts/torch_overhead.py --json "$out/$gpu-torch-overhead_$date.json" | tail -4
python3 scripts/llama_step_bench.py --no-compile --iters "${ITERS:-20}" --json "$out/$gpu-llama-step-eager_$date.json" |
  tail -8
python3 scripts/llama_step_bench.py --compile --iters "${ITERS:-20}" --json "$out/$gpu-llama-step-compiled_$date.json" |
  tail -8
