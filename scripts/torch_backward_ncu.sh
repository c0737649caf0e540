#!/usr/bin/env bash
# Nsight Compute on our backward kernel and cuDNN's, one launch each, as PyTorch runs them at the Llama's attention
# (16 query heads on 4 K/V heads, causal, bf16, batch 1; scripts/torch_backward_race.py --ncu-pass). Clocks left
# alone (--clock-control none). Writes OUT/ncu-raw.csv (every collected metric, one row per kernel: ours then
# cuDNN's, per shape in order) and prints the comparison (scripts/ncu_compare.py).
#   On the lent GPU machine, after the Python build (scripts/device_build.sh flashlab_python flashlab_torch_ops):
#   bash scripts/torch_backward_ncu.sh "$OUT" [SEQ,HEAD_DIM ...]      (default 16384,64 16384,128)
set -uo pipefail
out=${1:-${OUT:-ncu-out}}
shift || true
shapes=("$@"); ((${#shapes[@]})) || shapes=(16384,64 16384,128)
mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[ -x "$ncu" ] || { echo "torch_backward_ncu: ncu (Nsight Compute) is neither on the PATH nor in /usr/local/cuda/bin or /opt/nvidia/nsight-compute" >&2; exit 2; }
source scripts/python_path.sh build-device >/dev/null
"$ncu" --clock-control none -k regex:"backward_kernel|bprop" \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section InstructionStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  -o "$out/backward" python3 scripts/torch_backward_race.py --ncu-pass "${shapes[@]}" >"$out/ncu.log" 2>&1 ||
  { tail -20 "$out/ncu.log"; exit 1; }
"$ncu" --import "$out/backward.ncu-rep" --page raw --csv >"$out/ncu-raw.csv" && rm -f "$out/backward.ncu-rep"
python3 scripts/ncu_compare.py "$out/ncu-raw.csv"
