#!/usr/bin/env python3
"""Ratio tables of FlashLab's variants against PyTorch's SDPA backends, from one bench_vs_sdpa.sh run.

usage: vs_sdpa_table.py --sdpa SDPA.json [--merged MERGED.json] [--label "what ran"] OURS.json...

Each OURS.json is one variant's merged `flashlab bench` rows (bench_vs_sdpa.sh writes
flashlab_VARIANT.json). Prints, per variant, TFLOP/s ours / flash / cuDNN and the ratios ours / flash
and ours / cuDNN: forward, and forward+backward where the variant timed a backward. When the ladder
ran (cuda-fa3-ws-step1..4 beside cuda-fa3-ws), also the ladder table: forward TFLOP/s of every step on
every shape, with cuDNN's beside. With --merged, writes one file holding every raw result set, the
setting and the ratio rows (the form kept in bench/results/). FLOPs are the ones `flashlab bench`
counted (core/flops.hpp: the FlashAttention papers' convention, the same as sdpa_bench.py's),
recovered from its TFLOP/s and times.
"""
import argparse
import json
import math

NAN = float("nan")
LADDER = ["cuda-fa3-ws-step1", "cuda-fa3-ws-step2", "cuda-fa3-ws-step3", "cuda-fa3-ws-step4", "cuda-fa3-ws"]


def ratio(a, b):
    return a / b if b and not math.isnan(b) and not math.isnan(a) else NAN


def rounded(x, digits=1):
    return None if math.isnan(x) else round(x, digits)


def load_ours(path):
    """{(d, causal, N): (fwd TFLOP/s, fwd+bwd TFLOP/s or nan, batch, heads)} of one variant."""
    j = json.load(open(path))
    rows = {}
    for r in j.get("rows", []):
        if r.get("status") != "ok":
            continue
        fwd = r["forward_tflops"]
        both = NAN
        if r.get("backward_ms", -1) > 0:  # TFLOP/s x ms = 1e9 FLOPs, for each pass
            work = fwd * r["forward_ms"] + r["backward_tflops"] * r["backward_ms"]
            both = work / (r["forward_ms"] + r["backward_ms"])
        rows[(r["head_dim"], r["causal"] != "none", r["seq_q"])] = (fwd, both, r["batch"], r["heads_q"])
    name = j.get("variant") or (j["rows"][0]["variant"] if j.get("rows") else path)
    return name, j, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdpa", required=True, help="sdpa_bench.py's --json output")
    ap.add_argument("--merged", help="write all result sets and the ratio rows here")
    ap.add_argument("--label", default="scripts/bench_vs_sdpa.sh", help="the merged JSON's \"command\"")
    ap.add_argument("ours", nargs="+", help="one merged flashlab bench JSON per variant")
    args = ap.parse_args()

    peers = json.load(open(args.sdpa))
    peer = {}
    for r in peers:
        if "fwd_tflops" in r:
            peer[(r["backend"], r["head_dim"], bool(r["causal"]), r["seq"])] = (r["fwd_tflops"], r.get("fwdbwd_tflops", NAN))
    nan2 = (NAN, NAN)

    variants = [load_ours(p) for p in args.ours]
    device = next((j.get("device") for _, j, _ in variants if j.get("device")), "?")
    ratio_rows = []
    for name, _, mine in variants:
        has_bwd = any(not math.isnan(v[1]) for v in mine.values())
        show = name not in LADDER[:-1]  # steps 1..4: in the ladder table below (and the merged JSON)
        out = print if show else (lambda *a, **k: None)
        out(f"\n# {name} on {device}: bf16, B*N = 16384, H*d = 2048; TFLOP/s" +
              (" (fwd | fwd+bwd)" if has_bwd else " (forward; this variant has no backward)"))
        w = 11 if has_bwd else 5
        head = f"{'d':>3} {'causal':>6} {'N':>6} | {'ours':>{w}} | {'flash':>{w}} | {'cudnn':>{w}} | {'/flash':>{w}} | {'/cudnn':>{w}}"
        out(head)
        for k in sorted(mine):
            o = mine[k]
            f = peer.get(("flash",) + k, nan2)
            c = peer.get(("cudnn",) + k, nan2)
            rf, rc = ratio(o[0], f[0]), ratio(o[0], c[0])
            bf, bc = ratio(o[1], f[1]), ratio(o[1], c[1])
            if has_bwd:
                out(f"{k[0]:>3} {int(k[1]):>6} {k[2]:>6} | {o[0]:5.0f} {o[1]:5.0f} | {f[0]:5.0f} {f[1]:5.0f} | "
                      f"{c[0]:5.0f} {c[1]:5.0f} | {rf:5.2f} {bf:5.2f} | {rc:5.2f} {bc:5.2f}")
            else:
                out(f"{k[0]:>3} {int(k[1]):>6} {k[2]:>6} | {o[0]:5.0f} | {f[0]:5.0f} | {c[0]:5.0f} | {rf:5.2f} | {rc:5.2f}")
            row = {"variant": name, "head_dim": k[0], "causal": k[1], "seq": k[2], "batch": o[2], "heads": o[3],
                   "ours_fwd_tflops": rounded(o[0]), "flash_fwd_tflops": rounded(f[0]),
                   "cudnn_fwd_tflops": rounded(c[0]), "fwd_ratio_vs_flash": rounded(rf, 3),
                   "fwd_ratio_vs_cudnn": rounded(rc, 3)}
            if has_bwd:
                row.update({"ours_fwdbwd_tflops": rounded(o[1]), "flash_fwdbwd_tflops": rounded(f[1]),
                            "cudnn_fwdbwd_tflops": rounded(c[1]), "fwdbwd_ratio_vs_flash": rounded(bf, 3),
                            "fwdbwd_ratio_vs_cudnn": rounded(bc, 3)})
            ratio_rows.append(row)

    # The ablation ladder: forward TFLOP/s of each step on each shape (each step adds one idea).
    by_name = {name: mine for name, _, mine in variants}
    ladder_rows = []
    if all(s in by_name for s in LADDER):
        print(f"\n# cuda-fa3-ws ablation ladder on {device}: forward TFLOP/s per step "
              "(1 one warpgroup TMA+wgmma, 2 +producer/consumer, 3 +ping-pong, 4 +intra-warpgroup overlap, "
              "5 +persistent = cuda-fa3-ws)")
        print(f"{'d':>3} {'causal':>6} {'N':>6} | " + " ".join(f"{'step' + str(i + 1):>6}" for i in range(5)) +
              f" | {'cudnn':>6} | {'5/1':>5} {'5/cudnn':>7}")
        shapes = sorted(set().union(*(by_name[s].keys() for s in LADDER)))
        for k in shapes:
            t = [by_name[s].get(k, nan2)[0] for s in LADDER]
            c = peer.get(("cudnn",) + k, nan2)[0]
            print(f"{k[0]:>3} {int(k[1]):>6} {k[2]:>6} | " + " ".join(f"{x:6.0f}" for x in t) +
                  f" | {c:6.0f} | {ratio(t[4], t[0]):5.2f} {ratio(t[4], c):7.2f}")
            ladder_rows.append({"head_dim": k[0], "causal": k[1], "seq": k[2],
                                "fwd_tflops": {s: rounded(x) for s, x in zip(LADDER, t)},
                                "cudnn_fwd_tflops": rounded(c)})

    if args.merged:
        merged = {"device": device, "date": next((j.get("date") for _, j, _ in variants if j.get("date")), None),
                  "command": args.label,
                  "setting": "bf16, B*N = 16384 tokens, H*d = 2048, causal = top-left; TFLOP/s with forward = "
                             "4 B H N^2 d (halved when causal), fwd+bwd = 3.5x forward",
                  "ratios": ratio_rows, "flashlab": {name: j for name, j, _ in variants}, "pytorch_sdpa": peers}
        if ladder_rows:
            merged["ladder"] = ladder_rows
        json.dump(merged, open(args.merged, "w"), indent=1)


if __name__ == "__main__":
    main()
