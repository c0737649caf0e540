#!/usr/bin/env bash
# On the lent GPU machine: configure (preset `device`: CUDA on, no app, header-only deps from the
# carried .deps/include) and build. Usage: bash scripts/device_build.sh [targets...]
# BUILD_DIR (default build-device) builds elsewhere, CMAKE_ARGS adds cache settings: a second build of another
# compile-time choice, e.g. BUILD_DIR=build-device-rows128 CMAKE_ARGS=-DFLASHLAB_FA3_BACKWARD_D64_ROWS=128.
# Carry .deps in the device call; make it here first with scripts/make_deps.sh.
# The Python module (target flashlab_python) is built for the machine's `python3`, the one with PyTorch;
# where that Python has no headers (Python.h) the module is left out and the line below says so.
set -euo pipefail
[ -d .deps/include ] || { echo "device_build: .deps/include is missing: run scripts/make_deps.sh and carry .deps"; exit 1; }
generator=(); command -v ninja >/dev/null || generator=(-G "Unix Makefiles")
python=(); command -v python3 >/dev/null && python=(-DPython3_EXECUTABLE="$(command -v python3)")
dir=${BUILD_DIR:-build-device}
read -r -a extra <<<"${CMAKE_ARGS:-}"
configured=$(cmake --preset device -B "$dir" "${generator[@]}" "${python[@]}" "${extra[@]}" 2>&1) ||
  { echo "$configured"; exit 1; }
grep "FlashLab:" <<<"$configured"
if (($#)); then
  cmake --build "$dir" -j "$(nproc)" --target "$@"
else
  cmake --build "$dir" -j "$(nproc)"
fi
