#!/usr/bin/env bash
# cuda-fa2 against PyTorch's SDPA backends (flash = FlashAttention-2 inside PyTorch, cudnn) on the
# same card, in ONE run, on the FA2-paper shapes: bf16, B*N = 16384 tokens, H*d = 2048, N = 512..16k,
# d = 64 and 128, causal and not. Writes both JSONs and prints the ratio table (ours / flash).
#
# On the lent GPU machine, from the repository root, with .deps carried (scripts/make_deps.sh):
#   bash scripts/bench_vs_sdpa.sh "$OUT"        # builds flashlab (preset `device`) first
# The peers' side is the PyTorch SDPA benchmark (sdpa_bench.py): an external script, not part of
# FlashLab, that times torch's scaled_dot_product_attention one backend at a time and reports TFLOP/s
# in the same convention as core/flops.hpp. Copy it into .deps/tools/ (git-ignored) before the device
# call; the machine needs PyTorch with CUDA.
# Environment: SEQS, HEAD_DIMS, CAUSAL (0/1 lists) narrow the sweep; SKIP_BUILD=1 reuses build-device;
# RUN_LABEL goes into the merged JSON's "command" (say which tree ran: the device copy's git may be stale).
set -euo pipefail
out=${1:-${OUT:-bench-out}}
mkdir -p "$out"
seqs=${SEQS:-"512 1024 2048 4096 8192 16384"}
head_dims=${HEAD_DIMS:-"64 128"}
causals=${CAUSAL:-"0 1"}
tokens=16384 hidden=2048
[ -f .deps/tools/sdpa_bench.py ] ||
  { echo "bench_vs_sdpa: .deps/tools/sdpa_bench.py (the PyTorch SDPA benchmark) is missing: copy it there first" >&2; exit 2; }

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

# Ratio table (ours / flash, cudnn beside) and one merged JSON of both result sets, the form kept in
# bench/results/.
python3 scripts/fa2_vs_sdpa_table.py "$out/flashlab_cuda-fa2.json" "$out/sdpa.json" "$out/fa2-vs-sdpa.json" \
  "scripts/bench_vs_sdpa.sh${RUN_LABEL:+ ($RUN_LABEL)}"
