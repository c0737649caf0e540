#!/usr/bin/env bash
# Per kernel of an object or binary: HGMMA and UTMALDG counts in its SASS; fails if any kernel has none.
# Usage: sass_check.sh FILE   (CUOBJDUMP=... to pick the tool)
set -euo pipefail
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}
"$CUOBJDUMP" --dump-sass "$1" | awk '
  /Function :/ { if (name != "") print name, hg, tma; name = $3; hg = 0; tma = 0 }
  /HGMMA/ { hg++ }
  /UTMALDG/ { tma++ }
  END { if (name != "") print name, hg, tma }' | awk '
  /fa3_ws_kernel/ { n++; printf "%s HGMMA %d UTMALDG %d\n", $1, $2, $3; if ($2 == 0 || $3 == 0) bad++
                    if (minh == "" || $2 < minh) minh = $2; if (mint == "" || $3 < mint) mint = $3 }
  END { printf "sass: %d fa3_ws kernels, HGMMA min %d, UTMALDG min %d, %d without one of them\n", n, minh, mint, bad; exit bad > 0 }'
