"""Our backward against cuDNN's inside PyTorch, interleaved round by round, with the GPU's clock and power read beside.

The Llama's attention (16 query heads on 4 K/V heads, causal, bf16, batch 1; (B, H, S, D) views of (B, S, H, D)
memory, as a transformer's projections make them) through flashlab.torch and through SDPA's cuDNN backend. Each
backend's forward and forward + backward are captured in CUDA graphs; every round replays each graph --iters times
between CUDA events, the two backends in turns (the first one alternating from round to round), so that both meet
the same warm-up, temperature and power state. The backward is a round's forward + backward time minus its forward.
Beside the rounds, `nvidia-smi` samples the SM clock, the power draw and the throttle reasons every 50 ms; each
forward + backward stretch is given the mean of the samples taken inside it.

    python3 scripts/torch_backward_race.py 16384,64 16384,128 [--rounds 8] [--iters 30] [--json FILE]

With --ncu-pass it instead runs each backend's forward + backward once per shape, flashlab's first, nothing timed: for
Nsight Compute, which then sees the backward kernels in that order (ncu -k regex:"backward_kernel|bprop"). The
backward runs on autograd's own thread, outside any NVTX range the caller opens, so they are told apart by order.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlab.torch as ft
from gpu_timing import captured, replay_ms  # (scripts/, beside this one)

HEADS, KV_HEADS = 16, 4


def inputs(seq, head_dim):
    def bshd(h):
        return torch.randn(1, seq, h, head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)

    q, k, v = (x.requires_grad_() for x in (bshd(HEADS), bshd(KV_HEADS), bshd(KV_HEADS)))
    return q, k, v, bshd(HEADS)


def calls(q, k, v, d_o):
    """{backend: (forward, forward_backward)}; SDPA held to cuDNN inside each call, so capture and replay agree."""
    def cudnn(x, y, z):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(x, y, z, is_causal=True, enable_gqa=True)

    def flashlab(x, y, z):
        return ft.scaled_dot_product_attention(x, y, z, is_causal=True, enable_gqa=True)

    out = {}
    for name, attend in (("flashlab", flashlab), ("cudnn", cudnn)):
        out[name] = (lambda a=attend: a(q, k, v),
                     lambda a=attend: torch.autograd.grad(a(q, k, v), (q, k, v), d_o))
    return out


class Sampler:
    """nvidia-smi every 50 ms into a file: (time, SM MHz, W, throttle reasons) rows, read back after the rounds."""
    FIELDS = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"

    def __init__(self):
        self.file = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
        index = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        self.proc = subprocess.Popen(["nvidia-smi", "-i", index, f"--query-gpu={self.FIELDS}",
                                      "--format=csv,noheader,nounits", "-lms", "50"], stdout=self.file)

    def samples(self):
        self.proc.terminate()
        self.proc.wait()
        rows = []
        with open(self.file.name) as f:
            for line in f:
                parts = [p.strip() for p in line.split(",")]
                try:
                    when = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
                    rows.append((when, float(parts[1]), float(parts[2]), parts[3]))
                except (ValueError, IndexError):
                    continue
        os.unlink(self.file.name)
        return rows


def race(seq, head_dim, rounds, iters):
    q, k, v, d_o = inputs(seq, head_dim)
    graphs = {name: (captured(fwd), captured(both)) for name, (fwd, both) in calls(q, k, v, d_o).items()}
    names = list(graphs)
    stretches = []  # (round, backend, forward ms, forward + backward ms, start, end)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            fwd, both = graphs[name]
            fwd_ms = replay_ms(fwd, iters)
            start = datetime.datetime.now()
            both_ms = replay_ms(both, iters)
            stretches.append((r, name, fwd_ms, both_ms, start, datetime.datetime.now()))
    return stretches


def summary(seq, head_dim, stretches, samples):
    rows = []
    for r, name, fwd_ms, both_ms, start, end in stretches:
        inside = [s for s in samples if start <= s[0] <= end]
        rows.append({"round": r, "backend": name, "forward_ms": round(fwd_ms, 4), "backward_ms": round(both_ms - fwd_ms, 4),
                     "sm_mhz": round(statistics.mean(s[1] for s in inside), 1) if inside else None,
                     "power_w": round(statistics.mean(s[2] for s in inside), 1) if inside else None,
                     "throttle": sorted({s[3] for s in inside}), "samples": len(inside)})
    by = {}
    for row in rows:
        by.setdefault(row["backend"], []).append(row)
    medians = {name: {key: statistics.median(x[key] for x in rs if x[key] is not None)
                      for key in ("forward_ms", "backward_ms", "sm_mhz", "power_w") if any(x[key] is not None for x in rs)}
               for name, rs in by.items()}
    ratios = [a["backward_ms"] / b["backward_ms"] for a, b in zip(by["flashlab"], by["cudnn"])]
    return {"seq": seq, "head_dim": head_dim, "heads": HEADS, "kv_heads": KV_HEADS, "medians": medians,
            "backward_flashlab_over_cudnn": {"median": round(statistics.median(ratios), 4),
                                             "min": round(min(ratios), 4), "max": round(max(ratios), 4)},
            "rounds": rows}


def ncu_pass(seq, head_dim):
    q, k, v, d_o = inputs(seq, head_dim)
    for _, both in calls(q, k, v, d_o).values():
        both()
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shapes", nargs="+", help="SEQ,HEAD_DIM")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json", help="write the summaries here")
    ap.add_argument("--ncu-pass", action="store_true", help="one pass of each backend, nothing timed")
    args = ap.parse_args()
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes]
    if args.ncu_pass:
        for seq, head_dim in shapes:
            ncu_pass(seq, head_dim)
        return
    out = []
    for seq, head_dim in shapes:
        sampler = Sampler()
        stretches = race(seq, head_dim, args.rounds, args.iters)
        out.append(summary(seq, head_dim, stretches, sampler.samples()))
        brief = {key: out[-1][key] for key in ("seq", "head_dim", "medians", "backward_flashlab_over_cudnn")}
        print(json.dumps(brief), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "command": "python3 scripts/torch_backward_race.py " + " ".join(sys.argv[1:]),
                       "setting": f"bf16, causal, batch 1, {HEADS} / {KV_HEADS} heads; CUDA graph replays, "
                                  "backends in turns", "shapes": out}, f, indent=2)


if __name__ == "__main__":
    main()
