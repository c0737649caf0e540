#!/usr/bin/env bash
# The cuda-fa3-ws backward at d = 64 in its two block shapes, side by side in one call on the lent GPU machine:
# Br = 64 query rows per step (the shipped build, build-device) and Br = 128 (FLASHLAB_FA3_BACKWARD_D64_ROWS=128,
# build-device-rows128). The backward's GPU suite runs on both builds, compute-sanitizer on the Br = 128 one, then
# `flashlab bench --backward` times the two binaries in turn: scripts/ab_bench.sh at the FA2 setting (B x N = 16k
# tokens, H = 32), and a Llama's grouped-query attention (batch 1, 16 query heads on 4 K/V heads).
#   device run: bash scripts/backward_d64_rows_ab.sh "$OUT"     (carry .deps; make it with scripts/make_deps.sh)
# Environment: SEQS (default "2048 4096 16384"), ROUNDS (default 3), PARTS (default "check sanitize bench": what runs
# after the builds and the suites; each call must stay within the machine's 10 minutes, and the two builds, made side
# by side, take about three).
set -uo pipefail
out=${1:-${OUT:-ab-out}}
seqs=${SEQS:-"2048 4096 16384"}
rounds=${ROUNDS:-3}
parts=${PARTS:-"check sanitize bench"}
runs() { [[ " $parts " == *" $1 "* ]]; }
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
status=0

echo "== build: Br = 64 (build-device) and Br = 128 (build-device-rows128)"
targets=(flashlab_cmd gpu_fa3_ws_backward_tests)
bash scripts/device_build.sh "${targets[@]}" >"$out/build-rows64.log" 2>&1 &
first=$!
BUILD_DIR=build-device-rows128 CMAKE_ARGS=-DFLASHLAB_FA3_BACKWARD_D64_ROWS=128 \
  bash scripts/device_build.sh "${targets[@]}" >"$out/build-rows128.log" 2>&1 ||
  { tail -30 "$out/build-rows128.log"; exit 1; }
wait "$first" || { tail -30 "$out/build-rows64.log"; exit 1; }
declare -A bin=([64]=build-device/bin [128]=build-device-rows128/bin)

echo "== gpu_fa3_ws_backward_tests on both builds"
for rows in 64 128; do
  "${bin[$rows]}/gpu_fa3_ws_backward_tests" >"$out/suite-rows$rows.log" 2>&1 || status=1
  echo "Br = $rows: $(grep -E 'test cases:' "$out/suite-rows$rows.log" | tail -1)"
done

if runs check; then
  echo "== flashlab check --backward at d = 64 on the Br = 128 build (exit 0: within its bounds of the CPU reference)"
  for causal in none top-left bottom-right; do
    for mode in "" --deterministic; do
      "${bin[128]}/flashlab" check --variants cuda-fa3-ws --dtype bf16 --batch 2 --heads 4 --heads-kv 2 \
        --seq-q 300 --seq-k 333 --head-dim 64 --causal "$causal" --backward $mode >"$out/check-$causal$mode.log" 2>&1
      rc=$?
      [ "$rc" = 0 ] || status=1
      echo "causal $causal ${mode:-default}: exit $rc"
    done
  done
fi

if runs sanitize; then
  echo "== compute-sanitizer on the Br = 128 build, d = 64 (odd lengths, GQA)"
  for tool in memcheck synccheck initcheck; do
    for mode in "" --deterministic; do
      for causal in none bottom-right; do
        for dropout in 0 0.1; do
          # memcheck every case; synccheck and initcheck the causal ones without dropout (which adds no shared memory)
          [ "$tool" != memcheck ] && { [ "$dropout" != 0 ] || [ "$causal" = none ]; } && continue
          compute-sanitizer --tool "$tool" --error-exitcode 9 "${bin[128]}/flashlab" check --variants cuda-fa3-ws \
            --dtype bf16 --batch 2 --heads 4 --heads-kv 2 --seq-q 300 --seq-k 333 --head-dim 64 --causal "$causal" \
            --dropout "$dropout" --backward $mode >"$out/sanitizer.log" 2>&1 || status=1
          summary=$(grep -E 'ERROR SUMMARY' "$out/sanitizer.log" | tail -1)
          echo "$tool causal $causal dropout $dropout ${mode:-default}: $summary"
        done
      done
    done
  done
fi
runs bench || exit $status

echo "== A/B at the FA2 setting: forward and backward, d = 64 (scripts/ab_bench.sh; before = Br 64, after = Br 128)"
for causal in none top-left; do
  for seq in $seqs; do
    VARIANT=cuda-fa3-ws HEAD_DIMS=64 CAUSAL=$causal SEQ=$seq ROUNDS=$rounds \
      bash scripts/ab_bench.sh "${bin[64]}/flashlab" "${bin[128]}/flashlab" "$out/ab-$causal-$seq"
  done
done

echo "== A/B at a Llama's attention: batch 1, 16 query heads on 4 K/V heads, d = 64, causal (backward ms, in turn)"
seq_list=$(tr ' ' ',' <<<"$seqs")
for round in $(seq "$rounds"); do
  for rows in 64 128; do
    "${bin[$rows]}/flashlab" bench --device cuda --variants cuda-fa3-ws --dtype bf16 --batch 1 --heads 16 --heads-kv 4 \
      --head-dim 64 --seq "$seq_list" --causal top-left --backward --warmup 5 --iters 20 \
      --json "$out/gqa-rows$rows-r$round.json" >/dev/null || status=1
  done
done
python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
times = {}
for rows in (64, 128):
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{out}/gqa-rows{rows}-r{r}.json"))["rows"]:
            times.setdefault((row["seq_q"], rows), []).append(row["backward_ms"])
print(f"{'N':>6} {'Br 64 ms':>10} {'Br 128 ms':>10} {'128 / 64':>9}")
for seq in sorted({s for s, _ in times}):
    a, b = statistics.median(times[(seq, 64)]), statistics.median(times[(seq, 128)])
    print(f"{seq:>6} {a:>10.4f} {b:>10.4f} {b / a:>9.3f}")
EOF
exit $status
