#!/usr/bin/env bash
# The tensor-core kernels' rule "cuobjdump --dump-sass shows HMMA", as a test: every cuda-fa2 forward
# and backward kernel in the built binary must contain tensor-core instructions (HMMA) in its SASS, so a change
# that silently falls back to CUDA-core math (or compiles a kernel away) fails here. Needs cuobjdump
# (in the CUDA toolkit's full install; the CI image's nvcc-only toolkit lacks it: then exit 77, which
# CTest reports as skipped), not a GPU.
#   check_sass_hmma.sh CUOBJDUMP BINARY MIN_KERNELS
set -euo pipefail
cuobjdump=$1 binary=$2 min_kernels=$3
if [ ! -x "$cuobjdump" ]; then
  echo "check_sass_hmma: no cuobjdump in this CUDA toolkit ($cuobjdump); skipped"
  exit 77
fi
# The dump has one "Function : MANGLED_NAME" header per kernel, then its instructions. The kernels are
# flashlab::cuda::fa2::{forward,backward}_kernel (mangled ...4cuda3fa2...14forward_kernel...); the fp32
# fa2-simt kernels live elsewhere (flashlab::cuda) and use no tensor cores.
"$cuobjdump" --dump-sass "$binary" | awk '
  /Function : / { name = $NF; if (name ~ /4cuda3fa2/ && name ~ /(14forward|15backward)_kernel/) { kernels[name] = 0; current = name } else current = ""; next }
  current != "" && /HMMA/ { kernels[current]++ }
  END {
    for (k in kernels) { n++; if (kernels[k] == 0) { bad++; print "NO HMMA: " k } }
    printf "%d cuda-fa2 kernels in the SASS, %d without HMMA\n", n, bad
    if (bad > 0) exit 1
    if (n < '"$min_kernels"') { print "expected at least '"$min_kernels"' kernels"; exit 1 }
  }'
