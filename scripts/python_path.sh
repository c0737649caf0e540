#!/usr/bin/env bash
# How Python finds FlashLab's module: the build puts the package and its extension in <build>/python/flashlab/,
# so <build>/python goes on PYTHONPATH. Source this file from the repository root:
#   source scripts/python_path.sh [build folder]     (default: build-device where it exists, else build)
# On the GPU machine it also adds .deps/python, the copy of pytest that scripts/make_deps.sh carries there,
# for a Python that has none. The module is built for one interpreter: the one CMake was given
# (Python3_EXECUTABLE; scripts/device_build.sh passes the machine's `python3`); run that one.
flashlab_build=${1:-}
if [ -z "$flashlab_build" ]; then
  flashlab_build=build
  [ -d build-device/python ] && flashlab_build=build-device
fi
[ -d "$flashlab_build/python/flashlab" ] ||
  echo "python_path: $flashlab_build/python/flashlab is missing: build the flashlab_python target first" >&2
flashlab_pythonpath="$PWD/$flashlab_build/python"
# (only where that Python has no pytest of its own: the copy would shadow it)
[ -d .deps/python ] && ! python3 -c "import pytest" 2>/dev/null && flashlab_pythonpath="$flashlab_pythonpath:$PWD/.deps/python"
export PYTHONPATH="$flashlab_pythonpath${PYTHONPATH:+:$PYTHONPATH}"
echo "PYTHONPATH=$PYTHONPATH"
unset flashlab_build flashlab_pythonpath
