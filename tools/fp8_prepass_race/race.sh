#!/usr/bin/env bash
# Builds tools/fp8_prepass_race/race.cu against src/cuda/fp8_quantize.cu once per value of kRotateValuesPerLane
# (16, 32: a copy of the file with the constant changed, in out/prepass_race/) and runs each, on the GPU machine,
# failing when two choices wrote different bytes (race.cu's hash of the rotated output).
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
OUT=out/prepass_race
mkdir -p "$OUT"
FLAGS=(-O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I src -DFLASHLAB_HAVE_CUDA)
pids=()
for v in 16 32; do
  sed "s/constexpr int kRotateValuesPerLane = [0-9]*;/constexpr int kRotateValuesPerLane = $v;/" src/cuda/fp8_quantize.cu \
    >"$OUT/fp8_quantize_$v.cu"
  grep -q "kRotateValuesPerLane = $v;" "$OUT/fp8_quantize_$v.cu"
  "$NVCC" "${FLAGS[@]}" -Xptxas -v "$OUT/fp8_quantize_$v.cu" tools/fp8_prepass_race/race.cu src/core/problem.cpp \
    -o "$OUT/race_$v" >"$OUT/ptxas_$v.txt" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || { tail -20 "$OUT"/ptxas_*.txt; exit 1; }; done
for v in 16 32; do echo "== kRotateValuesPerLane = $v"; "$OUT/race_$v" | tee "$OUT/times_$v.txt"; done
for v in 32; do
  diff <(grep '^bytes' "$OUT/times_16.txt") <(grep '^bytes' "$OUT/times_$v.txt") >/dev/null ||
    { echo "FAILED: kRotateValuesPerLane = $v wrote other bytes than 16"; exit 1; }
done
echo "every choice wrote the same bytes"
