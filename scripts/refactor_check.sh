#!/usr/bin/env bash
# A restructuring of kernel code, checked on the GPU machine in two calls: does the code the GPU runs stay
# the same, and its speed? BEFORE is the tree before the change (e.g. `git archive HEAD` unpacked under
# out/, carried beside .deps); the working tree is the change.
#   bash scripts/refactor_check.sh build BEFORE OUT   build both trees side by side; compare every cuda-fa3-ws
#                                                     kernel's SASS, before against after (names aside); the
#                                                     GPU suites (ctest -L gpu) and the kernel build checks
#                                                     (ctest -L cuda-build) on the change
#   bash scripts/refactor_check.sh check BEFORE OUT   compute-sanitizer (memcheck, synccheck, initcheck) on
#                                                     cuda-fa3-ws forward and backward; the same-run A/B
#                                                     (scripts/ab_bench.sh) at d = 64, 128, 256, N = 4k and
#                                                     16k, causal and not, forward and backward
#   bash scripts/refactor_check.sh sass BEFORE OUT    the SASS comparison alone, naming the functions that differ
set -uo pipefail
usage="usage: refactor_check.sh build|check|sass BEFORE OUT"
phase=${1:?$usage} before=${2:?$usage} out=${3:?$usage}
mkdir -p "$out"
bin=build-device/bin
build_both() {  # the change's targets ($@, default all) and the tree before's flashlab, side by side
  ln -sfn "$PWD/.deps" "$before/.deps"
  (cd "$before" && bash scripts/device_build.sh flashlab_cmd) >"$out/build-before.log" 2>&1 &
  local pid=$!
  bash scripts/device_build.sh "$@" >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  wait "$pid" || { tail -30 "$out/build-before.log"; exit 1; }
}
compare_sass() {  # every function whose name holds fa3_ws, before against after, names aside
  echo "== SASS of every cuda-fa3-ws kernel, before and after (function names aside)"
  local started=$SECONDS
  for side in before after; do
    b=$bin/flashlab; [ "$side" = before ] && b=$before/$bin/flashlab
    cuobjdump --dump-sass "$b" >"$out/sass-$side.txt"
  done
  echo "cuobjdump --dump-sass of both binaries: $((SECONDS - started)) s"
  python3 - "$out/sass-before.txt" "$out/sass-after.txt" "$out/sass-differences.txt" <<'PY'
import collections, difflib, hashlib, re, sys
def kernels(path):
    bodies, name, lines = {}, None, []
    def keep():
        if name and ("fa3_ws" in name or "fa3ws" in name): bodies[name] = "".join(lines)
    for line in open(path):
        if "Function : " in line:
            keep()
            name, lines = line.split("Function : ")[1].strip(), []
        elif re.match(r"\s*(Fatbin |=+$|arch = |code version = |host = |compile_size = |identifier = |producer = |compressed)", line):
            pass  # the header of the next cubin in the dump (its source path among it), not this function's code
        elif name is not None:
            lines.append(re.sub(r"^\s*/\*[0-9a-f]{4,}\*/", "", line))
    keep()
    return bodies
before, after = kernels(sys.argv[1]), kernels(sys.argv[2])
h = lambda b: hashlib.sha1(b.encode()).hexdigest()
hb = collections.Counter(h(b) for b in before.values())
ha = collections.Counter(h(b) for b in after.values())
same = sum((hb & ha).values())
print(f"sass: {len(before)} cuda-fa3-ws functions before, {len(after)} after, {same} with identical SASS")
with open(sys.argv[3], "w") as f:
    only_b = [n for n, b in before.items() if h(b) not in ha]
    only_a = [n for n, b in after.items() if h(b) not in hb]
    for n in only_b: print("before only:", n, file=f)
    for n in only_a: print("after only: ", n, file=f)
    # the closest pair, diffed
    for nb in only_b:
        best = max(only_a, key=lambda na: difflib.SequenceMatcher(None, nb, na).ratio(), default=None)
        if best is None: continue
        d = list(difflib.unified_diff(before[nb].splitlines(), after[best].splitlines(), lineterm="", n=1))
        print(f"--- {nb}\n+++ {best}: {len(d)} diff lines", file=f)
        print("\n".join(d[:60]), file=f)
print(open(sys.argv[3]).read()[:3000])
sys.exit(0 if len(before) == len(after) == same else 1)
PY
  echo "sass compare: exit $?"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device-$phase.txt"
started=$SECONDS
left() { echo $((570 - (SECONDS - started))); }
if [ "$phase" = build ]; then
  build_both
  compare_sass
  echo "== GPU tests (ctest -L gpu)"
  source scripts/python_path.sh build-device >/dev/null
  ctest --test-dir build-device -L gpu --output-on-failure >"$out/ctest-gpu.log" 2>&1
  echo "ctest -L gpu: exit $?"; tail -8 "$out/ctest-gpu.log"
  echo "== kernel build checks (ctest -L cuda-build)"
  ctest --test-dir build-device -L cuda-build --output-on-failure >"$out/ctest-cuda-build.log" 2>&1
  echo "ctest -L cuda-build: exit $?"; grep -E "Passed|Failed|Skipped|kernels in the SASS|functions compiled" "$out/ctest-cuda-build.log"
  exit 0
fi
if [ "$phase" = sass ]; then  # the SASS comparison alone, and how long the build's SASS checks take here
  build_both flashlab_cmd; compare_sass
  for check in "check_sass_hopper.sh $(command -v cuobjdump) $bin/flashlab 140" "check_sass_hmma.sh $(command -v cuobjdump) $bin/flashlab 48"; do
    t0=$SECONDS; bash tests/$check >"$out/sass-check.txt" 2>&1; echo "tests/${check%% *}: exit $?, $((SECONDS - t0)) s: $(tail -1 "$out/sass-check.txt")"
  done
  exit 0
fi
[ "$phase" = check ] || { echo "$usage"; exit 2; }
# A fresh machine: build what this phase needs, and say again which kernels' SASS differ.
if [ ! -x "$bin/flashlab" ] || [ ! -x "$before/$bin/flashlab" ]; then build_both flashlab_cmd; fi
compare_sass
for check in "check_sass_hopper.sh $(command -v cuobjdump) $bin/flashlab 140" "check_sass_hmma.sh $(command -v cuobjdump) $bin/flashlab 48"; do
  t0=$SECONDS; bash tests/$check >"$out/sass-check.txt" 2>&1; echo "tests/${check%% *}: exit $?, $((SECONDS - t0)) s: $(tail -1 "$out/sass-check.txt")"
done
echo "== A/B, before and after, alternating rounds"
for seq in 4096 16384; do
  for causal in none bottom-right; do
    VARIANT=cuda-fa3-ws HEAD_DIMS="64 128 256" SEQ=$seq CAUSAL=$causal ROUNDS=${ROUNDS:-3} \
      bash scripts/ab_bench.sh "$before/$bin/flashlab" "$bin/flashlab" "$out/ab-$seq-$causal" | tee "$out/ab-$seq-$causal.txt"
  done
done
echo "A/B done at $((SECONDS - started)) s"
echo "== compute-sanitizer on cuda-fa3-ws (while the call has time)"
san() {  # tool log args...
  local tool=$1 log=$2; shift 2
  if (($(left) < 60)); then echo "$tool $log: skipped, the call's time is spent"; return; fi
  timeout "$(left)" compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/flashlab" check --dtype bf16 "$@" >"$out/$log" 2>&1
  echo "$tool $log: exit $? ($(grep -E 'ERROR SUMMARY' "$out/$log" | tail -1))"
}
for tool in memcheck synccheck initcheck; do
  san "$tool" "san-$tool-fwd.txt" --variants cuda-fa3-ws-step1,cuda-fa3-ws-step2,cuda-fa3-ws-step3,cuda-fa3-ws-step4,cuda-fa3-ws \
    --batch 2 --heads 4 --heads-kv 2 --seq-q 200 --seq-k 333 --head-dim 128 --causal bottom-right --dropout 0.1
done
for tool in memcheck synccheck initcheck; do
  san "$tool" "san-$tool-bwd-d128.txt" --variants cuda-fa3-ws --batch 2 --heads 4 --heads-kv 2 --seq-q 300 \
    --seq-k 333 --head-dim 128 --causal bottom-right --dropout 0.1 --backward
  san "$tool" "san-$tool-wide.txt" --variants cuda-fa3-ws-step2,cuda-fa3-ws-step4,cuda-fa3-ws \
    --batch 1 --heads 4 --heads-kv 2 --seq-q 200 --seq-k 2100 --head-dim 64 --causal bottom-right
done
for tool in memcheck synccheck initcheck; do
  for d in 64 256; do
    san "$tool" "san-$tool-bwd-d$d.txt" --variants cuda-fa3-ws --batch 2 --heads 4 --heads-kv 2 --seq-q 300 \
      --seq-k 333 --head-dim "$d" --causal bottom-right --dropout 0.1 --backward
  done
done
echo "done at $((SECONDS - started)) s"
