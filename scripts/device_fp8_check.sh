#!/usr/bin/env bash
# On the lent GPU machine (Hopper), from the repository root with .deps carried: build, then check cuda-fa3-ws's FP8
# forward the way this tree asks for any change under src/cuda: its GPU suite and the forward's (shared parts), the
# no-spill and SASS checks (cuda-build), `flashlab check --dtype e4m3` on a few shapes through the command line,
# and with SANITIZE=1 compute-sanitizer memcheck, synccheck and initcheck on the FP8 suite.
# Usage: bash scripts/device_fp8_check.sh OUT (SKIP_BUILD=1 reuses build-device).
set -uo pipefail
out=${1:-${OUT:-fp8-check-out}}
mkdir -p "$out"
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/device_build.sh >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
bin=build-device/bin
status=0
step() { echo "== $*"; "$@" || { echo "FAILED: $*"; status=1; }; }
if [ "${SANITIZE:-0}" = 1 ]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck synccheck initcheck; do
    step "$sanitizer" --tool "$tool" --error-exitcode 1 "$bin/gpu_fa3_ws_fp8_tests" -tc="the FP8 forward*"
  done
  exit $status
fi
step ctest --test-dir build-device -L cuda-build --output-on-failure
step "$bin/gpu_fa3_ws_fp8_tests"
step "$bin/gpu_fa3_ws_tests"
for causal in none top-left bottom-right; do
  for d in 128 256; do
    step "$bin/flashlab" check --variants cuda-fa3-ws --dtype e4m3 --batch 2 --heads 4 --heads-kv 2 --seq-q 500 \
      --seq-k 777 --head-dim "$d" --causal "$causal"
  done
done
cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
"$cuobjdump" --dump-sass "$bin/flashlab" | grep -m2 "HGMMA.*E4M3"
exit $status
