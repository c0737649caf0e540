#!/usr/bin/env python3
"""The README's and lesson 08's cuda-fa3-ws tables, as Markdown, from one kept bench_vs_sdpa.sh result.

usage: readme_tables.py bench/results/h100-vs-sdpa_bf16_DATE.json [--ladder-head-dim 128] [--backward]

Prints two tables: cuda-fa3-ws beside cuda-fa2, PyTorch's flash and cuDNN (forward TFLOP/s and the
ratios), and the ablation ladder at one head dim with cuDNN beside it. With --backward instead: forward+
backward TFLOP/s of cuda-fa3-ws beside cuda-fa2, flash and cuDNN, the ratios to cuDNN and cuda-fa2, and the
backward alone (the shapes where both variants timed one). The numbers are the JSON's,
rounded as printed: paste them, never retype them.
"""
import argparse
import json


def fmt_ratio(x):
    return f"{x:.2f}×"


def backward_tflops(merged, variant, d, causal, n):
    """The backward pass alone, from the variant's own bench row (flashlab bench's TFLOP/s)."""
    for r in merged["flashlab"][variant]["rows"]:
        if (r["head_dim"], r["causal"] != "none", r["seq_q"]) == (d, causal, n) and r.get("backward_ms", -1) > 0:
            return r["backward_tflops"]
    return float("nan")


def print_backward_table(merged, rows):
    print("| d | causal | N | cuda-fa3-ws | cuda-fa2 | flash | cuDNN | vs cuDNN | vs cuda-fa2 | backward alone |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (variant, d, causal, n), r in sorted(rows.items(), key=lambda kv: kv[0][1:]):
        fa2 = rows.get(("cuda-fa2", d, causal, n), {}).get("ours_fwdbwd_tflops")
        if variant != "cuda-fa3-ws" or r.get("ours_fwdbwd_tflops") is None or fa2 is None:
            continue
        ours = r["ours_fwdbwd_tflops"]
        print(f"| {d} | {'yes' if causal else 'no'} | {n} | {ours:.0f} | {fa2:.0f} | {r['flash_fwdbwd_tflops']:.0f} | "
              f"{r['cudnn_fwdbwd_tflops']:.0f} | **{fmt_ratio(r['fwdbwd_ratio_vs_cudnn'])}** | {fmt_ratio(ours / fa2)} | "
              f"{backward_tflops(merged, 'cuda-fa3-ws', d, causal, n):.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("merged", help="a merged JSON written by bench_vs_sdpa.sh (vs_sdpa_table.py --merged)")
    ap.add_argument("--ladder-head-dim", type=int, default=128)
    ap.add_argument("--backward", action="store_true", help="the forward+backward table instead")
    args = ap.parse_args()
    merged = json.load(open(args.merged))
    rows = {(r["variant"], r["head_dim"], r["causal"], r["seq"]): r for r in merged["ratios"]}
    if args.backward:
        print_backward_table(merged, rows)
        return

    print("| d | causal | N | cuda-fa3-ws | cuda-fa2 | flash | cuDNN | vs flash | vs cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (variant, d, causal, n), r in sorted(rows.items(), key=lambda kv: kv[0][1:]):
        if variant != "cuda-fa3-ws":
            continue
        fa2 = rows.get(("cuda-fa2", d, causal, n), {}).get("ours_fwd_tflops", float("nan"))
        print(f"| {d} | {'yes' if causal else 'no'} | {n} | {r['ours_fwd_tflops']:.0f} | {fa2:.0f} | "
              f"{r['flash_fwd_tflops']:.0f} | {r['cudnn_fwd_tflops']:.0f} | {fmt_ratio(r['fwd_ratio_vs_flash'])} | "
              f"**{fmt_ratio(r['fwd_ratio_vs_cudnn'])}** |")

    ladder = [r for r in merged.get("ladder", []) if r["head_dim"] == args.ladder_head_dim]
    if ladder:
        steps = ["cuda-fa3-ws-step1", "cuda-fa3-ws-step2", "cuda-fa3-ws-step3", "cuda-fa3-ws-step4", "cuda-fa3-ws"]
        print()
        print("| causal | N | 1: one warpgroup, TMA + wgmma | 2: + producer/consumer | 3: + ping-pong | "
              "4: + intra-warpgroup overlap | 5: + persistent (`cuda-fa3-ws`) | cuDNN |")
        print("|---|---|---|---|---|---|---|---|")
        for r in sorted(ladder, key=lambda r: (r["causal"], r["seq"])):
            t = " | ".join(f"{r['fwd_tflops'][s]:.0f}" for s in steps)
            print(f"| {'yes' if r['causal'] else 'no'} | {r['seq']} | {t} | {r['cudnn_fwd_tflops']:.0f} |")


if __name__ == "__main__":
    main()
