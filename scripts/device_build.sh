#!/usr/bin/env bash
# On the lent GPU machine: configure (preset `device`: CUDA on, no app, header-only deps from the
# carried .deps/include) and build. Usage: bash scripts/device_build.sh [targets...]
# Carry .deps in the device call; make it here first with scripts/make_deps.sh.
set -euo pipefail
[ -d .deps/include ] || { echo "device_build: .deps/include is missing: run scripts/make_deps.sh and carry .deps"; exit 1; }
generator=(); command -v ninja >/dev/null || generator=(-G "Unix Makefiles")
cmake --preset device "${generator[@]}" >/dev/null
if (($#)); then
  cmake --build build-device -j "$(nproc)" --target "$@"
else
  cmake --build build-device -j "$(nproc)"
fi
