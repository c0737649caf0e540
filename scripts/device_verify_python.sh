#!/usr/bin/env bash
# On the lent GPU machine, from the repository root, once `bash scripts/device_build.sh` has built build-device with
# the Python module: flashlab.verify from PyTorch, end to end, with everything it writes in OUT/.
#   1. the GPU Python tests that concern verify (test_module_gpu.py -k verify: the torch path's inputs, a correct
#      torch function at three seeds on the full suite, the seven planted bugs, autograd on a wrong forward, a torch
#      backward function, FlashLab's variants through flashlab.torch, the bench), and the FP8 test held to
#      within_fp8_rule (fp8_torch_path_on_its_own_quantization);                                       -> pytest.txt
#   2. FlashLab's own CUDA variants whose backward runs f16 / bf16 (cuda-fa2, cuda-fa3-ws: flashlab.variants()
#      says which), each through the public API as any user's function: O from flashlab.torch.FlashLabAttention,
#      the LSE from flashlab.attention, flashlab.verify(suite="full", device="cuda", backward="autograd"), bf16 and
#      f16; what a variant refuses is listed by verify. Head dims: cuda-fa2 32, 64, 96, 128 and 256, cuda-fa3-ws
#      64, 128 and 256 (every one each runs); another such variant, its backward's.             -> variants.{txt,json}
#   3. the Triton example, examples/triton_attention/verify_and_bench.py: quick and full suites, a planted bug, and
#      the bench beside cuda-fa2, cuda-fa3-ws and SDPA (skipped, saying so, where Triton does not import).
#                                                                                        -> triton_attention.{txt,json}
# About 4 minutes on an H100 (16 cores): the reference of the full suites runs in double on one core, about 15 s per
# variant here, Triton compiles a kernel per (dtype, head dim, mask), and the bench times 24 shapes per candidate.
# Usage: bash scripts/device_verify_python.sh OUT. Prints each step's tail and its time; exits 1 if any step failed.
set -uo pipefail
out=${1:?usage: bash scripts/device_verify_python.sh OUT}
mkdir -p "$out"
[ -d build-device/python/flashlab ] ||
  { echo "device_verify_python: build-device/python/flashlab is missing: run bash scripts/device_build.sh first"; exit 2; }
# shellcheck source=scripts/python_path.sh
source scripts/python_path.sh build-device >/dev/null
status=0

step() {  # step LOG COMMAND...: COMMAND's output into OUT/LOG, its last lines here; a failure is counted
  local log=$out/$1 start=$SECONDS rc
  shift
  echo "== $* (log: $log)"
  "$@" >"$log" 2>&1
  rc=$?
  tail -n 25 "$log"
  echo "-- exit $rc after $((SECONDS - start)) s"
  ((rc == 0)) || { echo "FAILED: $*"; status=1; }
}

verify_variants() {
  python3 - "$out" <<'PY'
import json, sys
import torch
import flashlab
import flashlab.torch as ft

HEAD_DIMS = {"cuda-fa2": (32, 64, 96, 128, 256), "cuda-fa3-ws": (64, 128, 256)}
DTYPE_NAME = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def through_flashlab_torch(row):
    name = row["name"]

    def attend(q, k, v, *, is_causal, causal_align, scale):  # (B, S, H, D) tensors
        if DTYPE_NAME[q.dtype] not in row["dtypes"]:
            raise NotImplementedError(f"{name} computes in {', '.join(row['dtypes'])}")
        if q.shape[-1] not in row["backward_head_dim_values"]:
            raise NotImplementedError(f"{name}'s backward runs head dims {row['backward_head_dims']}")
        o = ft.FlashLabAttention.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), name, is_causal,
                                       causal_align, scale, 0.0, 0, False)
        _, lse = flashlab.attention(q.detach(), k.detach(), v.detach(), variant=name, is_causal=is_causal,
                                    causal_align=causal_align, scale=scale, return_lse=True)
        return o.transpose(1, 2), torch.from_dlpack(lse)

    attend.__name__ = name
    return attend


out, ok, results, text = sys.argv[1], True, {}, []
rows = [r for r in flashlab.variants() if r["device"] == "cuda" and r["backward"] and {"f16", "bf16"} & set(r["dtypes"])]
for seed, row in enumerate(rows, start=101):
    if not row["available"]:
        text.append(f"{row['name']}: skipped, it needs compute capability {row['needs_compute_capability'] / 10:.1f}")
        continue
    report = flashlab.verify(through_flashlab_torch(row), backward="autograd", device="cuda", suite="full",
                             dtypes=("bf16", "f16"), head_dims=HEAD_DIMS.get(row["name"], row["backward_head_dim_values"]),
                             seed=seed)
    ok = ok and bool(report)
    results[row["name"]] = report.as_dict()
    text.append(str(report))
    print(f"{row['name']}: {report.as_dict()['passed']} pass, {report.as_dict()['failed']} fail, "
          f"{len(report.as_dict()['refused'])} refused", flush=True)
with open(f"{out}/variants.txt", "w") as f:
    f.write(f"{torch.cuda.get_device_name()}\n\n" + "\n".join(text))
with open(f"{out}/variants.json", "w") as f:
    json.dump({"device": torch.cuda.get_device_name(), "variants": results}, f, indent=1)
print("\n".join(text))
sys.exit(0 if ok and results else 1)
PY
}

started=$SECONDS
step pytest.txt env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/python/test_module_gpu.py -k "verify or fp8_torch_path_on_its_own_quantization"
step variants.log verify_variants
if python3 -c "import triton" 2>/dev/null; then
  step triton.log python3 examples/triton_attention/verify_and_bench.py "$out"
else
  echo "== the Triton example: skipped, this Python cannot import triton"
fi
echo "device_verify_python: $((SECONDS - started)) s in all; $([ $status = 0 ] && echo "every step passed" || echo "some step FAILED")"
exit $status
