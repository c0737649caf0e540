#!/usr/bin/env bash
# What FP8 attention costs before its forward: the quantizing pre-pass from bf16 activations (per-head amax and scale,
# e4m3), with and without FlashAttention-3's Hadamard rotation of Q and K, beside the FP8 forward itself, on the
# FA2-paper shapes (B N = 16k tokens, H d = 2048). One `flashlab bench --dtype e4m3 --quantize-from bf16 [--rotate]`
# per shape, merged into OUT/fp8-prepass.json: the form kept in bench/results/ (scripts/readme_tables.py, kind
# fp8-prepass, makes its table).
# On the lent GPU machine, from the repository root: bash scripts/bench_fp8_prepass.sh OUT (SKIP_BUILD=1 reuses
# build-device). Environment: HEAD_DIMS (default "64 128 256"), SEQS (default "1024 4096 16384"), CAUSAL ("0 1").
set -euo pipefail
out=${1:-${OUT:-fp8-prepass-out}}
mkdir -p "$out"
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/device_build.sh flashlab_cmd >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
flashlab=build-device/bin/flashlab
parts=$(mktemp -d)
for d in ${HEAD_DIMS:-64 128 256}; do
  for c in ${CAUSAL:-0 1}; do
    causal=none; [ "$c" = 1 ] && causal=top-left
    for n in ${SEQS:-1024 4096 16384}; do
      for rotate in 0 1; do
        flag=(); [ "$rotate" = 1 ] && flag=(--rotate)
        "$flashlab" bench --device cuda --variants cuda-fa3-ws --dtype e4m3 --quantize-from bf16 "${flag[@]}" \
          --seq "$n" --batch $((16384 / n)) --heads $((2048 / d)) --head-dim "$d" --causal "$causal" --warmup 5 \
          --iters 20 --json "$parts/d${d}_c${c}_n${n}_r${rotate}.json" >>"$out/prepass.log" 2>&1 ||
          echo "bench_fp8_prepass: d=$d causal=$c N=$n rotate=$rotate failed (see prepass.log)" >&2
      done
    done
  done
done
python3 - "$parts" "$out/fp8-prepass.json" <<'PY'
import glob, json, sys
merged, by_shape = None, {}
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    j = json.load(open(path))
    rotate = j["settings"]["fp8_prepass"]["rotate"]
    for r in j["rows"]:
        if r["status"] != "ok":
            continue
        key = (r["head_dim"], j["settings"]["causal"], r["seq_q"])
        row = by_shape.setdefault(key, {"head_dim": key[0], "causal": key[1], "seq": key[2], "batch": r["batch"],
                                        "heads": r["heads_q"]})
        row["rotated" if rotate else "plain"] = {"forward_ms": r["forward_ms"], "prepass_ms": r["prepass_ms"],
                                                 "forward_tflops": r["forward_tflops"]}
    if merged is None:
        merged = {k: j[k] for k in ("device", "date")}
        merged["command"] = "scripts/bench_fp8_prepass.sh (flashlab bench --dtype e4m3 --quantize-from bf16 [--rotate])"
merged = merged or {}
merged["rows"] = [by_shape[k] for k in sorted(by_shape)]
json.dump(merged, open(sys.argv[2], "w"), indent=1)
print(f"wrote {sys.argv[2]}: {len(merged['rows'])} shapes")
PY
rm -rf "$parts"
