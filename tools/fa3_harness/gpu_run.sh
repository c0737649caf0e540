#!/usr/bin/env bash
# On the H100: the layout probes, then (BENCH=1) the timing table; SASS counts where cuobjdump exists.
# Full logs in $LOGDIR. Correctness is the project's: ctest -L gpu (gpu_fa3_ws_tests) and flashlab check.
# Usage: tools/fa3_harness/gpu_run.sh [LOGDIR]   (the harness must be built: tools/fa3_harness/build.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
LOGDIR=${1:-out/fa3/logs}
mkdir -p "$LOGDIR"
H=out/fa3/fa3_harness
SEED=${SEED:-$RANDOM}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
rc=0
timeout 120 "$H" --probes --seed "$SEED" --log "$LOGDIR/probes.log" | grep -E "probe|FATAL|timed out|RESULT" || rc=1
if command -v cuobjdump >/dev/null && [ -f out/fa3/fa3_ws_forward.o ]; then
  tools/fa3_harness/sass_check.sh out/fa3/fa3_ws_forward.o >"$LOGDIR/sass.txt" 2>&1; tail -1 "$LOGDIR/sass.txt"
fi
if [ "${BENCH:-0}" = 1 ]; then
  timeout 500 "$H" --bench --steps "${BENCH_STEPS:-1,2,3,4,5}" --log "$LOGDIR/bench.log" | grep -v "^---- summary\|^RESULT\|^probes"
fi
exit $rc
