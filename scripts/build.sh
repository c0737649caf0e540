#!/usr/bin/env bash
# Configures and builds one CMake preset (default: `default` -> build/). Usage: scripts/build.sh [preset]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-default}
cmake --preset "$preset" >/dev/null
dir=build; [ "$preset" = default ] || dir="build-$preset"
cmake --build "$dir" -j "$(nproc)"
