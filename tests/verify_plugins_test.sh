#!/usr/bin/env bash
# `flashlab verify` on the example plugin and the planted bugs (examples/verify_plugin_cpu), as tests:
#   verify_plugins_test.sh FLASHLAB PLUGIN_DIR correct [full]  the example kernel passes the quick suite at three
#                                                              seeds (and the full one with `full`); bad plugin
#                                                              input gets one sentence and exit 2
#   verify_plugins_test.sh FLASHLAB PLUGIN_DIR BUG ID [full]   the kernel with BUG planted fails the quick suite at
#                                                              three seeds (and the full one with `full`), and the
#                                                              diagnosis names ID each time
# VERIFY_SEEDS overrides the planted bugs' seeds (the sanitizer build runs one: it looks for memory errors there).
set -uo pipefail
flashlab=$1 dir=$2 what=$3 extra=${4:-}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }
if [ "$what" = correct ]; then
  lib=$dir/libflashlab_example_plugin.so
  for seed in 11 12 13; do
    "$flashlab" verify --plugin "$lib" --seed "$seed" >"$out" 2>&1 || fail "the example kernel failed the quick suite at seed $seed"
    grep -q " 0 fail" "$out" || fail "no '0 fail' in the report at seed $seed"
  done
  echo "the example kernel passes the quick suite at seeds 11, 12, 13"
  if [ "$extra" = full ]; then
    "$flashlab" verify --plugin "$lib" --seed 14 --suite full >"$out" 2>&1 || fail "the example kernel failed the full suite"
    grep -qE "^[0-9]+ cases: [0-9]+ pass, 0 fail" "$out" || fail "no pass count in the full suite's report"
    echo "and the full suite at seed 14: $(grep -E '^[0-9]+ cases:' "$out")"
  fi
  expect_refusal() {  # sentence args...: exit 2, the sentence on stderr
    local sentence=$1; shift
    "$flashlab" verify "$@" >"$out" 2>&1
    local rc=$?
    [ "$rc" = 2 ] || fail "verify $* exited $rc, not 2"
    grep -q "$sentence" "$out" || fail "verify $* did not say '$sentence'"
  }
  expect_refusal "cannot load the plugin" --plugin "$dir/no-such-plugin.so"
  expect_refusal "exports no function 'no_such_symbol'" --plugin "$lib" --symbol no_such_symbol
  expect_refusal "plugins take f32, f16 or bf16, not f64" --plugin "$lib" --dtype f64
  expect_refusal "runs none of the dtypes and head dims tried" --plugin "$lib" --dtype f16,bf16
  expect_refusal "unknown suite 'huge'" --plugin "$lib" --suite huge
  echo "bad input: one sentence and exit 2 each"
  exit 0
fi
id=$extra
lib=$dir/libflashlab_planted_$what.so
if [ "${5:-}" = full ]; then
  "$flashlab" verify --plugin "$lib" --seed 24 --suite full >"$out" 2>&1
  rc=$?
  [ "$rc" = 1 ] || fail "the planted $what bug exited $rc on the full suite, not 1"
  grep -q "^diagnosis ($id): " "$out" || fail "the planted $what bug was not diagnosed as '$id' on the full suite"
  echo "planted $what: caught and named '$id' on the full suite (seed 24)"
fi
seeds=${VERIFY_SEEDS:-21 22 23}
for seed in $seeds; do
  "$flashlab" verify --plugin "$lib" --seed "$seed" >"$out" 2>&1
  rc=$?
  [ "$rc" = 1 ] || fail "the planted $what bug exited $rc at seed $seed, not 1 (a failed check)"
  grep -q "^diagnosis ($id): " "$out" || fail "the planted $what bug was not diagnosed as '$id' at seed $seed"
  grep -q "^first failing element: " "$out" || fail "no first failing element at seed $seed"
done
echo "planted $what: caught and named '$id' at seeds $seeds"
