#!/usr/bin/env bash
# The app, headless under Xvfb: renders scenarios and checks each PNG is non-trivial and shows the
# expected tile states (viz_png_check reads the pixel at the centre of each named tile, using the
# rectangles the app dumps with --dump-layout). The step at which a tile must be in SRAM comes from
# the library's own event list (`flashlab trace --events`), not from the app.
# Usage: render_test.sh VIZ PNG_CHECK SCENARIO_DIR OUT_DIR FLASHLAB
set -uo pipefail
viz=$1 check=$2 scenarios=$3 out=$4 flashlab=$5
mkdir -p "$out"
failures=0
fail() { echo "render_test: FAIL: $*" >&2; failures=$((failures + 1)); }
shot() { xvfb-run -a -s "-screen 0 1920x1200x24" "$viz" "$@"; }

# 1. FA2 at the step where query block 1 loads K_2 (event index from the library's CSV).
k=$("$flashlab" trace --algorithm fa2 --seq-q 256 --head-dim 64 --sram-bytes 16384 --events |
    awk -F, '$4 == "K" && $5 == "load" && $11 == 1 && $7 == 2 { print $1; exit }')
[ -n "$k" ] || fail "no 'load K_2 in query block 1' event in flashlab trace --events"
shot --scenario "$scenarios/fa2-small.json" --step $((k + 1)) --screenshot "$out/fa2-step.png" \
     --dump-layout "$out/fa2-step.json" || fail "fa2-small did not render"
"$check" "$out/fa2-step.png" "$out/fa2-step.json" K/2=in_sram V/2=done Q/1=in_sram O/1=in_sram \
  score/1,2=in_sram K/1=done Q/0=done score/0,7=done score/1,1=done Q/2=pending score/1,3=pending \
  score/7,7=pending || fail "fa2 at step $((k + 1))"

# 2. Causal FA1 at the end: the upper triangle is skipped, the rest done.
shot --algorithm fa1 --seq 256 --head-dim 64 --sram-bytes 16384 --causal --panels controls,tiles,memory \
     --size 1200x800 --screenshot "$out/fa1-causal.png" --dump-layout "$out/fa1-causal.json" || fail "fa1 causal did not render"
"$check" "$out/fa1-causal.png" "$out/fa1-causal.json" score/0,7=skipped score/2,5=skipped score/7,0=done \
  score/7,7=done score/3,3=done K/0=done O/7=done || fail "fa1 causal at the end"

# 3. One scenario of each kind of panel renders non-trivially: every panel at once (the README's overview,
# with the Plots panel's sweeps and the GPU level), a recorded pipeline timeline, the ring, and the FP8 study.
# The other figure scenarios are rendered and checked the same way where figures are made
# (scripts/make_figures.sh).
for name in readme-overview pipeline-h100-d128 lesson09-ring lesson10-fp8-error; do
  f="$scenarios/$name.json"
  shot --scenario "$f" --screenshot "$out/$name.png" --dump-layout "$out/$name.json" || { fail "$name did not render"; continue; }
  "$check" "$out/$name.png" "$out/$name.json" --min-colours 300 || fail "$name is blank or trivial"
done

# 4. The first frame does not wait for the panels' workers: --no-wait saves it while the Plots panel's
# sweeps still run, and it is drawn (not blank).
shot --scenario "$scenarios/readme-overview.json" --no-wait --screenshot "$out/first-frame.png" \
     --dump-layout "$out/first-frame.json" || fail "the first frame did not render"
"$check" "$out/first-frame.png" "$out/first-frame.json" --min-colours 300 || fail "the first frame is blank or trivial"

# 5. Bad input: one sentence and exit 2, never a crash.
printf '{"seq": 256, "sram_bytes": 100}' > "$out/bad.json"
msg=$("$viz" --scenario "$out/bad.json" --screenshot "$out/never.png" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "bad scenario: exit $rc, want 2"
echo "$msg" | grep -q "bad.json" || fail "bad scenario message does not name the file: $msg"
msg=$("$viz" --algorithm fa3 --screenshot "$out/never.png" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$msg" | grep -q "unknown algorithm" || fail "--algorithm fa3: exit $rc, '$msg'"
[ ! -e "$out/never.png" ] || fail "a screenshot was written for bad input"

# 6. No display and no --screenshot: one sentence, non-zero exit.
msg=$(env -u DISPLAY -u WAYLAND_DISPLAY "$viz" --scenario "$scenarios/fa2-small.json" 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && echo "$msg" | grep -q "no display" || fail "without a display: exit $rc, '$msg'"

[ $failures -eq 0 ] && echo "render_test: all checks passed" || echo "render_test: $failures failure(s)"
exit $(( failures > 0 ))
