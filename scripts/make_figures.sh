#!/usr/bin/env bash
# Makes the README and lesson figures with the app's headless mode (needs a display or xvfb-run).
# The commands, one per figure (each PNG also carries its command in a tEXt "Comment" chunk):
#   flashlab-viz --scenario viz/scenarios/readme-overview.json --png-palette --screenshot docs/img/readme-overview.png
#   flashlab-viz --scenario viz/scenarios/lesson01-standard-traffic.json --png-palette --screenshot docs/img/lesson01-standard-traffic.png
#   flashlab-viz --scenario viz/scenarios/lesson02-online-softmax.json --png-palette --screenshot docs/img/lesson02-online-softmax.png
#   flashlab-viz --scenario viz/scenarios/lesson03-hbm-to-shared.json --png-palette --screenshot docs/img/lesson03-hbm-to-shared.png
#   flashlab-viz --scenario viz/scenarios/lesson04-fa1-tiles.json --png-palette --screenshot docs/img/lesson04-fa1-tiles.png
#   flashlab-viz --scenario viz/scenarios/lesson05-fa1-vs-fa2.json --png-palette --screenshot docs/img/lesson05-fa1-vs-fa2.png
#   flashlab-viz --scenario viz/scenarios/lesson05-counters.json --png-palette --screenshot docs/img/lesson05-counters.png
#   flashlab-viz --scenario viz/scenarios/lesson06-backward.json --png-palette --screenshot docs/img/lesson06-backward.png
#   flashlab-viz --scenario viz/scenarios/lesson07-roofline.json --png-palette --screenshot docs/img/lesson07-roofline.png
#   flashlab-viz --scenario viz/scenarios/lesson09-ring.json --png-palette --screenshot docs/img/lesson09-ring.png
#   flashlab-viz --scenario viz/scenarios/lesson09-ring-measured.json --png-palette --screenshot docs/img/lesson09-ring-measured.png
#   flashlab-viz --scenario viz/scenarios/lesson10-fp8-error.json --png-palette --screenshot docs/img/lesson10-fp8-error.png
# (--png-palette: 256 colours, so each committed figure stays near 100 KB.)
# Usage: scripts/make_figures.sh [build-dir]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
viz="$build/bin/flashlab-viz" check="$build/bin/viz_png_check"
[ -x "$viz" ] && [ -x "$check" ] || { echo "make_figures: $viz or $check is missing: build with FLASHLAB_VIZ on first" >&2; exit 1; }
layouts=$(mktemp -d)
trap 'rm -rf "$layouts"' EXIT
run=()
if [ -z "${DISPLAY:-}" ]; then
  command -v xvfb-run >/dev/null || { echo "make_figures: no display and no xvfb-run" >&2; exit 1; }
  run=(xvfb-run -a -s "-screen 0 1920x1200x24")
fi
mkdir -p docs/img
for name in readme-overview lesson01-standard-traffic lesson02-online-softmax lesson03-hbm-to-shared lesson04-fa1-tiles lesson05-fa1-vs-fa2 \
    lesson05-counters lesson06-backward lesson07-roofline pipeline-h100-d128 pipeline-h100-backward-d128 lesson09-ring lesson09-ring-measured \
    lesson10-fp8-error; do
  cmd="flashlab-viz --scenario viz/scenarios/$name.json --png-palette --screenshot docs/img/$name.png"
  "${run[@]}" "$viz" --scenario "viz/scenarios/$name.json" --png-palette --screenshot "docs/img/$name.png" \
    --dump-layout "$layouts/$name.json" >/dev/null
  # A figure is checked where it is made: not blank, not trivial (the render test checks one of each kind); a
  # 256-colour figure of real panels still has well over 64 distinct colours.
  "$check" "docs/img/$name.png" "$layouts/$name.json" --min-colours 64 >/dev/null ||
    { echo "make_figures: docs/img/$name.png is blank or trivial" >&2; exit 1; }
  printf '%-40s %6d KB   %s\n' "docs/img/$name.png" $(( $(stat -c %s "docs/img/$name.png") / 1024 )) "$cmd"
done
