"""Where one attention call's GPU time goes inside PyTorch: flashlab.torch against SDPA, kernel by kernel.

A forward + backward of grouped-query attention (a Llama's 16 query heads on 4 K/V heads, causal, bf16, batch 1; the
inputs (B, H, S, D) views of (B, S, H, D) memory, as a transformer's projections make them), called as a model's
layer calls it: each backend's whole pass timed with CUDA events (median of 20 after 3), then 10 passes under torch.profiler,
whose kernels are listed by their summed GPU time per pass. A kernel launched with programmatic dependent launch
(our dQ conversion) starts before the kernel it follows ends, so the sum of a backend's kernels can exceed its
pass's time.

    python3 scripts/torch_kernel_times.py 16384,64 16384,128      (SEQ,HEAD_DIM ...; needs flashlab on PYTHONPATH)
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import flashlab.torch as ft
from gpu_timing import median_ms  # (scripts/, beside this one)


def passes(seq, head_dim):
    q, d_o = (torch.randn(1, seq, 16, head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    k, v = (torch.randn(1, seq, 4, head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    return {"flashlab": lambda: ft.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True).backward(d_o),
            "sdpa": lambda: F.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True).backward(d_o)}


def main():
    for spec in sys.argv[1:]:
        seq, head_dim = map(int, spec.split(","))
        for who, call in passes(seq, head_dim).items():
            pass_ms = median_ms(call, 20)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    call()
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    kernels.setdefault(e.name[:90], []).append(e.device_time_total)
            print(json.dumps({"seq": seq, "head_dim": head_dim, "who": who,
                              "pass_ms_median": round(pass_ms, 4)}))
            for name, us in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
                print(f"   {sum(us) / 10 / 1000:8.4f} ms a pass  x{len(us) / 10:.1f}  {name}")


if __name__ == "__main__":
    main()
