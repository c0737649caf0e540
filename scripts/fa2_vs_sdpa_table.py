#!/usr/bin/env python3
"""Ratio table of cuda-fa2 against PyTorch's SDPA backends, from one bench_vs_sdpa.sh run.

usage: fa2_vs_sdpa_table.py OURS.json SDPA.json [MERGED.json "what ran"]

Prints TFLOP/s ours / flash / cudnn (forward | forward+backward) and the ratios ours / flash.
With MERGED.json, also writes one file holding both raw result sets, the setting and the ratio rows
(the form kept in bench/results/). FLOPs are the ones `flashlab bench` counted (core/flops.hpp: the
FlashAttention papers' convention, the same as sdpa_bench.py's), recovered from its TFLOP/s and times.
"""
import json
import sys

ours = json.load(open(sys.argv[1]))
peers = json.load(open(sys.argv[2]))

mine = {}
for r in ours["rows"]:
    if r.get("status") != "ok":
        continue
    causal = r["causal"] != "none"
    fwd = r["forward_tflops"]
    both = float("nan")
    if r.get("backward_ms", -1) > 0:  # TFLOP/s x ms = 1e9 FLOPs, for each pass
        work = fwd * r["forward_ms"] + r["backward_tflops"] * r["backward_ms"]
        both = work / (r["forward_ms"] + r["backward_ms"])
    mine[(r["head_dim"], causal, r["seq_q"])] = (fwd, both, r["batch"], r["heads_q"])
peer = {}
for r in peers:
    if "fwd_tflops" in r:
        peer[(r["backend"], r["head_dim"], bool(r["causal"]), r["seq"])] = (r["fwd_tflops"], r.get("fwdbwd_tflops", float("nan")))

nan2 = (float("nan"), float("nan"))
rows = []
print(f"# {ours.get('device', '?')}: bf16, B*N = 16384, H*d = 2048; TFLOP/s (fwd | fwd+bwd)")
print(f"{'d':>3} {'causal':>6} {'N':>6} | {'ours':>11} | {'flash':>11} | {'cudnn':>11} | {'fwd ratio':>9} {'f+b ratio':>9}")
for k in sorted(mine):
    o = mine[k]
    f = peer.get(("flash",) + k, nan2)
    c = peer.get(("cudnn",) + k, nan2)
    print(f"{k[0]:>3} {int(k[1]):>6} {k[2]:>6} | {o[0]:5.0f} {o[1]:5.0f} | {f[0]:5.0f} {f[1]:5.0f} | {c[0]:5.0f} {c[1]:5.0f} | "
          f"{o[0] / f[0]:9.2f} {o[1] / f[1]:9.2f}")
    rows.append({"head_dim": k[0], "causal": k[1], "seq": k[2], "batch": o[2], "heads": o[3],
                 "ours_fwd_tflops": round(o[0], 1), "ours_fwdbwd_tflops": round(o[1], 1),
                 "flash_fwd_tflops": round(f[0], 1), "flash_fwdbwd_tflops": round(f[1], 1),
                 "cudnn_fwd_tflops": round(c[0], 1), "cudnn_fwdbwd_tflops": round(c[1], 1),
                 "fwd_ratio_vs_flash": round(o[0] / f[0], 3), "fwdbwd_ratio_vs_flash": round(o[1] / f[1], 3)})

if len(sys.argv) > 3:
    merged = {"device": ours.get("device"), "date": ours.get("date"),
              "command": sys.argv[4] if len(sys.argv) > 4 else "scripts/bench_vs_sdpa.sh",
              "setting": "bf16, B*N = 16384 tokens, H*d = 2048, causal = top-left; TFLOP/s with forward = "
                         "4 B H N^2 d (halved when causal), fwd+bwd = 3.5x forward",
              "ratios": rows, "cuda_fa2": ours, "pytorch_sdpa": peers}
    json.dump(merged, open(sys.argv[3], "w"), indent=1)
