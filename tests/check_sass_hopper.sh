#!/usr/bin/env bash
# cuda-fa3-ws's rule "the SASS shows HGMMA and UTMALDG", as a test: every cuda-fa3-ws kernel in the built
# binary (each ladder step, head dim, dtype, with and without dropout, and the timeline build's) must
# contain Hopper's warpgroup tensor-core instruction (HGMMA, from wgmma) and TMA loads (UTMALDG, from
# cp.async.bulk.tensor) in its SASS, so a change that falls back to mma.sync or per-thread copies (or
# compiles a kernel away) fails here. Needs cuobjdump (in the CUDA toolkit's full install; the CI image's
# nvcc-only toolkit lacks it: then exit 77, which CTest reports as skipped), not a GPU.
#   check_sass_hopper.sh CUOBJDUMP BINARY MIN_KERNELS
set -euo pipefail
cuobjdump=$1 binary=$2 min_kernels=$3
if [ ! -x "$cuobjdump" ]; then
  echo "check_sass_hopper: no cuobjdump in this CUDA toolkit ($cuobjdump); skipped"
  exit 77
fi
# The dump has one "Function : MANGLED_NAME" header per kernel, then its instructions. The kernels are
# flashlab::cuda::fa3_ws::fa3_ws_kernel<T, D, step, dropout, timeline, Schedule> (...13fa3_ws_kernel...)
# and the backward's fa3_ws_backward_kernel<T, D, dropout> (...22fa3_ws_backward_kernel...).
"$cuobjdump" --dump-sass "$binary" | awk '
  /Function : / { name = $NF; if (name ~ /13fa3_ws_kernel|22fa3_ws_backward_kernel/) { hgmma[name] += 0; utmaldg[name] += 0; current = name } else current = ""; next }
  current != "" && /HGMMA/ { hgmma[current]++ }
  current != "" && /UTMALDG/ { utmaldg[current]++ }
  END {
    for (k in hgmma) {
      n++
      if (hgmma[k] == 0 || utmaldg[k] == 0) { bad++; printf "MISSING (HGMMA %d, UTMALDG %d): %s\n", hgmma[k], utmaldg[k], k }
    }
    printf "%d cuda-fa3-ws kernels in the SASS, %d without HGMMA or UTMALDG\n", n, bad
    if (bad > 0) exit 1
    if (n < '"$min_kernels"') { print "expected at least '"$min_kernels"' kernels"; exit 1 }
  }'
