#!/usr/bin/env bash
# Copies the header-only dependencies into .deps/include (git-ignored) so a device call can carry them:
# the GPU machine has no CLI11 or nlohmann-json and cannot install packages.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/include
cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/doctest .deps/include/
cp -r /usr/include/eigen3/Eigen .deps/include/
echo "make_deps: $(du -sh .deps | cut -f1) in .deps/include"
