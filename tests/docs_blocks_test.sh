#!/usr/bin/env bash
# docs_generated_blocks_catch_edits: proves that `scripts/readme_tables.py --check` (the drift test
# docs_generated_blocks) catches what it must. On a copy of tests/docs_blocks/fixture.md, one block of each
# KIND, generated from the real bench/results/ files:
#   1. the copy as committed matches its sources (exit 0);
#   2. one digit changed inside a generated table fails the check (exit 1), naming the file, the marker's
#      line and the KIND, with a diff;
#   3. --write puts the block back: the file is the fixture again, and the check passes;
#   4. an end marker removed, an unknown KIND, a missing source file: exit 2, one sentence each;
#   5. a file with no marker at all fails (exit 1): a check that checks nothing must not pass.
# usage: docs_blocks_test.sh [PYTHON]   (no GPU, no third-party module)
set -u
py=${1:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
script=$root/scripts/readme_tables.py
fixture=$root/tests/docs_blocks/fixture.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# run NAME EXPECTED_RC ARGS...: runs the script in $tmp, prints its output, checks its exit status.
run() {
  local name=$1 want=$2
  shift 2
  echo "--- $name: readme_tables.py $*"
  "$py" "$script" "$@" >out.txt 2>&1
  local rc=$?
  cat out.txt
  echo "(exit $rc)"
  [ "$rc" -eq "$want" ] || fail "$name: exit $rc, expected $want"
}

expect_output() {  # expect_output NAME TEXT: the last run's output holds TEXT
  grep -qF -- "$2" out.txt || fail "$1: the output does not say: $2"
}

# 1. As committed.
cp "$fixture" fixture.md
run "fixture as committed" 0 --check fixture.md
expect_output "fixture as committed" "generated blocks in 1 files match their sources"

# 2. One digit changed: in the first data row of the first generated table, the first digit of its second
#    cell (a measured value, not N).
awk 'BEGIN { inblock = 0; done = 0 }
     /^<!-- generated:.*-->$/ { inblock = 1; rows = 0 }
     /^<!-- end generated -->$/ { inblock = 0 }
     {
       if (inblock && !done && /^\|/ && ++rows == 3) {
         second = index(substr($0, 2), "|") + 1
         if (match(substr($0, second), /[0-9]/)) {
           at = second + RSTART - 1
           d = substr($0, at, 1)
           $0 = substr($0, 1, at - 1) (d == "9" ? "8" : d + 1) substr($0, at + 1)
           done = 1
         }
       }
       print
     }' fixture.md >edited.md
if cmp -s fixture.md edited.md; then
  fail "the edit changed nothing"
fi
echo "--- the edit:"
diff fixture.md edited.md
cp edited.md fixture.md
run "one digit changed" 1 --check fixture.md
expect_output "one digit changed" "fixture.md:"
expect_output "one digit changed" ": cpu-bench: the block differs from what its sources give"
expect_output "one digit changed" "1 of"

# 3. --write restores it.
run "--write on the edited copy" 0 --write fixture.md
cmp -s fixture.md "$fixture" || fail "--write did not give back the fixture: $(diff "$fixture" fixture.md | head -5)"
run "after --write" 0 --check fixture.md

# 4. Malformed markers and sources: exit 2.
awk '/^<!-- generated: cpu-bench/ { seen = 1 }
     seen && /^<!-- end generated -->$/ && !done { done = 1; next }
     { print }' "$fixture" >fixture.md
run "an end marker removed" 2 --check fixture.md
expect_output "an end marker removed" "has no <!-- end generated --> after it"
printf '<!-- generated: no-such-kind cpu-2026-11-23.json -->\n<!-- end generated -->\n' >unknown.md
run "an unknown KIND" 2 --check unknown.md
expect_output "an unknown KIND" "unknown KIND 'no-such-kind'"
printf '<!-- generated: cpu-bench no-such-file.json -->\n<!-- end generated -->\n' >missing.md
run "a missing source" 2 --check missing.md
expect_output "a missing source" "no file bench/results/no-such-file.json"

# 5. Nothing to check.
printf '# No markers here\n' >empty.md
run "no marker at all" 1 --check empty.md
expect_output "no marker at all" "no generated blocks found"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "readme_tables.py --check catches an edited number, a missing end marker, an unknown KIND, a missing source and an empty set"
