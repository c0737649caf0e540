#!/usr/bin/env bash
# Nsight Compute's DRAM counters for exactly one forward pass of cuda-fa2, cuda-naive, cuda-fa1 and
# cuda-fa3-ws (B = 1, H = 16; d = 64 and 128; causal and not; N from 1k up to 128k, 16k for the fp32
# kernels), written as <gpu>-dram-counters.json (h100-..., h200-...: the GPU's name) with the device named.
# tests/test_gpu_counters.cpp compares the traffic model's GPU level with it.
#
# On the lent GPU machine, from the repository root, with .deps carried (scripts/make_deps.sh):
#   bash scripts/record_dram_counters.sh "$OUT"        # builds flashlab (preset `device`) first
# then copy $OUT/<gpu>-dram-counters.json into bench/results/. The argument is the output folder
# (default bench/results). Runs already in <folder>/<gpu>-dram-counters.json or
# bench/results/<gpu>-dram-counters.json, from the same device, are kept and not run again, so a second
# call finishes what a first one ran out of time for.
#
# Each `flashlab bench --one-pass` runs one pass per N inside cudaProfilerStart / Stop, and ncu
# (--profile-from-start off) measures those kernels only, each from a flushed L2 (--cache-control all),
# clocks left alone (--clock-control none). The whole call stays under BUDGET_S seconds (default 540,
# the build included): runs that would start later are listed under "not_recorded".
# Environment: SKIP_BUILD=1 reuses build-device; BUDGET_S; VARIANTS narrows the list (space separated);
# PLAN=l2-transition measures instead cuda-fa1 where its Q and O cross the L2's size (N and H in small steps,
# with the L2's own sector counters), into <gpu>-dram-counters_l2-transition.json (about 3 minutes).
set -uo pipefail
started=$(date +%s)
out=${1:-bench/results}
mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[ -x "$ncu" ] || { echo "record_dram_counters: ncu (Nsight Compute) is neither on the PATH nor in /usr/local/cuda/bin or /opt/nvidia/nsight-compute" >&2; exit 2; }
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
[ -n "$device" ] || { echo "record_dram_counters: nvidia-smi names no GPU" >&2; exit 2; }
echo "device: $device; ncu: $ncu, $("$ncu" --version | tail -1)"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  bash scripts/device_build.sh flashlab_cmd >"$out/record-build.log" 2>&1 || { tail -30 "$out/record-build.log"; exit 1; }
  echo "built in $(( $(date +%s) - started )) s"
fi
PYTHONUNBUFFERED=1 python3 scripts/dram_counters.py --flashlab build-device/bin/flashlab --ncu "$ncu" --device "$device" --out "$out" \
  --deadline $(( started + ${BUDGET_S:-540} )) ${VARIANTS:+--variants $VARIANTS} ${PLAN:+--plan $PLAN} \
  --command "${PLAN:+PLAN=$PLAN }bash scripts/record_dram_counters.sh $*"
