#!/usr/bin/env bash
# The tensor-core kernels' rule "no register spills in the -Xptxas -v report for the shipped
# configurations", as a test: read the ptxas reports the build kept beside the kernels' objects
# (tests/ptxas_report.sh, the launcher of those compiles) and fail if any kernel spills, naming it. It
# checks the very objects the build made (their flags, their architecture), without compiling them again.
# It also fails where ptxas serialized a function's wgmma (its C7514 "Potential Performance Loss" note: a
# register of an in-flight wgmma touched by other instructions), which compiles and runs correctly, only slower.
#   check_no_spills.sh MIN_FUNCTIONS --reports OBJECT.ptxas.txt...
# MIN_FUNCTIONS guards against a vacuous pass: fewer compiled functions than that is a failure too.
set -euo pipefail
min_functions=$1
[ "${2:-}" = "--reports" ] || { echo "usage: check_no_spills.sh MIN_FUNCTIONS --reports OBJECT.ptxas.txt..."; exit 2; }
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for report in "$@"; do
  [ -s "$report" ] || { echo "check_no_spills: no ptxas report $report: was the object built with -Xptxas=-v through tests/ptxas_report.sh?"; exit 1; }
  cat "$report" >>"$tmp/ptxas.txt"
done
arch=$(grep -o "for 'sm_[0-9a-z]*'" "$tmp/ptxas.txt" | sort -u | tr -d "'" | sed 's/for //' | paste -sd, -)
# ptxas prints "Function properties for NAME" and then "N bytes stack frame, S bytes spill stores, L
# bytes spill loads" for every function it compiles.
awk '
  /Function properties for/ { name = $NF }
  /bytes spill stores/ {
    total++
    if ($0 !~ / 0 bytes spill stores, 0 bytes spill loads/) { bad++; print "SPILLS: " name ":" $0 }
  }
  /wgmma.mma_async instructions are serialized/ {
    serialized++
    fn = $0; sub(/.*in the function \047/, "", fn); sub(/\047.*/, "", fn)
    reason = $0; sub(/.*serialized due to /, "", reason); sub(/ in the function.*/, "", reason)
    print "SERIALIZED: " fn ": wgmma serialized due to " reason
  }
  END {
    printf "%d functions compiled for '"$arch"', %d spill\n", total, bad
    if (serialized > 0) printf "%d functions with their wgmma serialized\n", serialized
    if (bad > 0 || serialized > 0) exit 1
    if (total < '"$min_functions"') { print "expected at least '"$min_functions"' functions"; exit 1 }
  }' "$tmp/ptxas.txt" >"$tmp/verdict.txt" && status=0 || status=$?
if command -v c++filt >/dev/null; then c++filt <"$tmp/verdict.txt"; else cat "$tmp/verdict.txt"; fi
exit "$status"
