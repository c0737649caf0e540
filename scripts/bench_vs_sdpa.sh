#!/usr/bin/env bash
# FlashLab's tensor-core variants (default cuda-fa2 and cuda-fa3-ws) against PyTorch's SDPA backends
# (flash = FlashAttention-2 inside PyTorch, cudnn) on the same card, in ONE run, on the FA2-paper shapes:
# bf16, B*N = 16384 tokens, H*d = 2048, N = 512..16k, d = 64, 128 and 256, causal and not. Writes the
# JSONs and prints, per variant, ours / flash / cuDNN TFLOP/s and the ratios to both (forward, and
# forward+backward where the variant has a backward).
#
# On the lent GPU machine, from the repository root, with .deps carried (scripts/make_deps.sh):
#   bash scripts/bench_vs_sdpa.sh "$OUT"        # builds flashlab (preset `device`) first
# The peers' side is the PyTorch SDPA benchmark (sdpa_bench.py): an external script, not part of
# FlashLab, that times torch's scaled_dot_product_attention one backend at a time and reports TFLOP/s
# in the same convention as core/flops.hpp. Copy it into .deps/tools/ (git-ignored) before the device
# call; the machine needs PyTorch with CUDA.
# Environment: VARIANTS (default "cuda-fa2 cuda-fa3-ws"); LADDER=1 also benches cuda-fa3-ws-step1..4 on
# the same shapes and prints the ladder table; SEQS, HEAD_DIMS (default "64 128 256"), CAUSAL (0/1
# lists) narrow the sweep; DTYPES (default "bf16") lists our dtypes: "bf16 e4m3" also times each variant that
# takes e4m3 (the FP8 forward; forward only) as its own column "VARIANT e4m3", beside the same bf16 peers;
# FORWARD_ONLY=1 times the forward alone, ours and the peers' (half the run); SKIP_BUILD=1 reuses build-device; RUN_LABEL goes into the merged JSON's "command" (say which tree ran: the device
# copy's git may be stale).
set -euo pipefail
out=${1:-${OUT:-bench-out}}
mkdir -p "$out"
variants=${VARIANTS:-"cuda-fa2 cuda-fa3-ws"}
[ "${LADDER:-0}" = 1 ] && variants="$variants cuda-fa3-ws-step1 cuda-fa3-ws-step2 cuda-fa3-ws-step3 cuda-fa3-ws-step4"
seqs=${SEQS:-"512 1024 2048 4096 8192 16384"}
head_dims=${HEAD_DIMS:-"64 128 256"}
causals=${CAUSAL:-"0 1"}
dtypes=${DTYPES:-bf16}
tokens=16384 hidden=2048
[ -f .deps/tools/sdpa_bench.py ] ||
  { echo "bench_vs_sdpa: .deps/tools/sdpa_bench.py (the PyTorch SDPA benchmark) is missing: copy it there first" >&2; exit 2; }

[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/device_build.sh flashlab_cmd >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
flashlab=build-device/bin/flashlab

# Ours: per variant, one `flashlab bench` per shape (the batch depends on N), merged into one JSON per
# variant. The backward is timed where the variant has one (the registry refuses --backward otherwise:
# a one-line probe asks it), at the head dims its backward has (else that shape's forward alone).
ours_jsons=()
for variant_dtype in $(for v in $variants; do for t in $dtypes; do echo "$v:$t"; done; done); do
  variant=${variant_dtype%:*} dtype=${variant_dtype#*:}
  label=$variant; [ "$dtype" = bf16 ] || label="$variant $dtype"
  # A dtype the variant does not take: the registry says so in one line, and the variant is left out.
  "$flashlab" bench --device cuda --variants "$variant" --dtype "$dtype" --seq 128 --batch 1 --heads 1 \
    --head-dim 128 --warmup 0 --iters 1 >/dev/null 2>>"$out/ours.log" || continue
  backward=(--backward)
  [ "${FORWARD_ONLY:-0}" = 1 ] && backward=()
  ((${#backward[@]})) && { "$flashlab" bench --device cuda --variants "$variant" --dtype "$dtype" --seq 128 --batch 1 \
    --heads 1 --head-dim 64 --backward --warmup 0 --iters 1 >/dev/null 2>&1 || backward=(); }
  parts=$(mktemp -d)
  for d in $head_dims; do
    for c in $causals; do
      causal=none; [ "$c" = 1 ] && causal=top-left
      for n in $seqs; do
        # Where the variant's backward lacks this head dim (cuda-fa3-ws at d = 256), the forward alone.
        bench_shape() {
          "$flashlab" bench --device cuda --variants "$variant" --dtype "$dtype" --seq "$n" --batch $((tokens / n)) \
            --heads $((hidden / d)) --head-dim "$d" --causal "$causal" "$@" --warmup 5 --iters 20 \
            --json "$parts/d${d}_c${c}_n${n}.json" >/dev/null 2>>"$out/ours.log"
        }
        bench_shape "${backward[@]}" || { ((${#backward[@]})) && bench_shape && echo "$variant d=$d: forward only" >>"$out/ours.log"; } ||
          echo "bench_vs_sdpa: $variant d=$d causal=$c N=$n failed (see ours.log)" >&2
      done
    done
  done
  python3 - "$parts" "$out/flashlab_${label// /_}.json" "$label" <<'PY'
import glob, json, sys
merged = None
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    j = json.load(open(path))
    for r in j["rows"]:
        r["causal"] = j["settings"]["causal"]
    if merged is None:
        merged = {k: j[k] for k in ("device", "date") if k in j}
        merged["command"] = "scripts/bench_vs_sdpa.sh (one flashlab bench per shape)"
        merged["variant"] = sys.argv[3]
        merged["rows"] = []
    merged["rows"] += j["rows"]
json.dump(merged or {"variant": sys.argv[3], "rows": []}, open(sys.argv[2], "w"), indent=1)
PY
  rm -rf "$parts"
  ours_jsons+=("$out/flashlab_${label// /_}.json")
done

# Peers, same shapes, same run.
sdpa_backward=(); [ "${FORWARD_ONLY:-0}" = 1 ] && sdpa_backward=(--no-backward)
PYTHONUNBUFFERED=1 python3 .deps/tools/sdpa_bench.py --head-dim $head_dims --seq $seqs --causal $causals \
  --backends flash cudnn "${sdpa_backward[@]}" --json "$out/sdpa.json" >"$out/sdpa.log" 2>&1 || { tail -20 "$out/sdpa.log"; exit 1; }

# Ratio tables (per variant; the ladder's when its steps ran) and one merged JSON of all result sets,
# the form kept in bench/results/.
python3 scripts/vs_sdpa_table.py --sdpa "$out/sdpa.json" --merged "$out/vs-sdpa.json" \
  --label "scripts/bench_vs_sdpa.sh${RUN_LABEL:+ ($RUN_LABEL)}" "${ours_jsons[@]}"
