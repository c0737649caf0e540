#!/usr/bin/env bash
# On the lent GPU machine, after scripts/device_build.sh: FlashLab inside PyTorch training, beside SDPA in the same
# run: a flashlab.torch call's host and GPU time (scripts/torch_overhead.py), and a 4-layer Llama's training step with
# transformers' "sdpa" and with flashlab.hf's backend, eager and under torch.compile (scripts/llama_step_bench.py).
# Writes its files into OUT (default $OUT), named as bench/results/ keeps them.
#   device run: bash scripts/device_build.sh flashlab_python flashlab_torch_ops && \
#               bash scripts/bench_pytorch_training.sh "$OUT" [PART...]                    (carry .deps)
# PARTs (default: all of them). Compiling both Llama models once per sequence length makes all of them together run
# longer than one device call may: name the parts of each call.
#   overhead       torch_overhead.py at the FA2 paper's setting (d = 128), and at the Llama's attention (batch 1, 16
#                  query heads on 4 K/V heads) at d = 64 and 128: <gpu>-torch-overhead[-gqa-dD]_<date>.json
#   eager          the Llama step, eager, d = 64 and 128: <gpu>-llama-step-eager_<date>.json
#   compiled-64    the Llama step under torch.compile at d = 64: <gpu>-llama-step-compiled-d64_<date>.json
#   compiled-128   the same at d = 128
set -euo pipefail
out=${1:-${OUT:?name a folder}}
shift || true
parts=("$@")
((${#parts[@]})) || parts=(overhead eager compiled-64 compiled-128)
mkdir -p "$out"
source scripts/python_path.sh build-device >/dev/null
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
date=$(date -u +%Y-%m-%d)
for part in "${parts[@]}"; do
  case $part in
    overhead)
      python3 scripts/torch_overhead.py --json "$out/$gpu-torch-overhead_$date.json" | tail -4
      for d in 64 128; do
        python3 scripts/torch_overhead.py --batch 1 --heads 16 --kv-heads 4 --seqs 2048,4096,16384 --head-dim "$d" \
          --json "$out/$gpu-torch-overhead-gqa-d${d}_$date.json" | tail -6
      done ;;
    eager)
      python3 scripts/llama_step_bench.py --no-compile --iters "${ITERS:-20}" \
        --json "$out/$gpu-llama-step-eager_$date.json" | tail -8 ;;
    compiled-64 | compiled-128)
      d=${part#compiled-}
      python3 scripts/llama_step_bench.py --compile --head-dims "$d" --iters "${ITERS:-20}" \
        --json "$out/$gpu-llama-step-compiled-d${d}_$date.json" | tail -4 ;;
    *) echo "bench_pytorch_training.sh: unknown part '$part': the parts are overhead, eager, compiled-64, compiled-128" >&2
       exit 2 ;;
  esac
done
