#!/usr/bin/env bash
# Quick ptxas -v of ONE fa3_ws_kernel instantiation (seconds instead of the full build's minutes), for
# iterating on registers / spills / C7513 without a GPU.
# Usage: tools/fa3_harness/one_kernel.sh T D STEP DROPOUT   e.g.  one_kernel.sh __nv_bfloat16 256 5 false
# Env: TL=true (the timeline instantiation), SCHED=TYPE (default ShippedSchedule<false>; e.g. "Schedule<true, false, false, false>").
# Writes out/fa3/one/<name>.ptxas.txt (and .ptx with KEEP_PTX=1); prints regs / spills / C7513 lines.
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
T=$1 D=$2 STEP=$3 DROP=$4
OUT=out/fa3/one
mkdir -p "$OUT"
TL=${TL:-false}
SCHED=${SCHED:-ShippedSchedule<false>}
name="${T//_/}_d${D}_s${STEP}_${DROP}_tl${TL}_$(echo "$SCHED" | tr -cd 'a-zA-Z0-9')${TAG:-}"
src="$OUT/$name.cu"
cat >"$src" <<CU
#include "cuda/fa3_ws/forward_kernel.cuh"
namespace flashlab::cuda::fa3_ws {
template __global__ void fa3_ws_kernel<$T, $D, $STEP, $DROP, $TL, $SCHED>(const __grid_constant__ Params, const __grid_constant__ TmaMaps, int);
}
CU
extra=()
[ "${KEEP_PTX:-0}" = 1 ] && extra=(-keep -keep-dir "$OUT")
"$NVCC" -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I src -I . -Xptxas -v \
  "${extra[@]}" ${EXTRA:-} -c "$src" -o "$OUT/$name.o" >"$OUT/$name.ptxas.txt" 2>&1 || { cat "$OUT/$name.ptxas.txt"; exit 1; }
grep -E "registers|spill|C75" "$OUT/$name.ptxas.txt" | grep -v "^ptxas info    : Compiling" | sed "s/^/$name: /"
