#!/usr/bin/env bash
# On the lent GPU machine (Hopper), from the repository root with .deps carried: build, then check cuda-fa3-ws's FP8
# forward the way this tree asks for any change under src/cuda: its GPU suite, the quantizing pre-pass's, the bf16/f16
# forward's (shared parts), the Python module's GPU suite, the no-spill and SASS checks (cuda-build), `flashlab
# check --dtype e4m3` on a few shapes through the command line, and one bench of the pre-pass path; with SANITIZE=1
# then compute-sanitizer memcheck on the FP8 and pre-pass suites (SANITIZE=all: synccheck and initcheck too).
# Usage: bash scripts/device_fp8_check.sh OUT (SKIP_BUILD=1 reuses build-device).
set -uo pipefail
out=${1:-${OUT:-fp8-check-out}}
mkdir -p "$out"
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/device_build.sh >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
bin=build-device/bin
status=0
step() { echo "== $*"; "$@" || { echo "FAILED: $*"; status=1; }; }
step ctest --test-dir build-device -L cuda-build --output-on-failure
step "$bin/gpu_fa3_ws_fp8_tests"
step "$bin/gpu_fp8_quantize_tests"
step "$bin/gpu_fa3_ws_tests"
step ctest --test-dir build-device -R "python_(cpu|gpu)_tests" --output-on-failure
for causal in none top-left bottom-right; do
  for d in 64 128 256; do
    step "$bin/flashlab" check --variants cuda-fa3-ws --dtype e4m3 --batch 2 --heads 4 --heads-kv 2 --seq-q 500 \
      --seq-k 777 --head-dim "$d" --causal "$causal"
  done
done
step "$bin/flashlab" bench --device cuda --variants cuda-fa3-ws --dtype e4m3 --quantize-from bf16 --rotate --seq 4096 \
  --batch 4 --heads 16 --head-dim 128 --warmup 2 --iters 5
if [ "${SANITIZE:-0}" != 0 ]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  tools=(memcheck); [ "$SANITIZE" = all ] && tools=(memcheck synccheck initcheck)
  for tool in "${tools[@]}"; do
    step "$sanitizer" --tool "$tool" --error-exitcode 1 "$bin/gpu_fa3_ws_fp8_tests" -tc="the FP8 forward*"
    step "$sanitizer" --tool "$tool" --error-exitcode 1 "$bin/gpu_fp8_quantize_tests"
  done
fi
exit $status
