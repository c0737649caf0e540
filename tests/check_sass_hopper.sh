#!/usr/bin/env bash
# cuda-fa3-ws's rule "the SASS shows HGMMA and UTMALDG", as a test: every cuda-fa3-ws kernel in the built
# binary (each ladder step, head dim, dtype, with and without dropout, and the timeline build's) must
# contain Hopper's warpgroup tensor-core instruction (HGMMA, from wgmma) and TMA loads (UTMALDG, from
# cp.async.bulk.tensor) in its SASS, so a change that falls back to mma.sync or per-thread copies (or
# compiles a kernel away) fails here. The FP8 forward's kernels (fa3_ws_kernel<__nv_fp8_e4m3, ...>) must run
# wgmma's 8-bit floating-point form instead, which the SASS names QGMMA, and at least MIN_E4M3 of them must be
# there. Needs cuobjdump (in the CUDA toolkit's full install; the CI image's
# nvcc-only toolkit lacks it: then exit 77, which CTest reports as skipped), not a GPU.
#   check_sass_hopper.sh CUOBJDUMP BINARY MIN_KERNELS [MIN_E4M3]
set -euo pipefail
cuobjdump=$1 binary=$2 min_kernels=$3 min_e4m3=${4:-0}
if [ ! -x "$cuobjdump" ]; then
  echo "check_sass_hopper: no cuobjdump in this CUDA toolkit ($cuobjdump); skipped"
  exit 77
fi
# The dump has one "Function : MANGLED_NAME" header per kernel, then its instructions. The kernels are
# flashlab::cuda::fa3_ws::fa3_ws_kernel<T, D, step, dropout, timeline, Schedule> (...13fa3_ws_kernel...)
# and the backward's fa3_ws_backward_kernel<T, D, dropout> (...22fa3_ws_backward_kernel...).
"$cuobjdump" --dump-sass "$binary" | awk '
  /Function : / { name = $NF; if (name ~ /13fa3_ws_kernel|22fa3_ws_backward_kernel/) { hgmma[name] += 0; utmaldg[name] += 0; current = name } else current = ""; if (current ~ /__nv_fp8_e4m3/) e4m3[current] += 0; next }
  current != "" && /HGMMA/ { hgmma[current]++ }
  current ~ /__nv_fp8_e4m3/ && /QGMMA/ { hgmma[current]++; e4m3[current]++ }
  current != "" && /UTMALDG/ { utmaldg[current]++ }
  END {
    for (k in hgmma) {
      n++
      if (hgmma[k] == 0 || utmaldg[k] == 0) { bad++; printf "MISSING (HGMMA or QGMMA %d, UTMALDG %d): %s\n", hgmma[k], utmaldg[k], k }
    }
    printf "%d cuda-fa3-ws kernels in the SASS, %d without HGMMA or UTMALDG\n", n, bad
    for (k in e4m3) {
      n8++
      if (e4m3[k] == 0) { bad++; printf "NO QGMMA (8-bit wgmma): %s\n", k }
    }
    printf "%d of them e4m3 (the FP8 forward), each with QGMMA unless named above\n", n8
    if (bad > 0) exit 1
    if (n8 < '"$min_e4m3"') { print "expected at least '"$min_e4m3"' e4m3 kernels"; exit 1 }
    if (n < '"$min_kernels"') { print "expected at least '"$min_kernels"' kernels"; exit 1 }
  }'
