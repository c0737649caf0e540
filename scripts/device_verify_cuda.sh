#!/usr/bin/env bash
# On the lent GPU machine, from the repository root, after `bash scripts/device_build.sh` built build-device:
# `flashlab verify` on plugins that take CUDA device memory. The GPU tests (ctest -L gpu -R verify: the CUDA example
# passes the quick suite at three seeds, the full suite and a small --bench; each planted bug is caught and named),
# the CPU tests of the CUDA-memory stub (a build with CUDA calls it with a stream) and of --bench's SDPA child
# process, then one full-suite verify of the CUDA example with --bench (N = 1024 and 4096, to keep the script near a
# minute and a half on an H100) into OUT/verify_cuda_full_bench.txt, whose table must have PyTorch's SDPA rows with
# times (SDPA timed by the machine's python3, or by SDPA_PYTHON). With SANITIZE=1, then compute-sanitizer memcheck
# on one quick suite of the example.
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
# (pytest from .deps/python where this machine's Python has none)
# shellcheck source=scripts/python_path.sh
source scripts/python_path.sh build-device >/dev/null 2>&1
step ctest --test-dir build-device -R "sdpa_child_tests|python_sdpa_timer_tests" --output-on-failure
python=${SDPA_PYTHON:-python3}
echo "== flashlab verify --suite full --bench on the CUDA example (at ${SECONDS} s)"
"$bin/flashlab" verify --plugin "$plugins/libflashlab_cuda_example_plugin.so" --seed 1 --suite full --bench \
  --bench-seq 1024,4096 --python "$python" >"$out/verify_cuda_full_bench.txt" 2>"$out/verify_cuda_full_bench.stderr"
rc=$?
echo "exit $rc; the count and the bench table:"
grep -E "^[0-9]+ cases:|^bench|^not timed" "$out/verify_cuda_full_bench.txt"
sed -n '/^shape /,$p' "$out/verify_cuda_full_bench.txt"
[ "$rc" = 0 ] || { echo "FAILED: the full suite with --bench exited $rc"; tail -5 "$out/verify_cuda_full_bench.stderr"; status=1; }
# PyTorch's SDPA beside it: rows with a time and x sdpa 1.00x, and the line naming the PyTorch that timed them.
sdpa_rows=$(grep -cE " sdpa( \([a-z]+\))? +[0-9.]+ +[0-9.]+ +([0-9.]+x|-) +1\.00x$" "$out/verify_cuda_full_bench.txt")
if grep -q "^sdpa: PyTorch " "$out/verify_cuda_full_bench.txt" && [ "$sdpa_rows" -gt 0 ]; then
  echo "SDPA timed beside the plugin: $sdpa_rows rows"
else
  echo "FAILED: SDPA has no timed row: $(grep "^sdpa" "$out/verify_cuda_full_bench.txt")"
  status=1
fi
if [ "${SANITIZE:-0}" != 0 ]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  step "$sanitizer" --tool memcheck --error-exitcode 1 "$bin/flashlab" verify \
    --plugin "$plugins/libflashlab_cuda_example_plugin.so" --seed 2
fi
echo "== done in ${SECONDS} s"
exit $status
