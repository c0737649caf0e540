#!/usr/bin/env python3
"""Verifies the Triton kernel of attention.py with flashlab.verify and times it beside FlashLab's cuda-fa2 and
cuda-fa3-ws and PyTorch's SDPA: the run docs/VERIFY.md's walk-through "Check your own kernel: a Triton example" goes
through. Needs a CUDA GPU, PyTorch with CUDA, Triton, and FlashLab's module on PYTHONPATH:

    source scripts/python_path.sh build-device
    python3 examples/triton_attention/verify_and_bench.py OUT      # writes OUT/triton_attention.{txt,json}

It runs, in order:
  1. the quick suite (f32, f16, bf16 at head dims 32, 64, 128): the kernel computes in f16 and bf16 only, so the f32
     cases are listed as refused;
  2. the full suite (f16 and bf16 at head dims 32, 64, 128);
  3. a planted bug, to read a failure: the same kernel called with bottom-right masks read as top-left, which verify
     must fail and diagnose as `alignment`;
  4. the bench: the quick suite again at head dims 64 and 128 with bench=True, which times the kernel's forward on
     the FlashAttention-2 paper's shapes where it passed (the kernel has no backward, so forward only).
The text file holds the four reports as printed; the JSON file their data (VerifyReport.as_dict()), with the
device's name, the date and the versions. It exits 0 when the kernel passes both suites and the planted bug is
caught and named, 1 otherwise.
"""
import argparse
import datetime
import json
import os
import sys

import torch
import triton

import flashlab

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention import attention  # noqa: E402


def bottom_right_read_as_top_left(q, k, v, *, is_causal, causal_align, scale):
    """The kernel behind a wrapper with one bug: it drops the alignment it is asked for."""
    return attention(q, k, v, is_causal=is_causal, causal_align="top-left", scale=scale)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the folder to write triton_attention.txt and triton_attention.json into")
    parser.add_argument("--seed", type=int, default=1, help="the seed of the first suite (each next one adds 1)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    common = dict(device="cuda", layout="bhsd", name="triton-attention")
    runs = {
        "quick": flashlab.verify(attention, dtypes=("f32", "f16", "bf16"), head_dims=(32, 64, 128), suite="quick",
                                 seed=args.seed, **common),
        "full": flashlab.verify(attention, dtypes=("f16", "bf16"), head_dims=(32, 64, 128), suite="full",
                                seed=args.seed + 1, **common),
        "planted_alignment": flashlab.verify(bottom_right_read_as_top_left, dtypes=("f16", "bf16"),
                                             head_dims=(64,), seed=args.seed + 2, device="cuda", layout="bhsd",
                                             name="triton-attention, bottom-right read as top-left"),
        "bench": flashlab.verify(attention, dtypes=("bf16", "f16"), head_dims=(64, 128), suite="quick",
                                 seed=args.seed + 3, bench=True, **common),
    }
    planted = runs["planted_alignment"]
    ok = bool(runs["quick"]) and bool(runs["full"]) and bool(runs["bench"]) and not planted and \
        (planted.diagnosis or {}).get("id") == "alignment"

    header = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch.__version__, "triton": triton.__version__,
        "command": " ".join(["examples/triton_attention/verify_and_bench.py", *sys.argv[1:]]),
        "ok": ok,
    }
    text = [f"Triton attention (examples/triton_attention/attention.py) on {header['device']}, {header['date']}, "
            f"torch {header['torch']}, triton {header['triton']}"]
    for label, report in runs.items():
        text += ["", f"== {label}", str(report).rstrip()]
    text += ["", "result: " + ("the kernel passes both suites, and the planted bug is caught and named alignment" if ok
                               else "FAILED: see the reports above")]
    with open(os.path.join(args.out, "triton_attention.txt"), "w") as f:
        f.write("\n".join(text) + "\n")
    with open(os.path.join(args.out, "triton_attention.json"), "w") as f:
        json.dump(dict(header, **{label: report.as_dict() for label, report in runs.items()}), f, indent=1)
    print("\n".join(text))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
