#!/usr/bin/env bash
# The CUDA compiler launcher of the tensor-core kernels (src/cuda/CMakeLists.txt): runs the compile exactly as
# given and, when it asks ptxas for its report (-Xptxas=-v), keeps that report beside the object
# (OBJECT.ptxas.txt) and passes the compiler's other messages on. The no-spill tests read those reports
# (check_no_spills.sh --reports), so they check the objects the build made instead of compiling the kernels again.
set -uo pipefail
out="" prev=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && out=$arg
  prev=$arg
done
case " $* " in *" -Xptxas=-v "*) ;; *) exec "$@" ;; esac
[ -n "$out" ] || exec "$@"
report=$(mktemp)
"$@" 2>"$report"
status=$?
# ptxas -v prints, per function: "ptxas info : Compiling entry function ...", "... Function properties for NAME",
# "N bytes stack frame, S bytes spill stores, L bytes spill loads", "... Used R registers, ...".
grep -v -e '^ptxas info' -e 'bytes stack frame' "$report" >&2
if [ "$status" -eq 0 ]; then mv "$report" "$out.ptxas.txt"; else rm -f "$report" "$out.ptxas.txt"; fi
exit "$status"
