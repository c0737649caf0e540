#!/usr/bin/env bash
# The tensor-core kernels' rule "no register spills in the -Xptxas -v report for the shipped
# configurations", as a test: compile the tensor-core kernels for sm_90 with ptxas in verbose mode and fail if any kernel
# spills, naming it. Needs nvcc, not a GPU. tests/CMakeLists.txt passes the build's own nvcc flags.
#   check_no_spills.sh NVCC MIN_FUNCTIONS file.cu... -- NVCC_FLAGS...
# MIN_FUNCTIONS guards against a vacuous pass: fewer compiled functions than that is a failure too.
set -euo pipefail
nvcc=$1 min_functions=$2
shift 2
files=()
while (($#)) && [ "$1" != "--" ]; do files+=("$1"); shift; done
(($#)) && shift  # the --
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for file in "${files[@]}"; do
  "$nvcc" "$@" --generate-code=arch=compute_90,code=sm_90 -Xptxas -v -c "$file" -o "$tmp/out.o" 2>>"$tmp/ptxas.txt" ||
    { cat "$tmp/ptxas.txt"; echo "check_no_spills: nvcc failed on $file"; exit 1; }
done
# ptxas prints "Function properties for NAME" and then "N bytes stack frame, S bytes spill stores, L
# bytes spill loads" for every function it compiles.
awk '
  /Function properties for/ { name = $NF }
  /bytes spill stores/ {
    total++
    if ($0 !~ / 0 bytes spill stores, 0 bytes spill loads/) { bad++; print "SPILLS: " name ":" $0 }
  }
  END {
    printf "%d functions compiled for sm_90, %d spill\n", total, bad
    if (bad > 0) exit 1
    if (total < '"$min_functions"') { print "expected at least '"$min_functions"' functions"; exit 1 }
  }' "$tmp/ptxas.txt" >"$tmp/verdict.txt" && status=0 || status=$?
if command -v c++filt >/dev/null; then c++filt <"$tmp/verdict.txt"; else cat "$tmp/verdict.txt"; fi
exit "$status"
