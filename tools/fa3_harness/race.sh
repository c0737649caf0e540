#!/usr/bin/env bash
# Builds tools/fa3_harness/race (each candidate of race_candidates.inc in its own object, in parallel; ptxas -v of each
# into out/race/ptxas_<name>.txt, failing on a spill) and runs it: race.sh [N,N,...] (default 4096,8192,16384).
# RACE_BUILD_ONLY=1 stops after the link. RACE_ONLY=REGEX builds and races only the candidates whose names match it
# (grep -E), e.g. RACE_ONLY=fp8 for the FP8 ones.
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
OUT=out/race
mkdir -p "$OUT"
FLAGS=(-O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I src -DFLASHLAB_HAVE_CUDA)
pids=()
objs=()
# The candidates race.cu is built with (it includes race_selected.inc from $OUT): the lines of race_candidates.inc
# whose names match RACE_ONLY.
: >"$OUT/race_selected.inc"
while IFS= read -r line; do
  name=$(sed 's/^RACE_CANDIDATE(\([a-z0-9_]*\),.*/\1/' <<<"$line")
  if grep -Eq -- "${RACE_ONLY:-.}" <<<"$name"; then echo "$line" >>"$OUT/race_selected.inc"; fi
done < <(grep '^RACE_CANDIDATE(' tools/fa3_harness/race_candidates.inc)
[ -s "$OUT/race_selected.inc" ] || { echo "race.sh: no candidate's name matches RACE_ONLY=${RACE_ONLY:-}"; exit 1; }
rm -f "$OUT"/ptxas_*.txt
# The columns of each candidate (race_candidates.inc): its first eleven arguments, split at the commas (the twelfth,
# the description, may hold commas of its own and is not needed here).
while read -r name type d wide poly own lazy vt_smem trees split_s consumers; do
  # The wide column is true, false, or a number of keys per K/V block (16-bit candidates: Schedule::kBlockKeys).
  bc=0; if [[ $wide =~ ^[0-9]+$ ]]; then bc=$wide; wide=true; fi
  "$NVCC" "${FLAGS[@]}" -Xptxas -v -DRACE_NAME="$name" -DRACE_T="$type" -DRACE_D="$d" -DRACE_WIDE="$wide" -DRACE_BC="$bc" \
    -DRACE_POLY="$poly" -DRACE_OWN_O="$own" -DRACE_LAZY="$lazy" -DRACE_VT_SMEM="$vt_smem" -DRACE_TREES="$trees" \
    -DRACE_SPLIT_S="$split_s" -DRACE_CONSUMERS="$consumers" -c tools/fa3_harness/race_kernels.cu -o "$OUT/$name.o" >"$OUT/ptxas_$name.txt" 2>&1 &
  pids+=($!)
  objs+=("$OUT/$name.o")
done < <(sed -n 's/^RACE_CANDIDATE(\(.*\)$/\1/p' "$OUT/race_selected.inc" |
           awk -F, '{ line = ""; for (i = 1; i <= 11; ++i) { gsub(/^ +| +$/, "", $i); line = line (i > 1 ? " " : "") $i }; print line }')
for src in src/cuda/fa3_ws/forward.cu src/cuda/fa3_ws/forward_e4m3.cu src/cuda/fa3_ws/fp8_transpose_v.cu; do
  "$NVCC" "${FLAGS[@]}" -c "$src" -o "$OUT/$(basename "$src" .cu).o" &
  pids+=($!)
  objs+=("$OUT/$(basename "$src" .cu).o")
done
"$NVCC" "${FLAGS[@]}" -I "$OUT" -c tools/fa3_harness/race.cu -o "$OUT/race_main.o"
for pid in "${pids[@]}"; do wait "$pid" || { grep -i -B2 -A4 error "$OUT"/ptxas_*.txt | head -40; exit 1; }; done
spills=$(grep -h "spill stores" "$OUT"/ptxas_*.txt | grep -v " 0 bytes spill stores" || true)
[ -z "$spills" ] || { echo "a candidate spills:"; grep -H "spill stores" "$OUT"/ptxas_*.txt | grep -v " 0 bytes spill"; exit 1; }
"$NVCC" "${FLAGS[@]}" "$OUT/race_main.o" "${objs[@]}" -o "$OUT/race"
[ "${RACE_BUILD_ONLY:-0}" = 1 ] || "$OUT/race" "$@"
