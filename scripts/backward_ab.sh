#!/usr/bin/env bash
# Two builds of the cuda-fa3-ws backward side by side in one call on the lent GPU machine: A (build-device-a, cache
# settings A_ARGS) and B (build-device-b, B_ARGS), e.g. a compile-time choice off and on. The backward's GPU suite runs
# on both, `flashlab check --backward` at HEAD_DIM on B in every causal mode (default and deterministic, and with
# dropout), then `flashlab bench --backward` times the two binaries in turn: scripts/ab_bench.sh at the FA2 setting
# (B x N = 16k tokens, H d = 2048), and a Llama's grouped-query attention (batch 1, 16 query heads on 4 K/V heads,
# causal). With TIMELINE=1, B also records its backward's timeline at the Llama's shape, the last of SEQS.
#   device run: A_ARGS=... B_ARGS=... bash scripts/backward_ab.sh "$OUT"   (carry .deps; scripts/make_deps.sh)
# Environment: HEAD_DIM (default 64), SEQS (default "2048 4096 16384"), ROUNDS (default 3), PARTS (default "check
# bench"; "sanitize" adds compute-sanitizer's memcheck, synccheck and initcheck on B at HEAD_DIM). Each call must stay
# within the machine's 10 minutes; the two builds, made side by side, take about three.
set -uo pipefail
out=${1:-${OUT:-ab-out}}
head_dim=${HEAD_DIM:-64}
seqs=${SEQS:-"2048 4096 16384"}
rounds=${ROUNDS:-3}
parts=${PARTS:-"check bench"}
runs() { [[ " $parts " == *" $1 "* ]]; }
# Every log, bench file and timeline goes to $out/files and leaves packed as one $out/files.tgz: a device call brings
# back only a few files.
files="$out/files"
mkdir -p "$files"
trap 'tar czf "$out/files.tgz" -C "$out" files && rm -rf "$files"' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
status=0

echo "== build: A (${A_ARGS:-defaults}) and B (${B_ARGS:-defaults})"
targets=(flashlab_cmd gpu_fa3_ws_backward_tests)
BUILD_DIR=build-device-a CMAKE_ARGS=${A_ARGS:-} bash scripts/device_build.sh "${targets[@]}" >"$files/build-a.log" 2>&1 &
first=$!
BUILD_DIR=build-device-b CMAKE_ARGS=${B_ARGS:-} bash scripts/device_build.sh "${targets[@]}" >"$files/build-b.log" 2>&1 ||
  { tail -30 "$files/build-b.log"; exit 1; }
wait "$first" || { tail -30 "$files/build-a.log"; exit 1; }
declare -A bin=([a]=build-device-a/bin [b]=build-device-b/bin)

echo "== gpu_fa3_ws_backward_tests on both builds"
for side in a b; do
  "${bin[$side]}/gpu_fa3_ws_backward_tests" >"$files/suite-$side.log" 2>&1 || status=1
  echo "$side: $(grep -E 'test cases:' "$files/suite-$side.log" | tail -1)"
done

if runs check; then
  echo "== flashlab check --backward at d = $head_dim on B (exit 0: within its bounds of the CPU reference)"
  for causal in none top-left bottom-right; do
    for mode in "" --deterministic "--dropout 0.1"; do
      "${bin[b]}/flashlab" check --variants cuda-fa3-ws --dtype bf16 --batch 2 --heads 4 --heads-kv 2 \
        --seq-q 300 --seq-k 333 --head-dim "$head_dim" --causal "$causal" --backward $mode >"$files/check-$causal.log" 2>&1
      rc=$?
      [ "$rc" = 0 ] || { status=1; tail -5 "$files/check-$causal.log"; }
      echo "causal $causal ${mode:-default}: exit $rc"
    done
  done
fi
if runs sanitize; then
  echo "== compute-sanitizer on B, d = $head_dim (odd lengths, GQA)"
  for tool in memcheck synccheck initcheck; do
    for mode in "" --deterministic; do
      for causal in none bottom-right; do
        for dropout in 0 0.1; do
          # memcheck every case; synccheck and initcheck the causal ones without dropout (which adds no shared memory)
          [ "$tool" != memcheck ] && { [ "$dropout" != 0 ] || [ "$causal" = none ]; } && continue
          compute-sanitizer --tool "$tool" --error-exitcode 9 "${bin[b]}/flashlab" check --variants cuda-fa3-ws \
            --dtype bf16 --batch 2 --heads 4 --heads-kv 2 --seq-q 300 --seq-k 333 --head-dim "$head_dim" \
            --causal "$causal" --dropout "$dropout" --backward $mode >"$files/sanitizer.log" 2>&1 || status=1
          echo "$tool causal $causal dropout $dropout ${mode:-default}: $(grep -E 'ERROR SUMMARY' "$files/sanitizer.log" | tail -1)"
        done
      done
    done
  done
fi
runs bench || exit $status

echo "== A/B at the FA2 setting: forward and backward, d = $head_dim (scripts/ab_bench.sh; before = A, after = B)"
for causal in none top-left; do
  for seq in $seqs; do
    VARIANT=cuda-fa3-ws HEAD_DIMS=$head_dim CAUSAL=$causal SEQ=$seq ROUNDS=$rounds \
      bash scripts/ab_bench.sh "${bin[a]}/flashlab" "${bin[b]}/flashlab" "$files/ab-$causal-$seq"
  done
done

echo "== A/B at a Llama's attention: batch 1, 16 query heads on 4 K/V heads, d = $head_dim, causal (backward ms, in turn)"
seq_list=$(tr ' ' ',' <<<"$seqs")
for round in $(seq "$rounds"); do
  for side in a b; do
    "${bin[$side]}/flashlab" bench --device cuda --variants cuda-fa3-ws --dtype bf16 --batch 1 --heads 16 --heads-kv 4 \
      --head-dim "$head_dim" --seq "$seq_list" --causal top-left --backward --warmup 5 --iters 20 \
      --json "$files/gqa-$side-r$round.json" >/dev/null || status=1
  done
done
python3 - "$files" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
times = {}
for side in "ab":
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{out}/gqa-{side}-r{r}.json"))["rows"]:
            times.setdefault((row["seq_q"], side), []).append(row["backward_ms"])
print(f"{'N':>6} {'A ms':>10} {'B ms':>10} {'B / A':>7}")
for seq in sorted({s for s, _ in times}):
    a, b = statistics.median(times[(seq, "a")]), statistics.median(times[(seq, "b")])
    print(f"{seq:>6} {a:>10.4f} {b:>10.4f} {b / a:>7.3f}")
PY
if [ "${TIMELINE:-0}" = 1 ]; then
  last=${seqs##* }
  "${bin[b]}/flashlab" bench --device cuda --variants cuda-fa3-ws --dtype bf16 --batch 1 --heads 16 --heads-kv 4 \
    --head-dim "$head_dim" --seq "$last" --causal top-left --backward --warmup 3 --iters 10 \
    --timeline "$files/timeline-b-d$head_dim-$last.json" | grep timeline
fi
exit $status
