#!/usr/bin/env bash
# One call on the lent GPU machine: build everything (preset `device`), run every GPU test suite
# (CTest label `gpu`: kernels, GPU lessons, and the Python module's with PyTorch; scripts/python_path.sh
# says how its Python finds the module) and the kernel build checks (label `cuda-build`, which
# need the toolkit's cuobjdump), compute-sanitizer on small cases, repeat the fa2 suite
# to catch an error that moves between runs, and print the variant table and a full `flashlab check`.
# Logs go to $1 (default $OUT). The benchmark against PyTorch is scripts/bench_vs_sdpa.sh.
#   device run: bash scripts/gpu_session.sh "$OUT"     (carry .deps; make it with scripts/make_deps.sh)
set -uo pipefail
out=${1:-${OUT:-gpu-out}}
repeats=${REPEATS:-10}
mkdir -p "$out"
bin=build-device/bin
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"

echo "== build"
bash scripts/device_build.sh >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }

source scripts/python_path.sh build-device >/dev/null
grep "FlashLab:" "$out/build.log"

echo "== GPU tests (ctest -L gpu)"
ctest --test-dir build-device -L gpu --output-on-failure >"$out/ctest-gpu.log" 2>&1
status=$?
tail -12 "$out/ctest-gpu.log"

echo "== kernel build checks (ctest -L cuda-build: no register spills; HMMA in every cuda-fa2 kernel's SASS)"
ctest --test-dir build-device -L cuda-build --output-on-failure >"$out/ctest-cuda-build.log" 2>&1 || status=1
grep -E "Passed|Failed|Skipped|kernels in the SASS|functions compiled" "$out/ctest-cuda-build.log"

echo "== compute-sanitizer (small cases, forward and backward)"
for tool in memcheck racecheck; do
  for case in "$bin/gpu_readable_tests -tc=*drop*,*masked*" "$bin/gpu_fa2_tests -tc=*dropout*,*masked*,*GQA*"; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 $case >"$out/sanitizer.log" 2>&1
    echo "$tool ${case#$bin/}: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer.log" | tail -1))"
  done
done

echo "== compute-sanitizer on cuda-fa3-ws, every ladder step (memcheck, synccheck, initcheck; racecheck does not model TMA)"
for tool in memcheck synccheck initcheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/flashlab" check \
    --variants cuda-fa3-ws-step1,cuda-fa3-ws-step2,cuda-fa3-ws-step3,cuda-fa3-ws-step4,cuda-fa3-ws --dtype bf16 \
    --batch 2 --heads 4 --heads-kv 2 --seq-q 200 --seq-k 333 --head-dim 128 --causal bottom-right --dropout 0.1 \
    >"$out/sanitizer-fa3.log" 2>&1
  echo "$tool cuda-fa3-ws (5 steps): exit $? ($(grep -E 'ERROR SUMMARY' "$out/sanitizer-fa3.log" | tail -1))"
  # Long keys without dropout: the wide K/V blocks of d = 64 and 128, with a ragged last block.
  for d in 64 128; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/flashlab" check \
      --variants cuda-fa3-ws-step2,cuda-fa3-ws-step4,cuda-fa3-ws --dtype bf16 \
      --batch 1 --heads 4 --heads-kv 2 --seq-q 200 --seq-k 2100 --head-dim "$d" --causal bottom-right \
      >"$out/sanitizer-fa3-wide.log" 2>&1
    echo "$tool cuda-fa3-ws wide blocks d=$d (steps 2, 4, 5): exit $? ($(grep -E 'ERROR SUMMARY' "$out/sanitizer-fa3-wide.log" | tail -1))"
  done
done

echo "== compute-sanitizer on cuda-fa3-ws's backward (memcheck, synccheck, initcheck), default and deterministic mode"
for tool in memcheck synccheck initcheck; do
  for mode in "" --deterministic; do
    for d in 64 128 256; do
      # With and without dropout: at d = 128 the two order the step's GEMMs differently.
      for dropout in 0.1 0; do
        compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/flashlab" check --variants cuda-fa3-ws --dtype bf16 \
          --batch 2 --heads 4 --heads-kv 2 --seq-q 300 --seq-k 333 --head-dim "$d" --causal bottom-right --dropout "$dropout" \
          --backward $mode >"$out/sanitizer-fa3-bwd.log" 2>&1
        echo "$tool cuda-fa3-ws backward d=$d dropout=$dropout ${mode:-default}: exit $? ($(grep -E 'ERROR SUMMARY' "$out/sanitizer-fa3-bwd.log" | tail -1))"
      done
    done
  done
done

echo "== gpu_fa2_tests repeated $repeats times on fresh random inputs"
failed=0
for i in $(seq "$repeats"); do
  "$bin/gpu_fa2_tests" >"$out/fa2-repeat-$i.log" 2>&1 || { failed=$((failed + 1)); grep -B2 -A6 "ERROR" "$out/fa2-repeat-$i.log" | head -20; }
done
echo "fa2 repeats: $failed of $repeats runs failed"

echo "== flashlab check --list, and every variant on one problem"
"$bin/flashlab" check --list
"$bin/flashlab" check --heads 4 --heads-kv 2 --seq-q 200 --seq-k 333 --head-dim 64 --causal bottom-right \
  --dropout 0.1 --backward | tee "$out/check.txt" | tail -3
exit $status
