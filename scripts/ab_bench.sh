#!/usr/bin/env bash
# Same-run A/B of two flashlab binaries on the GPU: does a change move a kernel's speed beyond noise?
# Runs `flashlab bench` of BEFORE and AFTER alternately, ROUNDS times, on the same shapes (bf16, N = 4k,
# B*N = 16384 tokens, H*d = 2048, forward and backward), and prints each side's median of the rounds'
# medians with the spread (min..max) across rounds, and the after/before ratio.
#   bash scripts/ab_bench.sh BEFORE_BIN AFTER_BIN OUT_DIR
# Environment: VARIANT (default cuda-fa2), HEAD_DIMS (default "64 128"), CAUSAL (default none),
# SEQ (default 4096), ROUNDS (default 5).
set -euo pipefail
before=$1 after=$2 out=$3
variant=${VARIANT:-cuda-fa2}
head_dims=${HEAD_DIMS:-"64 128"}
causal=${CAUSAL:-none}
seq=${SEQ:-4096}
rounds=${ROUNDS:-5}
tokens=16384 hidden=2048
mkdir -p "$out"
for round in $(seq "$rounds"); do
  for side in before after; do
    bin=$before; [ "$side" = after ] && bin=$after
    for d in $head_dims; do
      "$bin" bench --device cuda --variants "$variant" --dtype bf16 --seq "$seq" --batch $((tokens / seq)) \
        --heads $((hidden / d)) --head-dim "$d" --causal "$causal" --backward --warmup 5 --iters 20 \
        --json "$out/ab_${side}_d${d}_r${round}.json" >/dev/null
    done
  done
done
python3 - "$out" "$variant" "$causal" <<'EOF'
import glob, json, os, re, statistics, sys
out, variant, causal = sys.argv[1:]
runs = {}
for path in glob.glob(os.path.join(out, "ab_*_d*_r*.json")):
    side, d = re.match(r"ab_(before|after)_d(\d+)_r\d+\.json", os.path.basename(path)).groups()
    row = json.load(open(path))["rows"][0]
    for key in ("forward_ms", "backward_ms"):
        runs.setdefault((int(d), key, side), []).append(row[key])
print(f"A/B {variant}, bf16, causal {causal}: median of rounds (min..max), ms")
print(f"{'d':>4} {'pass':>9} {'before':>22} {'after':>22} {'after/before':>13}")
for d in sorted({k[0] for k in runs}):
    for key in ("forward_ms", "backward_ms"):
        b, a = runs[(d, key, "before")], runs[(d, key, "after")]
        fmt = lambda v: f"{statistics.median(v):.4f} ({min(v):.4f}..{max(v):.4f})"
        print(f"{d:>4} {key[:-3]:>9} {fmt(b):>22} {fmt(a):>22} {statistics.median(a) / statistics.median(b):>13.3f}")
EOF
