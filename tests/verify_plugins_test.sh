#!/usr/bin/env bash
# `flashlab verify` on the example plugins and their planted bugs (examples/verify_plugin_cpu, and with
# VERIFY_PLUGINS=cuda examples/verify_plugin_cuda on device memory), as tests:
#   verify_plugins_test.sh FLASHLAB PLUGIN_DIR correct [full]  the example kernel passes the quick suite at three
#                                                              seeds (and the full one with `full`), --bench times it
#                                                              beside FlashLab's variants and PyTorch's SDPA (fake
#                                                              interpreters given with --python stand in for PyTorch:
#                                                              their times make the sdpa rows and x sdpa ratios, their
#                                                              failures one line saying why, the exit code still the
#                                                              verdict's), and bad input gets one sentence and exit 2
#   verify_plugins_test.sh FLASHLAB PLUGIN_DIR BUG ID [full]   the kernel with BUG planted fails the quick suite at
#                                                              three seeds (and the full one with `full`), the
#                                                              diagnosis names ID each time, and --bench times nothing
#   verify_plugins_test.sh FLASHLAB PLUGIN_DIR cuda-memory-stub HAS_CUDA
#                                                              a plugin that takes CUDA device memory: a build without
#                                                              CUDA (HAS_CUDA 0) refuses it in one sentence; one with
#                                                              CUDA says there is no device, or calls it with a stream
# VERIFY_SEEDS overrides the planted bugs' seeds (the sanitizer build runs one: it looks for memory errors there).
# With VERIFY_PLUGINS=cuda the test exits 77 (CTest: skipped) when this machine has no CUDA device.
set -uo pipefail
flashlab=$1 dir=$2 what=$3 extra=${4:-}
out=$(mktemp)
fakes=$(mktemp -d)  # the fake interpreters of --bench's SDPA
trap 'rm -rf "$out" "$fakes"' EXIT
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }
prefix=libflashlab && [ "${VERIFY_PLUGINS:-cpu}" = cuda ] && prefix=libflashlab_cuda
# flashlab verify ARGS... into $out, returning its exit code; a plugin that needs a CUDA device this machine lacks
# skips the test.
verify() {
  "$flashlab" verify "$@" >"$out" 2>&1
  local rc=$?
  if [ "$rc" = 2 ] && grep -q "no CUDA device to run it on" "$out"; then
    echo "no CUDA device on this machine: GPU test skipped"
    exit 77
  fi
  return $rc
}

if [ "$what" = cuda-memory-stub ]; then
  lib=$dir/libflashlab_cuda_memory_stub.so
  "$flashlab" verify --plugin "$lib" --seed 1 >"$out" 2>&1
  rc=$?
  if [ "$extra" = 0 ]; then
    [ "$rc" = 2 ] || fail "a build without CUDA exited $rc on a CUDA plugin, not 2"
    grep -q "takes CUDA device memory (FLASHLAB_MEMORY_CUDA), and this flashlab was built without CUDA" "$out" ||
      fail "a build without CUDA did not say why it refuses a CUDA plugin"
    [ "$(grep -c . "$out")" = 1 ] || fail "the refusal is not one line"
    echo "a build without CUDA refuses a CUDA plugin in one sentence: $(cat "$out")"
  elif [ "$rc" = 2 ]; then
    grep -q "takes CUDA device memory (FLASHLAB_MEMORY_CUDA), and this machine has no CUDA device to run it on" "$out" ||
      fail "a build with CUDA refused the CUDA plugin without saying there is no device"
    echo "a build with CUDA, no device: one sentence: $(cat "$out")"
  else
    [ "$rc" = 1 ] || fail "a build with CUDA exited $rc on the stub, not 1 (its forward fails every case)"
    grep -q "stub forward called with a stream" "$out" || fail "the stub was not given a stream"
    echo "a build with CUDA calls the CUDA plugin with a stream"
  fi
  exit 0
fi

if [ "$what" = correct ]; then
  lib=$dir/${prefix}_example_plugin.so
  for seed in 11 12 13; do
    verify --plugin "$lib" --seed "$seed" || fail "the example kernel failed the quick suite at seed $seed"
    grep -q " 0 fail" "$out" || fail "no '0 fail' in the report at seed $seed"
  done
  echo "the example kernel passes the quick suite at seeds 11, 12, 13"
  if [ "$extra" = full ]; then
    verify --plugin "$lib" --seed 14 --suite full || fail "the example kernel failed the full suite"
    grep -qE "^[0-9]+ cases: [0-9]+ pass, 0 fail" "$out" || fail "no pass count in the full suite's report"
    echo "and the full suite at seed 14: $(grep -E '^[0-9]+ cases:' "$out")"
  fi
  # --bench at one small N: a row for the kernel and each pass and mask, and the fastest FlashLab variant at 1.00x.
  # SDPA by this machine's python3: timed where it has PyTorch, else one line saying why.
  bench_args=(--plugin "$lib" --seed 15 --dtype f32 --head-dims 64 --bench --bench-seq 128)
  verify "${bench_args[@]}" || fail "verify --bench exited nonzero"
  name=$(sed -n 's/^flashlab verify: \([^ ]*\) (.*/\1/p' "$out")
  row="^f32 B=[0-9]+ H=[0-9]+ N=128 d=64( causal)? +(fwd|fwd\+bwd) +"
  ratio=" +([0-9.]+x|-)"  # x sdpa: a ratio, or - where SDPA has no time
  [ "$(grep -cE "$row$name +[0-9.]+ +[0-9.]+ +[0-9.]+x$ratio$" "$out")" = 4 ] ||
    fail "--bench has no timed row of $name for each of fwd and fwd+bwd, unmasked and causal"
  [ "$(grep -E "$row" "$out" | grep -cE " 1\.00x$ratio$")" -ge 4 ] ||
    fail "--bench has no FlashLab variant at 1.00x for each of fwd and fwd+bwd, unmasked and causal"
  [ "$(grep -c "^sdpa: " "$out")" = 1 ] || fail "--bench has no line saying how SDPA was timed, or why not"
  echo "--bench times $name and FlashLab's variants: $(grep -cE "$row" "$out") rows; $(grep "^sdpa: " "$out")"

  # A fake interpreter's times make SDPA's rows and every row's x sdpa: 1.000 ms forward and 4.000 ms forward +
  # backward, backends "flash" and "cudnn". It keeps the script it was asked to run and the request the CLI sent.
  memory=cpu && [ "${VERIFY_PLUGINS:-cpu}" = cuda ] && memory=cuda
  result='{"forward_ms": 1.0, "forward_backend": "flash", "forward_backward_ms": 4.0, "forward_backward_backend": "cudnn", "note": null}'
  reply='{"ok": true, "torch": "0.0-fake", "device": "a fake device", "clock": "a fake clock", "results": ['$result,$result']}'
  printf '#!/bin/sh\necho "$1" >"%s/script"\ncat >"%s/request.json"\necho '"'%s'"'\n' "$fakes" "$fakes" "$reply" \
    >"$fakes/python-ok"
  printf '#!/bin/sh\necho "Traceback (most recent call last):" >&2\necho "RuntimeError: planted failure" >&2\nexit 1\n' \
    >"$fakes/python-fails"
  printf '#!/bin/sh\necho "this is not json"\n' >"$fakes/python-garbage"
  chmod +x "$fakes"/python-*
  verify "${bench_args[@]}" --python "$fakes/python-ok" || fail "verify --bench with a fake SDPA exited nonzero"
  grep -q '/python/flashlab/_sdpa_timer\.py$' "$fakes/script" ||
    fail "the interpreter was not given the SDPA timer: $(cat "$fakes/script")"
  for field in '"device":"'$memory'"' '"seq_q":128' '"head_dim":64' '"dtype":"f32"' '"causal":"none"' \
               '"causal":"top-left"' '"backward":true'; do
    grep -qF "$field" "$fakes/request.json" || fail "the request to SDPA's timer has no $field: $(cat "$fakes/request.json")"
  done
  [ "$(grep -cE "${row}sdpa \(flash\) +1\.000 +[0-9.]+ +[0-9.]+x +1\.00x$" "$out")" = 2 ] ||
    fail "--bench has no forward row of SDPA at the fake's 1.000 ms, unmasked and causal"
  [ "$(grep -cE "${row}sdpa \(cudnn\) +4\.000 +[0-9.]+ +[0-9.]+x +1\.00x$" "$out")" = 2 ] ||
    fail "--bench has no forward + backward row of SDPA at the fake's 4.000 ms, unmasked and causal"
  # The plugin's x sdpa is its ms over the fake's, to the rounding of the two printed figures.
  grep -E "$row$name " "$out" | awk '{
      ms = $(NF - 3); ratio = $NF; sub(/x$/, "", ratio); sdpa = ($(NF - 5) == "fwd") ? 1 : 4
      if (ratio !~ /^[0-9.]+$/ || ratio - ms / sdpa > 0.011 || ms / sdpa - ratio > 0.011) { print "bad x sdpa: " $0; bad = 1 }
      rows++ } END { exit bad || rows != 4 }' || fail "the x sdpa of $name is not its time over the fake SDPA's"
  grep -qF "sdpa: PyTorch 0.0-fake's scaled_dot_product_attention on a fake device (a fake clock), run by \`$fakes/python-ok\`" \
    "$out" || fail "--bench does not say which PyTorch timed SDPA, where, and by which interpreter"
  echo "a fake SDPA's times: its rows, and x sdpa on each of the $(grep -cE "$row" "$out") rows"

  # The interpreter fails, prints no JSON, or is not there: no SDPA row, no x sdpa ratio, one line saying why, and the
  # exit code still the verdict's (0: every case passed). The forward alone, to keep the sanitizer build's run short.
  expect_not_timed() {  # python why
    verify "${bench_args[@]}" --no-backward --python "$1" || fail "verify --bench exited nonzero when SDPA could not be timed ($1)"
    [ "$(grep -c "^sdpa: " "$out")" = 1 ] && grep -qF "sdpa: not timed: $2" "$out" ||
      fail "--bench with $1 did not say, in one line, 'sdpa: not timed: $2'"
    ! grep -qE "${row}sdpa" "$out" || fail "--bench with $1 has SDPA rows"
    [ "$(grep -cE "$row.*x +-$" "$out")" -ge 4 ] && ! grep -qE "$row.*x +[0-9.]+x$" "$out" ||
      fail "--bench with $1 shows an x sdpa ratio, or no timed rows"
  }
  expect_not_timed "$fakes/python-fails" \
    "\`$fakes/python-fails\` exited with status 1 running the SDPA timer: RuntimeError: planted failure"
  expect_not_timed "$fakes/python-garbage" "\`$fakes/python-garbage\` ran the SDPA timer and its reply is not JSON"
  expect_not_timed "$fakes/no-such-python" "cannot start \`$fakes/no-such-python\` (No such file or directory)"
  echo "an interpreter that fails, prints no JSON or is not there: one line says why, and exit 0"
  expect_refusal() {  # sentence args...: exit 2, the sentence on stderr
    local sentence=$1; shift
    verify "$@"
    local rc=$?
    [ "$rc" = 2 ] || fail "verify $* exited $rc, not 2"
    grep -q "$sentence" "$out" || fail "verify $* did not say '$sentence'"
  }
  expect_refusal "cannot load the plugin" --plugin "$dir/no-such-plugin.so"
  expect_refusal "exports no function 'no_such_symbol'" --plugin "$lib" --symbol no_such_symbol
  expect_refusal "plugins take f32, f16 or bf16, not f64" --plugin "$lib" --dtype f64
  expect_refusal "unknown suite 'huge'" --plugin "$lib" --suite huge
  expect_refusal "give --bench too" --plugin "$lib" --bench-seq 128
  expect_refusal "give --bench too" --plugin "$lib" --python python3
  [ "${VERIFY_PLUGINS:-cpu}" = cpu ] && expect_refusal "runs none of the dtypes and head dims tried" --plugin "$lib" --dtype f16,bf16
  echo "bad input: one sentence and exit 2 each"
  exit 0
fi

id=$extra
lib=$dir/${prefix}_planted_$what.so
if [ "${5:-}" = full ]; then
  verify --plugin "$lib" --seed 24 --suite full
  rc=$?
  [ "$rc" = 1 ] || fail "the planted $what bug exited $rc on the full suite, not 1"
  grep -q "^diagnosis ($id): " "$out" || fail "the planted $what bug was not diagnosed as '$id' on the full suite"
  echo "planted $what: caught and named '$id' on the full suite (seed 24)"
fi
seeds=${VERIFY_SEEDS:-21 22 23}
bench=--bench  # on the first seed: a kernel that fails is not timed
for seed in $seeds; do
  verify --plugin "$lib" --seed "$seed" $bench
  rc=$?
  [ "$rc" = 1 ] || fail "the planted $what bug exited $rc at seed $seed, not 1 (a failed check)"
  grep -q "^diagnosis ($id): " "$out" || fail "the planted $what bug was not diagnosed as '$id' at seed $seed"
  grep -q "^first failing element: " "$out" || fail "no first failing element at seed $seed"
  if [ -n "$bench" ]; then
    grep -q "^bench: not timed, since some case failed" "$out" || fail "--bench did not say why it timed nothing"
    bench=
  fi
done
echo "planted $what: caught and named '$id' at seeds $seeds"
