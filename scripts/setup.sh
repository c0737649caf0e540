#!/usr/bin/env bash
# Installs every Debian package FlashLab needs. Idempotent: packages already present are skipped.
# CUDA is not installed here: when /usr/local/cuda/bin/nvcc exists, the build picks it up.
# The Python module is built for Debian's /usr/bin/python3 (python3-dev), tested with its numpy and pytest;
# exceptiongroup and tomli are pytest's dependencies before Python 3.11, here only so that
# scripts/make_deps.sh can carry a pytest that works on the GPU machine's Python too.
set -euo pipefail
packages=(
  cmake ninja-build g++ pkg-config
  libeigen3-dev doctest-dev libcli11-dev nlohmann-json3-dev libstb-dev
  libglfw3-dev libimgui-dev libgl-dev libpng-dev xvfb xauth libgl1-mesa-dri xdotool
  python3-dev python3-numpy python3-pytest pybind11-dev libdlpack-dev
  python3-exceptiongroup python3-tomli
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: all packages present"
