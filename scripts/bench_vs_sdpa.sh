#!/usr/bin/env bash
# cuda-fa2 against PyTorch's SDPA backends (flash = FlashAttention-2 inside PyTorch, cudnn) on the
# same card, in ONE run, on the FA2-paper shapes: bf16, B*N = 16384 tokens, H*d = 2048, N = 512..16k,
# d = 64 and 128, causal and not. Writes both JSONs and prints the ratio table (ours / flash).
#
# On the lent GPU machine, from the repository root, with .deps carried (scripts/make_deps.sh):
#   bash scripts/bench_vs_sdpa.sh "$OUT"        # builds flashlab (preset `device`) first
# Environment: SEQS, HEAD_DIMS, CAUSAL (0/1 lists) narrow the sweep; SKIP_BUILD=1 reuses build-device.
set -euo pipefail
out=${1:-${OUT:-bench-out}}
mkdir -p "$out"
seqs=${SEQS:-"512 1024 2048 4096 8192 16384"}
head_dims=${HEAD_DIMS:-"64 128"}
causals=${CAUSAL:-"0 1"}
tokens=16384 hidden=2048

[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/device_build.sh flashlab_cmd >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
flashlab=build-device/bin/flashlab

# Ours: one `flashlab bench` per shape (the batch depends on N), merged into one JSON.
parts=$(mktemp -d)
for d in $head_dims; do
  for c in $causals; do
    causal=none; [ "$c" = 1 ] && causal=top-left
    for n in $seqs; do
      "$flashlab" bench --device cuda --variants cuda-fa2 --dtype bf16 --seq "$n" --batch $((tokens / n)) \
        --heads $((hidden / d)) --head-dim "$d" --causal "$causal" --backward --warmup 5 --iters 20 \
        --json "$parts/d${d}_c${c}_n${n}.json" >/dev/null 2>>"$out/ours.log"
    done
  done
done
python3 - "$parts" "$out/flashlab_cuda-fa2.json" <<'EOF'
import glob, json, sys
merged = None
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    j = json.load(open(path))
    for r in j["rows"]:
        r["causal"] = j["settings"]["causal"]
    if merged is None:
        merged = {k: j[k] for k in ("device", "date") if k in j}
        merged["command"] = "scripts/bench_vs_sdpa.sh (one flashlab bench per shape)"
        merged["rows"] = []
    merged["rows"] += j["rows"]
json.dump(merged, open(sys.argv[2], "w"), indent=1)
EOF

# Peers, same shapes, same run.
PYTHONUNBUFFERED=1 python3 .deps/tools/sdpa_bench.py --head-dim $head_dims --seq $seqs --causal $causals \
  --backends flash cudnn --json "$out/sdpa.json" >"$out/sdpa.log" 2>&1 || { tail -20 "$out/sdpa.log"; exit 1; }

# Ratio table: TFLOP/s ours / flash (forward, forward+backward); cudnn for reference.
python3 - "$out/flashlab_cuda-fa2.json" "$out/sdpa.json" <<'EOF'
import json, sys
ours = json.load(open(sys.argv[1]))
peers = json.load(open(sys.argv[2]))
def key(d, causal, n): return (d, bool(causal), n)
flops = lambda b, h, n, d, causal: 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
mine = {}
for r in ours["rows"]:
    if r.get("status") != "ok": continue
    causal = r["causal"] != "none"
    f = flops(r["batch"], r["heads_q"], r["seq_q"], r["head_dim"], causal)
    fwd = f / r["forward_ms"] / 1e9
    both = 3.5 * f / (r["forward_ms"] + r["backward_ms"]) / 1e9 if r.get("backward_ms", -1) > 0 else float("nan")
    mine[key(r["head_dim"], causal, r["seq_q"])] = (fwd, both)
peer = {}
for r in peers:
    if "fwd_tflops" in r: peer[(r["backend"],) + key(r["head_dim"], r["causal"], r["seq"])] = (r["fwd_tflops"], r.get("fwdbwd_tflops", float("nan")))
print(f"# {ours.get('device', '?')}: bf16, B*N = 16384, H*d = 2048; TFLOP/s (fwd | fwd+bwd)")
print(f"{'d':>3} {'causal':>6} {'N':>6} | {'ours':>11} | {'flash':>11} | {'cudnn':>11} | {'fwd ratio':>9} {'f+b ratio':>9}")
for k in sorted(mine):
    o = mine[k]; f = peer.get(("flash",) + k, (float("nan"),) * 2); c = peer.get(("cudnn",) + k, (float("nan"),) * 2)
    print(f"{k[0]:>3} {int(k[1]):>6} {k[2]:>6} | {o[0]:5.0f} {o[1]:5.0f} | {f[0]:5.0f} {f[1]:5.0f} | {c[0]:5.0f} {c[1]:5.0f} | "
          f"{o[0] / f[0]:9.2f} {o[1] / f[1]:9.2f}")
EOF
