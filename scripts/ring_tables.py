#!/usr/bin/env python3
"""Markdown table of ring attention over P GPUs: FlashLab's `flashlab ring --json` files beside PyTorch's
context parallelism (scripts/cp_bench.py --json), a row per method for each sequence length N and rank count P.

usage: ring_tables.py FILE.json...    (files of either kind, in any order: the kind is read from each file)

Columns: forward ms, TFLOP/s and efficiency; the same for forward + backward; and FlashLab / PyTorch: on a
FlashLab row its TFLOP/s over the best PyTorch row's of the same N and P, on a PyTorch row the best FlashLab
row's over its own (forward | fwd+bwd; above 1, FlashLab is faster). Efficiency: one GPU's time on the whole
problem over P x the ring's time. `flashlab ring` times the backward pass alone: its fwd+bwd time is forward +
backward, its TFLOP/s both passes' FLOPs (recovered from its TFLOP/s and times, as it counted them) over that
time, and its efficiency the one-shot kernel's two passes over P x that time. Both tools count FLOPs alike
(forward 4 B H N^2 d, halved for causal; backward 2.5 x forward).
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


def efficiencies(entries):
    """Efficiency of FlashLab's rows: a run made with --no-one-shot takes the one-shot kernel's times from the run
    of the same problem, block kernel and GPU that measured them (timing the whole problem on one GPU once per
    length, not once per layout and rank count)."""
    for e in entries:
        if not e["ours"]:
            continue
        same = [g for g in entries if g["ours"] and g["seq"] == e["seq"] and g["shape"] == e["shape"]
                and g["kernel"] == e["kernel"] and g["device"] == e["device"]]
        for one_key, ms_key, eff_key in (("one_fwd_ms", "fwd_ms", "fwd_eff"), ("one_both_ms", "both_ms", "both_eff")):
            one = e.get(one_key) or next((g[one_key] for g in same if g.get(one_key)), None)
            e[eff_key] = one / (e["ranks"] * e[ms_key]) if one and e.get(ms_key) else None


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
    else:
        raise SystemExit(f"ring_tables: {path} is neither a `flashlab ring --json` file nor a cp_bench.py --json file")
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
        lines.append(f"| {size(e['seq'])} | {e['ranks']} | {e['method']} | {num(e.get('fwd_ms'), 2)} "
                     f"| {num(e.get('fwd_tflops'), 1)} | {num(e.get('fwd_eff'), 3)} | {num(e.get('both_ms'), 2)} "
                     f"| {num(e.get('both_tflops'), 1)} | {num(e.get('both_eff'), 3)} | {ratio_text} |")
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
    efficiencies(entries)
    for shape in sorted({e["shape"] for e in entries}):
        rows = [e for e in entries if e["shape"] == shape]
        batch, heads, head_dim, dtype, causal = shape
        print(f"\n### B = {batch}, H = {heads}, d = {head_dim}, {dtype}, {'causal' if causal else 'not causal'}\n")
        print("\n".join(table(rows)))
        devices = {e["device"] for e in rows}
        if len(devices) > 1:
            print(f"\nNote: these rows come from different GPUs ({', '.join(sorted(map(str, devices)))}).")
    if failures:
        print("\nFailed (no timings):\n" + "\n".join(f"- {f}" for f in failures))
    print("\nSources:\n" + "\n".join(f"- {s}" for s in sources))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
