#!/usr/bin/env bash
# The app driven the way a student drives it in lesson 02: real key presses and mouse clicks (xdotool, through
# the X server) into the window on a private Xvfb, each checked against what the app itself says it shows
# (--state-file, rewritten after every frame in which something changed). It steps with the arrow keys, picks
# another algorithm in the Controls panel's combo box with the mouse, opens a panel by clicking its checkbox,
# clicks into a text field (where the arrows belong to the field) and gives the keys back with Escape; after
# each action F12 makes the app save its window as a PNG, whose pixels must differ from the one before
# (viz_png_check --differ). Where to click comes from the app (the widgets' rectangles in the state file), never
# from pixels written here.
# Usage: drive_test.sh VIZ PNG_CHECK SCENARIO OUT_DIR
# Exit 77 (CTest: skipped) only when xdotool or Xvfb is missing; any failure: one sentence and exit 1.
set -uo pipefail
viz=$(realpath "$1") check=$(realpath "$2") scenario=$(realpath "$3") out=$4  # the app runs in $out/shots
kWait=5          # seconds to wait at most for any one thing the app should do (a loaded 2-core CI machine)
kFirstWait=10    # ... and for the first frame (the GL context, recording the trace); both well inside the CTest timeout
kLifetime=120    # Xvfb and the app end by themselves after this, should CTest kill this script first

for tool in xdotool Xvfb; do
  if ! command -v "$tool" >/dev/null; then
    echo "drive_test: skipped: $tool is not installed (scripts/setup.sh installs it)"
    exit 77
  fi
done

rm -rf "$out" && mkdir -p "$out/shots" || { echo "drive_test: FAIL: cannot make $out"; exit 1; }
state=$out/state.json
app="" xvfb=""
cleanup() {
  [ -n "$app" ] && kill "$app" 2>/dev/null && wait "$app" 2>/dev/null
  [ -n "$xvfb" ] && kill "$xvfb" 2>/dev/null && wait "$xvfb" 2>/dev/null
}
trap cleanup EXIT
fail() {
  echo "drive_test: FAIL: $*"
  if [ -s "$state" ]; then echo "drive_test: the app's last state ($state):"; sed 's/^/  /' "$state"; fi
  [ -s "$out/app.log" ] && { echo "drive_test: the app's output:"; sed 's/^/  /' "$out/app.log"; }
  exit 1
}

t0=$EPOCHREALTIME
# One line of progress, with the seconds since the start: where the time goes, and how far it got.
note() {
  awk -v now="$EPOCHREALTIME" -v t0="$t0" -v what="$*" 'BEGIN { printf "drive_test: %5.2f s  %s\n", now - t0, what }'
}
# A field of the state file: `field step` -> 190, `field algorithm` -> fa2, `field panels` -> [controls, tiles].
field() { sed -n "s/^ \"$1\": \(.*\),\$/\1/p" "$state" 2>/dev/null | tr -d '"'; }
# A widget's centre in window pixels ("116 75"), empty while the app does not draw it.
centre() {
  sed -n "s|^  \"$1\": \[\(.*\)\],\{0,1\}\$|\1|p" "$state" 2>/dev/null |
    awk -F', ' 'NF == 4 { printf "%d %d\n", ($1 + $3) / 2, ($2 + $4) / 2 }'
}
# wait_for SECONDS COMMAND...: polls COMMAND every 50 ms until it holds (0) or SECONDS pass (1); fails at once
# if the app exits meanwhile.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    if ! kill -0 "$app" 2>/dev/null; then
      wait "$app"
      local rc=$?
      app=""
      fail "the app exited (code $rc) during the test."
    fi
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.05
  done
}
is() { [ "$(field "$1")" = "$2" ]; }
has_widget() { [ -n "$(centre "$1")" ]; }
no_widget() { [ -z "$(centre "$1")" ]; }
panel_shown() { field panels | tr -d '[] ' | tr ',' '\n' | grep -qx "$1"; }

# Press KEYS (xdotool names, several: one tap each, 12 ms apart) and wait until the step is WANT.
step_with() {
  local want=$1; shift
  xdotool key "$@" || fail "xdotool could not press '$*'."
  wait_for $kWait is step "$want" || fail "after pressing '$*' the step is $(field step), not $want (waited $kWait s)."
  note "keys $*: step $want"
}
# Click the named widget's centre, where the app's last frame drew it.
click() {
  local xy
  xy=$(centre "$1")
  [ -n "$xy" ] || fail "the app does not report where '$1' is, so it cannot be clicked."
  # shellcheck disable=SC2086  # two numbers
  xdotool mousemove --window "$win" $xy click 1 || fail "xdotool could not click $1 at ($xy)."
  note "clicked $1 at ($xy)"
}
# F12, then check the app saved a new PNG whose picture differs from the last one's ($1 names the action).
previous_shot=""
shot() {
  local n differ=""
  n=$(field screenshots)
  xdotool key F12 || fail "xdotool could not press F12."
  wait_for $kWait is screenshots $((n + 1)) ||
    fail "F12 after $1 saved no screenshot within $kWait s (the app's status: '$(field status)')."
  local png=$out/shots/$(field last_screenshot)
  [ -s "$png" ] || fail "the app says it saved $png after $1, but there is no such file."
  if [ -n "$previous_shot" ]; then
    differ=$("$check" --differ "$previous_shot" "$png" 2>&1) ||
      fail "the window after $1 shows the same picture as before it, or cannot be read: $differ"
    differ=${differ##*: } && differ=", ${differ% from *} from the last"
  fi
  previous_shot=$png
  note "F12 after $1: $(basename "$png")$differ"
}

# A private X server: -displayfd makes Xvfb pick a free display and say which once it accepts clients, so
# tests run side by side never race for one.
exec 3>"$out/display"
timeout $kLifetime Xvfb -displayfd 3 -screen 0 1600x1000x24 -nolisten tcp >"$out/xvfb.log" 2>&1 &
xvfb=$!
exec 3>&-
deadline=$((SECONDS + kWait))
until [ -s "$out/display" ]; do
  kill -0 $xvfb 2>/dev/null || { xvfb=""; fail "Xvfb did not start: $(tail -1 "$out/xvfb.log")"; }
  [ $SECONDS -lt $deadline ] || fail "Xvfb did not report a display within $kWait s."
  sleep 0.05
done
export DISPLAY=:$(head -1 "$out/display")

# The lesson's scenario, interactive; F12's screenshots land in the app's directory.
(cd "$out/shots" && exec timeout $kLifetime "$viz" --scenario "$scenario" --state-file "$state") >"$out/app.log" 2>&1 &
app=$!
wait_for $kFirstWait test -s "$state" || fail "the app wrote no state file ($state) within $kFirstWait s."
note "first state file: $(field algorithm), N $(field N), step $(field step) of $(field events), panels $(field panels)"
events=$(field events)
start=$(field step)
[ "$(field window)" = "[1400, 860]" ] || fail "the window is $(field window), not the scenario's [1400, 860]."
[[ "$start" =~ ^[0-9]+$ && "$events" =~ ^[0-9]+$ && $start -gt 0 && $start -lt $events ]] ||
  fail "the scenario should start inside the event stream, but the app is at step '$start' of '$events'."
panel_shown transport && fail "the lesson's scenario should hide the Transport panel, and the app shows it."

win=$(xdotool search --name '^FlashLab: where the bytes go$' | head -1)
[ -n "$win" ] || fail "xdotool finds no window named 'FlashLab: where the bytes go'."
xdotool windowfocus "$win" || fail "xdotool could not focus the window $win."
wait_for $kWait is focused true || fail "the window did not get the keyboard focus within $kWait s of xdotool windowfocus."
shot "the start"

# 1. Step with the arrow keys, the Transport panel hidden (as the lesson's scenario has it): one event a tap,
# taps faster than a frame included; shift: one percent of the stream.
step_with $((start + 1)) Right
shot "Right"
step_with $((start + 4)) Right Right Right
shot "Right Right Right"
step_with $((start + 3)) Left
shot "Left"
big=$((events / 100 > 1 ? events / 100 : 1))
step_with $((start + 3 + big)) shift+Right
shot "shift+Right"
at=$((start + 3 + big))

# 2. Another algorithm, with the mouse: open the Controls panel's combo box, click an entry of its list.
was=$(field algorithm)
pick=fa1; [ "$was" = fa1 ] && pick=standard
click controls/algorithm
wait_for $kWait has_widget "controls/algorithm/$pick" ||
  fail "clicking the algorithm box did not open its list (no entry '$pick' drawn within $kWait s)."
click "controls/algorithm/$pick"
wait_for $kWait is algorithm "$pick" || fail "after clicking '$pick' in the list the algorithm is $(field algorithm), not $pick."
wait_for $kWait no_widget "controls/algorithm/$pick" || fail "the algorithm list stayed open after an entry was clicked."
[ "$(field N)" = 256 ] && [ "$(field d)" = 64 ] || fail "switching the algorithm changed N or d (N $(field N), d $(field d))."
shot "picking $pick"
at=$(field step)

# 3. Open a panel: its checkbox in the Controls panel's Panels list.
click controls/panel/transport
wait_for $kWait panel_shown transport ||
  fail "after clicking the Transport checkbox the panels shown are $(field panels), without transport."
panel_shown tiles && panel_shown softmax || fail "opening the Transport panel hid another: panels are $(field panels)."
shot "opening the Transport panel"

# 4. The keys still step after the clicks; in a text field the arrows move its cursor instead, and Escape gives
# them back.
step_with $((at - 1)) Left
at=$((at - 1))
click controls/scenario_file
wait_for $kWait is text_input true || fail "clicking the scenario file field did not give it the keyboard within $kWait s."
# The app takes keys in order: when Escape has landed, so have the arrows.
xdotool key Left Left Escape || fail "xdotool could not press Left Left Escape."
wait_for $kWait is text_input false || fail "Escape did not take the keyboard back from the text field within $kWait s."
is step $at || fail "the arrow keys stepped the stream (to $(field step)) while a text field had the keyboard."
step_with $((at - 1)) Left
shot "Escape, Left"

kill -0 "$app" 2>/dev/null || fail "the app is no longer running at the end."
echo "drive_test: all checks passed: stepped $start -> $((start + 1)) -> $((start + 4)) -> $((start + 3)) ->" \
  "$((start + 3 + big)) with the keys, picked $pick with the mouse, opened the Transport panel, gave the keys" \
  "back from a text field; $(field screenshots) screenshots, each a different picture"
