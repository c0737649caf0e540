#!/usr/bin/env bash
# The README's second command: set up, build, and run every test. GPU suites (label `gpu`) report as
# skipped on a machine without a CUDA device. With --sanitize, builds the CPU code under ASan + UBSan
# (preset `sanitize`, build-sanitize/) and runs the CPU tests there instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${1:-}" = "--sanitize" ]; then
  bash scripts/build.sh sanitize
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-sanitize --output-on-failure -LE "gpu|viz" -j "$(nproc)"
else
  bash scripts/build.sh default
  ctest --test-dir build --output-on-failure -j "$(nproc)"
fi
