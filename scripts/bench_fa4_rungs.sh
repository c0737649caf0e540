#!/usr/bin/env bash
# FlashAttention-4's two softmax ideas as ladder rungs, timed beside the shipped kernel in one call on the lent GPU
# machine: cuda-fa3-ws-eager-rescale (step 6: the lazy rescale off), cuda-fa3-ws (step 5, what ships) and
# cuda-fa3-ws-exp2-emulated (step 7: 1 column group of P in 8 by exp2_poly), forward, bf16, at the FA2 paper's
# setting (B x N = 16k tokens, H x d = 2048), d = 64, 128, 256, causal and not, ROUNDS rounds with the variants'
# order reversed every other round; then each one's timeline at N = 8k, unmasked (d = 128 and 256), for the consumer
# warpgroups' softmax and waiting shares. Writes $1/fa4-rungs.json (what scripts/readme_tables.py's kind fa4-rungs reads; copy it to
# bench/results/<device>-fa3-ws-fa4-rungs_<date>.json) and prints its table.
#   device run: bash scripts/bench_fa4_rungs.sh "$OUT"     (carry .deps; make it with scripts/make_deps.sh)
# Environment: SEQS (default "4096 8192 16384"), ROUNDS (default 2), BUILD=0 to use build-device as it is.
set -uo pipefail
out=${1:-${OUT:-rungs-out}}
seqs=${SEQS:-"4096 8192 16384"}
rounds=${ROUNDS:-2}
mkdir -p "$out"
work=$(mktemp -d)
status=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
if [ "${BUILD:-1}" = 1 ]; then
  bash scripts/device_build.sh >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
fi
bin=build-device/bin/flashlab
rungs=(cuda-fa3-ws-eager-rescale cuda-fa3-ws cuda-fa3-ws-exp2-emulated)
tokens=16384 hidden=2048
for round in $(seq "$rounds"); do
  order=("${rungs[@]}")
  ((round % 2 == 0)) && order=("${rungs[2]}" "${rungs[1]}" "${rungs[0]}")
  list=$(IFS=,; echo "${order[*]}")
  for d in 64 128 256; do
    for causal in none top-left; do
      for seq in $seqs; do
        "$bin" bench --device cuda --variants "$list" --dtype bf16 --seq "$seq" --batch $((tokens / seq)) \
          --heads $((hidden / d)) --head-dim "$d" --causal "$causal" --warmup 5 --iters 20 \
          --json "$work/bench-r$round-d$d-$causal-$seq.json" >/dev/null || status=1
      done
    done
  done
done
# The timelines at d = 128 and 256 only: at d = 64 with 8k keys steps 5-7 run three consumer warpgroups, which have no
# registers to spare for the recording (`bench --timeline` refuses them: cuda/tilings.hpp, forward_timeline_records).
for d in 128 256; do
  for v in "${rungs[@]}"; do
    "$bin" bench --device cuda --variants "$v" --dtype bf16 --seq 8192 --batch 2 --heads $((hidden / d)) \
      --head-dim "$d" --warmup 3 --iters 10 --timeline "$work/timeline-$v-d$d.json" \
      --json "$work/timeline-$v-d$d.bench.json" | grep "timeline:" | sed "s|^|$v d=$d: |" || status=1
  done
done
python3 - "$work" "$out/fa4-rungs.json" "$rounds" <<'PY'
import glob, json, os, statistics, sys
work, dest, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = {}
device = date = None
for path in sorted(glob.glob(f"{work}/bench-r*.json")):
    j = json.load(open(path))
    device, date = j["device"], date or j["date"]
    causal = j["settings"]["causal"] != "none"
    for r in j["rows"]:
        if r["status"] != "ok":
            raise SystemExit(f"{path}: {r['variant']} did not run: {r['status']}")
        key = (r["variant"], r["head_dim"], causal, r["seq_q"])
        runs.setdefault(key, {"ms": [], "tflops": [], "batch": r["batch"], "heads": r["heads_q"]})
        runs[key]["ms"].append(r["forward_ms"])
        runs[key]["tflops"].append(r["forward_tflops"])
rows = [{"variant": v, "head_dim": d, "causal": c, "seq": n, "batch": x["batch"], "heads": x["heads"],
         "forward_ms": x["ms"], "forward_tflops_median": statistics.median(x["tflops"])}
        for (v, d, c, n), x in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], kv[0][0]))]
timelines = []
for path in sorted(glob.glob(f"{work}/timeline-*.bench.json")):
    j = json.load(open(path))
    r = j["rows"][0]
    t = r["timeline"]
    timelines.append({"variant": r["variant"], "head_dim": r["head_dim"], "seq": r["seq_q"], "batch": r["batch"],
                      "heads": r["heads_q"], "causal": False, "forward_ms": r["forward_ms"],
                      "recording_ms": t["recording_ms"], "consumer_softmax_share": t["consumer_softmax_share"],
                      "consumer_waiting_share": t["consumer_waiting_share"], "consumer_lanes": t["consumer_lanes"],
                      "buffer_filled": t["buffer_filled"]})
result = {"device": device, "date": date, "command": "bash scripts/bench_fa4_rungs.sh",
          "setting": f"bf16 forward, B x N = 16384 tokens, H x d = 2048; {rounds} rounds (variants in turn, the order "
                     "reversed every other round), warmup 5, iters 20; timelines at N = 8192, B = 2, unmasked",
          "rows": rows, "timelines": timelines}
json.dump(result, open(dest, "w"), indent=1)
by = {(r["variant"], r["head_dim"], r["causal"], r["seq"]): r["forward_tflops_median"] for r in rows}
print(f"{'d':>4} {'causal':>6} {'N':>6} {'eager':>7} {'ships':>7} {'exp2':>7} {'eager/ships':>11} {'exp2/ships':>10}")
for (v, d, c, n), tf in sorted(by.items(), key=lambda kv: kv[0][1:]):
    if v != "cuda-fa3-ws":
        continue
    e, x = by[("cuda-fa3-ws-eager-rescale", d, c, n)], by[("cuda-fa3-ws-exp2-emulated", d, c, n)]
    print(f"{d:>4} {'yes' if c else 'no':>6} {n:>6} {e:>7.0f} {tf:>7.0f} {x:>7.0f} {e / tf:>11.3f} {x / tf:>10.3f}")
for t in timelines:
    print(f"timeline {t['variant']} d={t['head_dim']}: softmax {100 * t['consumer_softmax_share']:.1f}%, waiting "
          f"{100 * t['consumer_waiting_share']:.1f}% of a consumer's time ({t['consumer_lanes']} lanes)")
PY
[ $? = 0 ] || status=1
rm -rf "$work"
exit $status
