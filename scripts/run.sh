#!/usr/bin/env bash
# The README's first command: set up, build, then open the app when a display is present; without one,
# say so and run the terminal tour (flashlab check and flashlab trace).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh default
if [ -x build/bin/flashlab-viz ] && { [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ]; }; then
  # The README's front image: FA2 at one step, every panel (arguments given here override the scenario).
  exec build/bin/flashlab-viz --scenario viz/scenarios/readme-overview.json "$@"
fi
if [ -x build/bin/flashlab-viz ]; then
  echo "run: no display here, so the app cannot open a window; running the terminal tour instead."
  echo "     (headless screenshots: build/bin/flashlab-viz --help)"
else
  echo "run: the app was not built (GLFW/ImGui missing); running the terminal tour instead."
fi
exec bash scripts/tour.sh build
