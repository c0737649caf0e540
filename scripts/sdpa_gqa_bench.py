"""PyTorch's SDPA backends (cuDNN, flash) on grouped-query attention, timed as `flashlab bench` times ours.

The peers' benchmark (.deps/tools/sdpa_bench.py) times multi-head attention only; this one takes the K/V heads too,
for the shapes of a model with grouped-query attention (a Llama's 16 query heads on 4 K/V heads). Inputs are (B, H,
S, D) views of (B, S, H, D) memory, as a transformer's projections make them; bf16, causal; enable_gqa=True. Each
pass is captured in a CUDA graph and timed over --iters replays (gpu_timing.gpu_ms: the kernels' time, no host gaps
between them, as `flashlab bench` times ours); the backward is the forward + backward time minus the forward's.

    python3 scripts/sdpa_gqa_bench.py --shapes 4096,128,16,4 16384,64,16,4 [--json FILE]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpu_timing import gpu_ms  # (scripts/, beside this one)

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def row(seq, head_dim, heads, kv_heads, backend, iters, batch=1):
    def bshd(h):
        return torch.randn(batch, seq, h, head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)

    q, k, v = (x.requires_grad_() for x in (bshd(heads), bshd(kv_heads), bshd(kv_heads)))
    d_o = bshd(heads)
    gqa = kv_heads != heads
    out = {"batch": batch, "seq": seq, "head_dim": head_dim, "heads": heads, "kv_heads": kv_heads, "backend": backend}
    try:
        with sdpa_kernel([BACKENDS[backend]]):
            def forward():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

            def forward_backward():
                torch.autograd.grad(forward(), (q, k, v), d_o)

            fwd = gpu_ms(forward, iters)
            both = gpu_ms(forward_backward, iters)
        out.update(forward_ms=fwd, backward_ms=both - fwd)
    except RuntimeError as e:  # a backend that does not take the problem says why
        out["error"] = str(e).splitlines()[0][:200]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", required=True, help="SEQ,HEAD_DIM,HEADS,KV_HEADS (batch 1, causal)")
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows = []
    for shape in args.shapes:
        seq, head_dim, heads, kv_heads = map(int, shape.split(","))
        for backend in args.backends:
            rows.append(row(seq, head_dim, heads, kv_heads, backend, args.iters))
            print(json.dumps(rows[-1]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "setting": "bf16, causal, batch 1, enable_gqa; CUDA graph replays (gpu_timing.gpu_ms)", "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
