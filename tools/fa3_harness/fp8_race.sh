#!/usr/bin/env bash
# Builds tools/fa3_harness/fp8_race (each candidate of fp8_race_candidates.inc in its own object, in parallel; ptxas -v
# of each into out/fp8_race/ptxas_<name>.txt, failing on a spill) and runs it: fp8_race.sh [N,N,...]
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
OUT=out/fp8_race
mkdir -p "$OUT"
FLAGS=(-O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I src -DFLASHLAB_HAVE_CUDA)
pids=()
objs=()
while read -r name d poly own; do
  "$NVCC" "${FLAGS[@]}" -Xptxas -v -DRACE_NAME="$name" -DRACE_D="$d" -DRACE_POLY="$poly" -DRACE_OWN_O="$own" \
    -c tools/fa3_harness/fp8_race_kernels.cu -o "$OUT/$name.o" >"$OUT/ptxas_$name.txt" 2>&1 &
  pids+=($!)
  objs+=("$OUT/$name.o")
done < <(sed -n 's/^RACE_CANDIDATE(\([a-z0-9_]*\), *\([0-9]*\), *\([0-9]*\), *\([a-z]*\),.*/\1 \2 \3 \4/p' \
           tools/fa3_harness/fp8_race_candidates.inc)
for src in src/cuda/fa3_ws/forward.cu src/cuda/fa3_ws/forward_e4m3.cu src/cuda/fa3_ws/fp8_transpose_v.cu; do
  "$NVCC" "${FLAGS[@]}" -c "$src" -o "$OUT/$(basename "$src" .cu).o" &
  pids+=($!)
  objs+=("$OUT/$(basename "$src" .cu).o")
done
"$NVCC" "${FLAGS[@]}" -I tools/fa3_harness -c tools/fa3_harness/fp8_race.cu -o "$OUT/fp8_race_main.o"
for pid in "${pids[@]}"; do wait "$pid" || { cat "$OUT"/ptxas_*.txt | grep -i error; exit 1; }; done
spills=$(grep -h "spill stores" "$OUT"/ptxas_*.txt | grep -v " 0 bytes spill stores" || true)
[ -z "$spills" ] || { echo "a candidate spills:"; grep -H "spill stores" "$OUT"/ptxas_*.txt | grep -v " 0 bytes spill"; exit 1; }
"$NVCC" "${FLAGS[@]}" "$OUT/fp8_race_main.o" "${objs[@]}" -o "$OUT/fp8_race"
[ "${RACE_BUILD_ONLY:-0}" = 1 ] || "$OUT/fp8_race" "$@"
