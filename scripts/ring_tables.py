#!/usr/bin/env python3
"""Markdown table of ring attention over P GPUs: FlashLab's `flashlab ring --json` files beside PyTorch's
context parallelism (scripts/cp_bench.py --json), a row per method for each sequence length N and rank count P.

usage: ring_tables.py FILE.json...    (files of any kind below, in any order: the kind is read from each file)

Columns: forward ms, TFLOP/s and efficiency; the same for forward + backward; and FlashLab / PyTorch: on a
FlashLab row its TFLOP/s over the best PyTorch row's of the same N and P, on a PyTorch row the best FlashLab
row's over its own (forward | fwd+bwd; above 1, FlashLab is faster). Efficiency: one GPU's time on the whole
problem over P x the ring's time. `flashlab ring` times the backward pass alone: its fwd+bwd time is forward +
backward, its TFLOP/s both passes' FLOPs (recovered from its TFLOP/s and times, as it counted them) over that
time, and its efficiency the one-shot kernel's two passes over P x that time. Both tools count FLOPs alike
(forward 4 B H N^2 d, halved for causal; backward 2.5 x forward).

A third kind, `flashlab bench --json` of the block kernel on one GPU, gives the one-GPU time where the ring run
did not measure it. Where the whole problem would take too long on one GPU (N = 4M: minutes a pass), it is timed
with fewer heads and scaled by H / H_measured, and the efficiency is marked +: each head alone fills the GPU at
such lengths, so time grows with H in proportion; where a length was timed with both head counts, the table's
notes print how closely.
"""
import json
import sys


def size(n):
    for unit, shift in (("M", 20), ("k", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def num(x, digits):
    return "-" if x is None else f"{x:.{digits}f}"


def flashlab_entries(j):
    s = j["settings"]
    passes = {r["pass"]: r for r in j["rows"]}
    e = {"ours": True, "method": f"FlashLab {s['layout']} ({s['block_kernel']})", "seq": s["seq_q"],
         "ranks": s["ranks"], "shape": (s["batch"], s["heads"], s["head_dim"], s["dtype"], s["causal"] != "none")}
    e["kernel"] = s["block_kernel"]
    f, b = passes.get("forward"), passes.get("backward")
    if f:
        e.update(fwd_ms=f["ring_ms"], fwd_tflops=f["ring_tflops"],
                 one_fwd_ms=f["one_shot_ms"] if f["one_shot_ms"] > 0 else None)
    if f and b:
        ms = f["ring_ms"] + b["ring_ms"]
        work = f["ring_tflops"] * f["ring_ms"] + b["ring_tflops"] * b["ring_ms"]  # TFLOP/s x ms = 1e9 FLOPs
        one = f["one_shot_ms"] + b["one_shot_ms"] if f["one_shot_ms"] > 0 and b["one_shot_ms"] > 0 else None
        e.update(both_ms=ms, both_tflops=work / ms, one_both_ms=one)
    return [e], []


def one_gpu_entries(j):
    """The block kernel alone on one GPU (`flashlab bench --json`): a one-GPU time per length and head count."""
    s = j["settings"]
    entries = []
    for r in j["rows"]:
        if r.get("status") != "ok":
            continue
        e = {"one_gpu": True, "ours": False, "seq": r["seq_q"], "heads": r["heads_q"], "kernel": r["variant"],
             "rest": (r["batch"], r["head_dim"], r["dtype"], s["causal"] != "none"), "one_fwd_ms": r["forward_ms"]}
        if s.get("backward") and r.get("backward_ms", -1) > 0:
            e["one_both_ms"] = r["forward_ms"] + r["backward_ms"]
        entries.append(e)
    return entries, []


def efficiencies(entries, one_gpu):
    """Efficiency of FlashLab's rows: a run made with --no-one-shot takes the one-shot kernel's times from the run
    of the same problem, block kernel and GPU that measured them (timing the whole problem on one GPU once per
    length, not once per layout and rank count); failing that, from a one-GPU `flashlab bench` file of the same
    problem, with all its heads, else with fewer heads scaled up (then e["scaled"] holds the heads measured)."""
    for e in entries:
        if not e["ours"]:
            continue
        same = [g for g in entries if g["ours"] and g["seq"] == e["seq"] and g["shape"] == e["shape"]
                and g["kernel"] == e["kernel"] and g["device"] == e["device"]]
        batch, heads, head_dim, dtype, causal = e["shape"]
        benched = sorted((g for g in one_gpu if g["seq"] == e["seq"] and g["kernel"] == e["kernel"]
                          and g["device"] == e["device"] and g["rest"] == (batch, head_dim, dtype, causal)),
                         key=lambda g: (g["heads"] != heads, -g["heads"]))
        for one_key, ms_key, eff_key in (("one_fwd_ms", "fwd_ms", "fwd_eff"), ("one_both_ms", "both_ms", "both_eff")):
            one = e.get(one_key) or next((g[one_key] for g in same if g.get(one_key)), None)
            if not one:
                g = next((g for g in benched if g.get(one_key)), None)
                if g:
                    one = g[one_key] * heads / g["heads"]
                    if g["heads"] != heads:
                        e["scaled"] = g["heads"]
            e[eff_key] = one / (e["ranks"] * e[ms_key]) if one and e.get(ms_key) else None


def scaling_notes(one_gpu):
    """Where one length was timed on one GPU with two head counts: how closely time follows H."""
    notes = []
    for g in one_gpu:
        for h in one_gpu:
            if h is g or h["heads"] <= g["heads"] or (h["seq"], h["kernel"], h["rest"]) != (g["seq"], g["kernel"], g["rest"]):
                continue
            for key, name in (("one_fwd_ms", "forward"), ("one_both_ms", "forward + backward")):
                if g.get(key) and h.get(key):
                    k = h["heads"] / g["heads"]
                    notes.append(f"one GPU at N = {size(g['seq'])}, {name}: H = {h['heads']} took {h[key]:.1f} ms, "
                                 f"{k:g} x H = {g['heads']} {k * g[key]:.1f} ms (ratio {h[key] / (k * g[key]):.3f})")
    return notes


def cp_bench_entries(j):
    s = j["settings"]
    shape = (s["batch"], s["heads"], s["head_dim"], s["dtype"], True)
    entries, failures = [], []
    for r in j["rows"]:
        method = f"PyTorch CP {r['backend']}, {r['rotate']}"
        if r.get("status") != "ok":
            failures.append(f"{method}, N = {size(r['seq'])}, P = {s['ranks']}: {r.get('error', 'failed')}")
            continue
        entries.append({"ours": False, "method": method, "seq": r["seq"], "ranks": s["ranks"], "shape": shape,
                        "fwd_ms": r.get("forward_ms"), "fwd_tflops": r.get("forward_tflops"),
                        "fwd_eff": r.get("efficiency_forward"), "both_ms": r.get("fwdbwd_ms"),
                        "both_tflops": r.get("fwdbwd_tflops"), "both_eff": r.get("efficiency_fwdbwd")})
    return entries, failures


def load(path):
    with open(path) as f:
        j = json.load(f)
    if j.get("tool") == "cp_bench":
        entries, failures = cp_bench_entries(j)
        source = (f"{path}: PyTorch {j.get('torch')}, cuDNN {j.get('cudnn')}, {j['gpus']} x {j.get('device')}, "
                  f"{j.get('date')}")
    elif "settings" in j and "ranks" in j["settings"] and all("ring_ms" in r for r in j.get("rows", [])):
        entries, failures = flashlab_entries(j)
        source = f"{path}: flashlab ring, {j['settings']['ranks']} x {j.get('device')}, {j.get('date')}"
    elif j.get("device_kind") == "cuda" and "settings" in j and all("variant" in r for r in j.get("rows", [])):
        entries, failures = one_gpu_entries(j)
        source = f"{path}: flashlab bench, one {j.get('device')}, {j.get('date')}"
    else:
        raise SystemExit(f"ring_tables: {path} is not a `flashlab ring --json`, `flashlab bench --json` (cuda) or "
                         "cp_bench.py --json file")
    for e in entries:
        e["device"] = j.get("device")
    return entries, failures, source


def ratio(a, b):
    return a / b if a and b else None


def table(entries):
    """The markdown lines of one shape's rows, sorted by N, P, FlashLab first."""
    lines = ["| N | P | method | fwd ms | fwd TFLOP/s | fwd eff | fwd+bwd ms | fwd+bwd TFLOP/s | fwd+bwd eff "
             "| FlashLab / PyTorch (fwd \\| fwd+bwd) |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for e in sorted(entries, key=lambda e: (e["seq"], e["ranks"], not e["ours"], e["method"])):
        group = [g for g in entries if g["seq"] == e["seq"] and g["ranks"] == e["ranks"]]
        others = [g for g in group if g["ours"] != e["ours"]]
        ratios = []
        for key in ("fwd_tflops", "both_tflops"):
            best = max((g.get(key) or 0 for g in others), default=0)
            mine = e.get(key)
            ratios.append(ratio(mine, best) if e["ours"] else ratio(best, mine))
        ratio_text = "-" if all(r is None for r in ratios) else " \\| ".join(num(r, 2) for r in ratios)
        mark = "+" if e.get("scaled") else ""
        fwd_eff = num(e.get("fwd_eff"), 3) + (mark if e.get("fwd_eff") else "")
        both_eff = num(e.get("both_eff"), 3) + (mark if e.get("both_eff") else "")
        lines.append(f"| {size(e['seq'])} | {e['ranks']} | {e['method']} | {num(e.get('fwd_ms'), 2)} "
                     f"| {num(e.get('fwd_tflops'), 1)} | {fwd_eff} | {num(e.get('both_ms'), 2)} "
                     f"| {num(e.get('both_tflops'), 1)} | {both_eff} | {ratio_text} |")
    return lines


def main(paths):
    if not paths:
        raise SystemExit(__doc__)
    entries, failures, sources = [], [], []
    for path in paths:
        e, f, s = load(path)
        entries += e
        failures += f
        sources.append(s)
    one_gpu = [e for e in entries if e.get("one_gpu")]
    entries = [e for e in entries if not e.get("one_gpu")]
    efficiencies(entries, one_gpu)
    for shape in sorted({e["shape"] for e in entries}):
        rows = [e for e in entries if e["shape"] == shape]
        batch, heads, head_dim, dtype, causal = shape
        print(f"\n### B = {batch}, H = {heads}, d = {head_dim}, {dtype}, {'causal' if causal else 'not causal'}\n")
        print("\n".join(table(rows)))
        devices = {e["device"] for e in rows}
        if len(devices) > 1:
            print(f"\nNote: these rows come from different GPUs ({', '.join(sorted(map(str, devices)))}).")
        scaled = sorted({(e["seq"], e["scaled"]) for e in rows if e.get("scaled")})
        for seq, h in scaled:
            print(f"\n+ N = {size(seq)}: one GPU timed with H = {h} and scaled by {heads / h:g} (the whole problem on one "
                  "GPU would take minutes a pass).")
    notes = scaling_notes(one_gpu)
    if notes:
        print("\nOne GPU against H:\n" + "\n".join(f"- {n}" for n in notes))
    if failures:
        print("\nFailed (no timings):\n" + "\n".join(f"- {f}" for f in failures))
    print("\nSources:\n" + "\n".join(f"- {s}" for s in sources))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
