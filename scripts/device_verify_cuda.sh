#!/usr/bin/env bash
# On the lent GPU machine, from the repository root, after `bash scripts/device_build.sh` built build-device:
# `flashlab verify` on plugins that take CUDA device memory. The GPU tests (ctest -L gpu -R verify: the CUDA example
# passes the quick suite at three seeds, the full suite and a small --bench; each planted bug is caught and named),
# the CPU test of the CUDA-memory stub (a build with CUDA calls it with a stream), then one full-suite verify of the
# CUDA example with --bench (N = 1024 and 4096, to keep the script near a minute and a half on an H100) into
# OUT/verify_cuda_full_bench.txt. With SANITIZE=1, then compute-sanitizer memcheck on one quick suite of the example.
# Usage: bash scripts/device_verify_cuda.sh OUT
set -uo pipefail
out=${1:-${OUT:-verify-cuda-out}}
mkdir -p "$out"
bin=build-device/bin
plugins=build-device/plugins
[ -x "$bin/flashlab" ] && [ -f "$plugins/libflashlab_cuda_example_plugin.so" ] ||
  { echo "build-device has no flashlab or no CUDA example plugin: run bash scripts/device_build.sh (all targets) first"; exit 1; }
status=0
step() { echo "== $* (at ${SECONDS} s)"; "$@" || { echo "FAILED: $*"; status=1; }; }
step ctest --test-dir build-device -L gpu -R verify -j "$(nproc)" --output-on-failure
step ctest --test-dir build-device -R verify_cuda_memory_stub --output-on-failure
echo "== flashlab verify --suite full --bench on the CUDA example (at ${SECONDS} s)"
"$bin/flashlab" verify --plugin "$plugins/libflashlab_cuda_example_plugin.so" --seed 1 --suite full --bench \
  --bench-seq 1024,4096 >"$out/verify_cuda_full_bench.txt" 2>"$out/verify_cuda_full_bench.stderr"
rc=$?
echo "exit $rc; the count and the bench table:"
grep -E "^[0-9]+ cases:|^bench|^not timed" "$out/verify_cuda_full_bench.txt"
sed -n '/^shape /,$p' "$out/verify_cuda_full_bench.txt"
[ "$rc" = 0 ] || { echo "FAILED: the full suite with --bench exited $rc"; tail -5 "$out/verify_cuda_full_bench.stderr"; status=1; }
if [ "${SANITIZE:-0}" != 0 ]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  step "$sanitizer" --tool memcheck --error-exitcode 1 "$bin/flashlab" verify \
    --plugin "$plugins/libflashlab_cuda_example_plugin.so" --seed 2
fi
echo "== done in ${SECONDS} s"
exit $status
