#!/usr/bin/env bash
# On the lent GPU machine: configure (preset `device`: CUDA on, no app, header-only deps from the
# carried .deps/include) and build. Usage: bash scripts/device_build.sh [targets...]
# Carry .deps in the device call; make it here first with scripts/make_deps.sh.
# The Python module (target flashlab_python) is built for the machine's `python3`, the one with PyTorch;
# where that Python has no headers (Python.h) the module is left out and the line below says so.
set -euo pipefail
[ -d .deps/include ] || { echo "device_build: .deps/include is missing: run scripts/make_deps.sh and carry .deps"; exit 1; }
generator=(); command -v ninja >/dev/null || generator=(-G "Unix Makefiles")
python=(); command -v python3 >/dev/null && python=(-DPython3_EXECUTABLE="$(command -v python3)")
configured=$(cmake --preset device "${generator[@]}" "${python[@]}" 2>&1) || { echo "$configured"; exit 1; }
grep "FlashLab:" <<<"$configured"
if (($#)); then
  cmake --build build-device -j "$(nproc)" --target "$@"
else
  cmake --build build-device -j "$(nproc)"
fi
