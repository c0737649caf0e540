#!/usr/bin/env bash
# On the lent GPU machine: build everything (preset `device`), run every GPU test suite
# (CTest label `gpu`: kernels, GPU lessons, and the Python module's with PyTorch; scripts/python_path.sh
# says how its Python finds the module) and the kernel build checks (label `cuda-build`, which
# need the toolkit's cuobjdump), compute-sanitizer on small cases, repeat the fa2 suite
# to catch an error that moves between runs, and print the variant table and a full `flashlab check`.
# Logs go to $1 (default $OUT). Exit 1 if any of them failed. The benchmark against PyTorch is
# scripts/bench_vs_sdpa.sh.
#   device run: bash scripts/gpu_session.sh "$OUT"     (carry .deps; make it with scripts/make_deps.sh)
# All of it takes longer than one call's 10 minutes (the `gpu` suites alone take about 7 on an H200), so PARTS
# (default: all) names what runs after the build: tests, checks (cuda-build), sanitize, repeats, variants. Two calls
# in a row, e.g. PARTS="tests checks" then PARTS="sanitize repeats variants", find the first one's build still there
# while the machine is warm (a rebuild then takes seconds).
set -uo pipefail
out=${1:-${OUT:-gpu-out}}
repeats=${REPEATS:-10}
parts=${PARTS:-"tests checks sanitize repeats variants"}
runs() { [[ " $parts " == *" $1 "* ]]; }
mkdir -p "$out"
bin=build-device/bin
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"

# sanitize LOG TOOL LABEL COMMAND...: COMMAND under compute-sanitizer's TOOL, logged to $out/LOG; one line printed,
# and a failure recorded in status.
sanitize() {
  local log=$1 tool=$2 label=$3
  shift 3
  compute-sanitizer --tool "$tool" --error-exitcode 9 "$@" >"$out/$log" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || status=1
  echo "$tool $label: exit $rc ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$log" | tail -1))"
}

echo "== build"
bash scripts/device_build.sh >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }

source scripts/python_path.sh build-device >/dev/null
grep "FlashLab:" "$out/build.log"

if runs tests; then
  echo "== GPU tests (ctest -L gpu)"
  ctest --test-dir build-device -L gpu --output-on-failure >"$out/ctest-gpu.log" 2>&1 || status=1
  tail -12 "$out/ctest-gpu.log"
fi

if runs checks; then
  echo "== kernel build checks (ctest -L cuda-build: no register spills; HMMA in every cuda-fa2 kernel's SASS)"
  ctest --test-dir build-device -L cuda-build --output-on-failure >"$out/ctest-cuda-build.log" 2>&1 || status=1
  grep -E "Passed|Failed|Skipped|kernels in the SASS|functions compiled" "$out/ctest-cuda-build.log"
fi

if runs sanitize; then
  echo "== compute-sanitizer (small cases, forward and backward)"
  for tool in memcheck racecheck; do
    sanitize sanitizer.log "$tool" "gpu_readable_tests" "$bin/gpu_readable_tests" "-tc=*drop*,*masked*"
    sanitize sanitizer.log "$tool" "gpu_fa2_tests" "$bin/gpu_fa2_tests" "-tc=*dropout*,*masked*,*GQA*"
  done

  echo "== compute-sanitizer on cuda-fa3-ws, every ladder step (memcheck, synccheck, initcheck; not racecheck: no TMA model)"
  for tool in memcheck synccheck initcheck; do
    sanitize sanitizer-fa3.log "$tool" "cuda-fa3-ws (7 steps)" "$bin/flashlab" check \
      --variants cuda-fa3-ws-step1,cuda-fa3-ws-step2,cuda-fa3-ws-step3,cuda-fa3-ws-step4,cuda-fa3-ws,cuda-fa3-ws-eager-rescale,cuda-fa3-ws-exp2-emulated --dtype bf16 \
      --batch 2 --heads 4 --heads-kv 2 --seq-q 200 --seq-k 333 --head-dim 128 --causal bottom-right --dropout 0.1
    # Long keys without dropout: the wide K/V blocks of d = 64 and 128, with a ragged last block (at d = 64 from step 5
    # on, 200 queries run two consumers on them).
    for d in 64 128; do
      sanitize sanitizer-fa3-wide.log "$tool" "cuda-fa3-ws wide blocks d=$d (steps 2, 4, 5, 6, 7)" "$bin/flashlab" check \
        --variants cuda-fa3-ws-step2,cuda-fa3-ws-step4,cuda-fa3-ws,cuda-fa3-ws-eager-rescale,cuda-fa3-ws-exp2-emulated --dtype bf16 \
        --batch 1 --heads 4 --heads-kv 2 --seq-q 200 --seq-k 2100 --head-dim "$d" --causal bottom-right
    done
    # d = 64's three consumer warpgroups (steps 5-7): 380 queries on long keys under a mask, 500 on short ones without.
    for shape in "--seq-q 380 --seq-k 2100 --causal top-left" "--seq-q 500 --seq-k 700 --causal none"; do
      # shellcheck disable=SC2086 # the shape is words
      sanitize sanitizer-fa3-three.log "$tool" "cuda-fa3-ws three consumers d=64 ($shape)" "$bin/flashlab" check \
        --variants cuda-fa3-ws,cuda-fa3-ws-eager-rescale,cuda-fa3-ws-exp2-emulated --dtype bf16 \
        --batch 1 --heads 4 --heads-kv 2 $shape --head-dim 64
    done
  done

  echo "== compute-sanitizer on cuda-fa3-ws's backward (memcheck, synccheck, initcheck), default and deterministic mode"
  for tool in memcheck synccheck initcheck; do
    for mode in "" --deterministic; do
      for d in 64 128 256; do
        # With and without dropout: at d = 128 the two order the step's GEMMs differently.
        for dropout in 0.1 0; do
          sanitize sanitizer-fa3-bwd.log "$tool" "cuda-fa3-ws backward d=$d dropout=$dropout ${mode:-default}" \
            "$bin/flashlab" check --variants cuda-fa3-ws --dtype bf16 --batch 2 --heads 4 --heads-kv 2 --seq-q 300 \
            --seq-k 333 --head-dim "$d" --causal bottom-right --dropout "$dropout" --backward $mode
        done
      done
    done
    # The three consumer warpgroups at d = 64, which the plan takes only on long grids: the backward suite's case
    # that runs them on small problems (both modes, every mask, GQA with shared groups, dropout).
    sanitize sanitizer-fa3-bwd3.log "$tool" "cuda-fa3-ws backward d=64 three consumers" \
      "$bin/gpu_fa3_ws_backward_tests" "-tc=*three consumer warpgroups*"
  done
fi

if runs repeats; then
  echo "== gpu_fa2_tests repeated $repeats times on fresh random inputs"
  failed=0
  for i in $(seq "$repeats"); do
    "$bin/gpu_fa2_tests" >"$out/fa2-repeat-$i.log" 2>&1 ||
      { failed=$((failed + 1)); grep -B2 -A6 "ERROR" "$out/fa2-repeat-$i.log" | head -20; }
  done
  echo "fa2 repeats: $failed of $repeats runs failed"
  [ "$failed" = 0 ] || status=1
fi

if runs variants; then
  echo "== flashlab check --list, and every variant on one problem"
  "$bin/flashlab" check --list
  "$bin/flashlab" check --heads 4 --heads-kv 2 --seq-q 200 --seq-k 333 --head-dim 64 --causal bottom-right \
    --dropout 0.1 --backward >"$out/check.txt" 2>&1 || status=1
  tail -3 "$out/check.txt"
fi
exit $status
