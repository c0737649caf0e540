#!/usr/bin/env bash
# Copies the header-only dependencies into .deps/include (git-ignored) so a device call can carry them:
# the GPU machine has no CLI11 or nlohmann-json and cannot install packages. For the Python module also
# pybind11 and DLPack's header, and, in .deps/python, Debian's pytest with what it imports (pure Python),
# for a GPU machine whose Python has no pytest (scripts/python_path.sh puts it on PYTHONPATH).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/include
cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/doctest .deps/include/
cp -r /usr/include/eigen3/Eigen .deps/include/
cp -r /usr/include/pybind11 /usr/include/dlpack .deps/include/
mkdir -p .deps/python
site=/usr/lib/python3/dist-packages
for package in pytest _pytest py.py py pluggy iniconfig packaging attr attrs exceptiongroup tomli; do
  [ -e "$site/$package" ] || { echo "make_deps: $site/$package is missing: run scripts/setup.sh"; exit 1; }
  cp -r "$site/$package" .deps/python/
done
echo "make_deps: $(du -sh .deps | cut -f1) in .deps/include"
