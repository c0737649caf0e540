#!/usr/bin/env python3
"""What a call from Python costs beyond the attention kernel itself, for FlashLab and, in the same run,
for PyTorch's scaled_dot_product_attention. Needs a CUDA GPU, PyTorch with CUDA, and FlashLab's module
and `flashlab` binary from one build:

    source scripts/python_path.sh build-device
    python3 scripts/python_overhead.py --flashlab-bin build-device/bin/flashlab --json overhead.json

Per sequence length N (the FA2 paper's setting: B * N = 16384 tokens, H * d = 2048), forward only:

  kernel_ms     the kernel alone, timed on the GPU with no host in between: FlashLab's by `flashlab bench`
                (CUDA events around back-to-back launches), PyTorch's by CUDA events around a loop of
                back-to-back calls, whose launches run ahead of the GPU.
  call_ms       wall time of one call that returns with its result complete, median of --iters. A FlashLab
                call always waits for its kernels (they run on the legacy default stream and the call
                synchronizes before it returns); PyTorch's is timed with torch.cuda.synchronize() after it,
                so the two are timed alike.
  overhead_us   call_ms - kernel_ms: what the call adds beyond the kernel (Python, checks, DLPack, launch,
                the synchronization).
  launch_us     PyTorch only: the wall time of the call itself, returning before its kernel finishes.

FlashLab is timed three ways: flashlab.attention on PyTorch tensors writing into given buffers (out=:
nothing allocated), flashlab.attention returning new DeviceArrays (a cudaMalloc per result, and a
cudaFree, which waits for the device, when each is dropped), and flashlab.torch.scaled_dot_product_attention
(the autograd Function, under torch.no_grad()).
"""
import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import flashlab
import flashlab.torch as ft

TOKENS, HIDDEN = 16384, 2048


def wall_ms(call, iters, warmup=5):
    """Median wall time of call() in ms; call() must return with its work complete."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def gpu_ms_back_to_back(call, iters, warmup=5):
    """GPU time per call of `iters` back-to-back calls, between two CUDA events (launches run ahead)."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        call()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def flashlab_kernel_ms(binary, variant, dtype, batch, heads, seq, head_dim, causal):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([binary, "bench", "--device", "cuda", "--variants", variant, "--dtype", dtype, "--batch",
                        str(batch), "--heads", str(heads), "--seq", str(seq), "--head-dim", str(head_dim), "--causal",
                        "top-left" if causal else "none", "--warmup", "5", "--iters", "20", "--json", out.name],
                       check=True, capture_output=True)
        row = json.load(open(out.name))["rows"][0]
    if row["status"] != "ok":
        raise SystemExit(f"flashlab bench did not time {variant} at N = {seq}: {row}")
    return row["forward_ms"]


def measure(args, seq):
    batch, heads = TOKENS // seq, HIDDEN // args.head_dim
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    torch.manual_seed(0)
    # nanoGPT's q, k, v: (B, H, N, d) views of (B, N, H, d) memory, read in place by FlashLab.
    q, k, v = (torch.randn(batch, seq, heads, args.head_dim, device="cuda", dtype=dtype).transpose(1, 2)
               for _ in range(3))
    options = dict(variant=args.variant, is_causal=args.causal, layout="bhsd")
    o = torch.empty_like(q.transpose(1, 2)).transpose(1, 2)
    lse = torch.empty(batch, heads, seq, device="cuda", dtype=torch.float32)

    kernel = flashlab_kernel_ms(args.flashlab_bin, args.variant, args.dtype, batch, heads, seq, args.head_dim,
                                args.causal)
    into_given = wall_ms(lambda: flashlab.attention(q, k, v, out=(o, lse), **options), args.iters)
    allocating = wall_ms(lambda: flashlab.attention(q, k, v, **options), args.iters)
    with torch.no_grad():
        wrapper = wall_ms(lambda: ft.scaled_dot_product_attention(q, k, v, is_causal=args.causal,
                                                                  variant=args.variant), args.iters)

        def pytorch_call():
            return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)

        def pytorch_synchronized():
            pytorch_call()
            torch.cuda.synchronize()

        pytorch_kernel = gpu_ms_back_to_back(pytorch_call, args.iters)
        pytorch_wall = wall_ms(pytorch_synchronized, args.iters)
        pytorch_launch = wall_ms(pytorch_call, args.iters)  # returns at launch; the queue drains between calls
        torch.cuda.synchronize()

    us = lambda ms: round(ms * 1e3, 1)
    return {
        "seq": seq, "batch": batch, "heads": heads, "head_dim": args.head_dim, "dtype": args.dtype,
        "causal": args.causal,
        "flashlab": {
            "variant": args.variant, "kernel_ms": kernel,
            "attention_out_given": {"call_ms": into_given, "overhead_us": us(into_given - kernel)},
            "attention_new_arrays": {"call_ms": allocating, "overhead_us": us(allocating - kernel)},
            "torch_sdpa_wrapper": {"call_ms": wrapper, "overhead_us": us(wrapper - kernel)},
        },
        "pytorch_sdpa": {
            "kernel_ms": pytorch_kernel, "call_ms": pytorch_wall, "overhead_us": us(pytorch_wall - pytorch_kernel),
            "launch_us": us(pytorch_launch),
        },
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flashlab-bin", default="build-device/bin/flashlab")
    parser.add_argument("--variant", default="cuda-fa2")
    parser.add_argument("--seqs", default="1024,16384")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    rows = [measure(args, int(n)) for n in args.seqs.split(",")]
    result = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["scripts/python_overhead.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "setting": f"forward only; B * N = {TOKENS} tokens, H * d = {HIDDEN}; medians of {args.iters} calls",
        "rows": rows,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
