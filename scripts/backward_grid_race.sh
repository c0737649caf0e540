#!/usr/bin/env bash
# The cuda-fa3-ws backward on the grids its launch plan weighs (`flashlab bench --backward-grid`), beside the plan's own
# choice, at grouped-query shapes under a causal mask: every grid of a shape in turn, ROUNDS times, then PyTorch's
# cuDNN and flash backends on the same shapes (scripts/sdpa_gqa_bench.py). Prints each grid's median backward time and
# writes $OUT/backward-grid-race.txt. On the lent GPU machine (carry .deps):
#   bash scripts/backward_grid_race.sh "$OUT"
# Environment: SKIP_BUILD=1 uses build-device as it is; ROUNDS (default 3); SHAPES, each BATCH:HEADS:KV_HEADS:HEAD_DIM:SEQ
# (default: a Llama's 16 query heads on 4 K/V heads at d = 64 and 128, 4k and 8k; and wider groups at d = 128);
# GRIDS_64 and GRIDS_128, the grids raced beside the plan's (CONSUMERS,SPLITS,ORDER; a grid whose splits do not
# divide a shape's group is skipped).
set -uo pipefail
out=${1:-${OUT:-grid-race}}
mkdir -p "$out"
rounds=${ROUNDS:-3}
shapes=${SHAPES:-"1:16:4:64:4096 1:16:4:64:8192 1:16:4:128:4096 1:16:4:128:8192 1:32:8:128:4096 1:64:8:128:8192 2:32:8:128:8192"}
grids_64=${GRIDS_64:-"2,1,keys 2,2,keys 2,4,keys 3,2,keys 3,4,keys"}
grids_128=${GRIDS_128:-"2,1,rows 2,1,keys 2,2,keys 2,4,keys"}
log="$out/backward-grid-race.txt"
runs="$out/grid-runs"
mkdir -p "$runs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  bash scripts/device_build.sh flashlab_cmd >"$out/grid-build.log" 2>&1 || { tail -30 "$out/grid-build.log"; exit 1; }
fi
bin=build-device/bin/flashlab
for round in $(seq "$rounds"); do
  for shape in $shapes; do
    IFS=: read -r b h hkv d n <<<"$shape"
    grids=$grids_128; [ "$d" = 64 ] && grids=$grids_64
    for grid in plan $grids; do
      IFS=, read -r _ splits _ <<<"$grid"
      [ "$grid" != plan ] && (( (h / hkv) % splits != 0 )) && continue
      extra=(); [ "$grid" != plan ] && extra=(--backward-grid "$grid")
      "$bin" bench --device cuda --variants cuda-fa3-ws --dtype bf16 --seq "$n" --batch "$b" --heads "$h" \
        --heads-kv "$hkv" --head-dim "$d" --causal top-left --backward --warmup 3 --iters 10 "${extra[@]}" \
        --json "$runs/${shape//:/-}_${grid//,/-}_r$round.json" >/dev/null 2>>"$out/grid-errors.log" ||
        echo "failed: $shape $grid (grid-errors.log)"
    done
  done
done
sdpa_shapes=()
for shape in $shapes; do
  IFS=: read -r b h hkv d n <<<"$shape"
  [ "$b" = 1 ] && sdpa_shapes+=("$n,$d,$h,$hkv")
done
python3 scripts/sdpa_gqa_bench.py --shapes "${sdpa_shapes[@]}" --json "$out/sdpa-gqa.json" >/dev/null 2>"$out/sdpa-gqa.err" ||
  echo "sdpa_gqa_bench failed (sdpa-gqa.err)"
python3 - "$runs" "$out/sdpa-gqa.json" "$rounds" <<'PY' | tee -a "$log"
import glob, json, os, re, statistics, sys
runs, sdpa_path, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
times, chosen = {}, {}
for path in glob.glob(os.path.join(runs, "*.json")):
    shape, grid = re.match(r"(.+)_(plan|\d-\d+-(?:rows|keys))_r\d+\.json", os.path.basename(path)).groups()
    row = json.load(open(path))["rows"][0]
    if row.get("status") != "ok":
        continue
    times.setdefault((shape, grid), []).append(row["backward_ms"])
    if grid == "plan":
        g = row["backward_grid"]
        chosen[shape] = f'{g["consumers"]}-{g["group_splits"]}-{g["order"]}'
sdpa = {}
if os.path.exists(sdpa_path):
    for r in json.load(open(sdpa_path))["rows"]:
        if "backward_ms" in r:
            sdpa[(f'1-{r["heads"]}-{r["kv_heads"]}-{r["head_dim"]}-{r["seq"]}', r["backend"])] = r["backward_ms"]
print(f"cuda-fa3-ws backward, bf16, causal: median of {rounds} rounds (each the median of 10 runs), ms")
print("shape B-H-Hkv-d-N; grid consumers-splits-order; * the plan's choice")
def key(s):
    return tuple(int(x) for x in s.split("-"))
for shape in sorted({s for s, _ in times}, key=key):
    plan = statistics.median(times[(shape, "plan")]) if (shape, "plan") in times else None
    print(f"\n{shape}: the plan takes {chosen.get(shape, '?')}" + (f", {plan:.4f} ms" if plan else ""))
    for (s, grid), v in sorted(times.items()):
        if s != shape or grid == "plan":
            continue
        m = statistics.median(v)
        mark = "*" if grid == chosen.get(shape) else " "
        print(f"  {mark} {grid:10s} {m:.4f}  ({min(v):.4f}..{max(v):.4f})" + (f"  plan / this {plan / m:.3f}" if plan else ""))
    for backend in ("cudnn", "flash"):
        if (shape, backend) in sdpa:
            print(f"    {backend:10s} {sdpa[(shape, backend)]:.4f}  (same run, scripts/sdpa_gqa_bench.py)")
PY
