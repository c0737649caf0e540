#!/usr/bin/env python3
"""Every measured table of the README, docs/*.md and lessons/*/README.md, printed from bench/results/*.json.

The one script behind every measured table or figure in the Markdown. A table sits between two markers,

    <!-- generated: KIND ARG... -->
    ...the block, exactly as this script prints it...
    <!-- end generated -->

(or both markers on one line around a one-line result, for a figure quoted in prose), where each ARG is a
file name or glob relative to bench/results/ (globs and {a,b} alternatives are expanded and sorted) or a
key=value option. Markers inside fenced code blocks or `code spans` are text, not markers.

usage:
  readme_tables.py --check [FILE.md...]   exit 1 (printing a diff per block) when a block differs from what
                                          its sources give now; exit 2 on a malformed marker, an unknown KIND
                                          or a missing source. Default files: README.md, docs/*.md,
                                          lessons/*/README.md.
  readme_tables.py --write [FILE.md...]   regenerate every marked block in place.
  readme_tables.py --print KIND ARG...    print one block (what --write would put between the markers).
  readme_tables.py MERGED.json [--ladder-head-dim 128] [--backward]
                                          as before: the cuda-fa3-ws forward and ladder tables, or with
                                          --backward the forward+backward table, of one bench_vs_sdpa.sh file.

KINDs (every table block ends with a source note naming the files, device and date; source=no drops it):
  cpu-bench FILE                  cpu-naive against cpu-fa2: forward ms and extra memory per N
  readable-cuda FILE... [seq=N,N] the fp32 readable kernels per N: forward ms, fa2-simt TFLOP/s, extra memory
  fa2-vs-sdpa FILE                cuda-fa2 against PyTorch's flash and cuDNN, forward and forward+backward
  fa3-forward FILE                cuda-fa3-ws's forward beside cuda-fa2, flash and cuDNN
  fa3-ladder FILE head_dim=128    the ablation ladder at one head dim
  fa3-backward FILE               cuda-fa3-ws's forward+backward, and its backward alone
  long-sequences FILE             time and TFLOP/s of each variant and PyTorch peer, per N
  determinism FILE                the backward's TFLOP/s without and with --deterministic, and the cost
  python-overhead FILE            what a call costs beyond its kernel, per N and way of calling, beside PyTorch
  torch-overhead FILE             a flashlab.torch call's host time beside SDPA's, forward and with backward
  torch-calls FILE                the forward's host time per call: a round's first call, and the later ones
  torch-kernel-time FILE...       the GPU time of those calls (CUDA graph replays), FlashLab's beside SDPA's
  llama-step FILE...              a Llama training step with transformers' "sdpa" and with FlashLab, per S, d, mode
  ring-one-gpu FILE... [causal=yes|no]   flashlab bench --ring on one GPU: one-shot ms, efficiency per layout
  ring-gpus FILE...               ring attention over GPUs beside PyTorch's CP (scripts/ring_tables.py's table)
  lazy-rescale FILE               how often the online softmax rescales O, lazily and exactly (lazy_rescale_study)
  fp8-prepass FILE                the FP8 pre-pass from bf16 (quantizing; + the rotation) beside the FP8 forward
  fp8-error FILE [head_dim=N]     the emulated FP8 forward's RMSE of O per kind of input, beside bf16, without
                                  and with the Hadamard rotation (tools/fp8_error_study.cpp)
  fp8-sweep FILE [head_dim=N]     the same against the size of 4 outlier channels, with the RMS error of the
                                  scores from e4m3 Q and K (fp8_error_study --sweep)
  range KIND FILE... column=NAME [where=COL>=X...] [KIND's options]
                                  one line "a–b×": the range of one column of KIND's table over its rows
                                  (where: =, !=, <, <=, >, >= against a number, 2k / 1M allowed, or text)

The numbers are the JSON's, rounded as printed: paste markers, never numbers.
"""
import argparse
import contextlib
import difflib
import glob
import io
import json
import math
import os
import re
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ring_tables  # noqa: E402  (the ring-gpus table is ring_tables.py's own)

NAN = float("nan")
DASH = "—"


class Error(Exception):
    """A marker that cannot be generated: one clear sentence, exit 2."""


# ---------------------------------------------------------------------------------------------------------
# Formatting


def fmt_ratio(x):
    return f"{x:.2f}×"


def sig3(x):
    """Three significant digits, never in exponent form: 0.763, 8.66, 50.6, 239, 1753."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def fmt_ms(ms):
    return f"{sig3(ms)} ms"


def fmt_time(ms):
    return f"{sig3(ms / 1000)} s" if ms >= 1000 else fmt_ms(ms)


def fmt_bytes(b):
    """Binary units, three significant digits, trailing zeros dropped: 128 KiB, 1 GiB, 3.05 MiB."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    k = 0
    v = float(b)
    while v >= 1024 and k < len(units) - 1:
        v /= 1024
        k += 1
    text = f"{v:.0f}" if v >= 100 else f"{v:.3g}"
    return f"{text} {units[k]}"


def fmt_mib(b):
    v = b / (1 << 20)
    return (f"{v:.0f}" if v >= 100 else f"{v:.3g}") + " MiB"


def yes_no(causal):
    if isinstance(causal, str):
        causal = causal != "none"
    return "yes" if causal else "no"


def table_lines(header, rows, align=None):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align or ["---"] * len(header)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


# ---------------------------------------------------------------------------------------------------------
# The cuda-fa3-ws tables (also the command line's classic use)


def backward_tflops(merged, variant, d, causal, n):
    """The backward pass alone, from the variant's own bench row (flashlab bench's TFLOP/s)."""
    for r in merged["flashlab"][variant]["rows"]:
        if (r["head_dim"], r["causal"] != "none", r["seq_q"]) == (d, causal, n) and r.get("backward_ms", -1) > 0:
            return r["backward_tflops"]
    return NAN


def ratio_rows(merged):
    return {(r.get("variant", "cuda-fa2"), r["head_dim"], r["causal"], r["seq"]): r for r in merged["ratios"]}


def fa3_backward_lines(merged):
    rows = ratio_rows(merged)
    out = ["| d | causal | N | cuda-fa3-ws | cuda-fa2 | flash | cuDNN | vs cuDNN | vs cuda-fa2 | backward alone |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for (variant, d, causal, n), r in sorted(rows.items(), key=lambda kv: kv[0][1:]):
        fa2 = rows.get(("cuda-fa2", d, causal, n), {}).get("ours_fwdbwd_tflops")
        if variant != "cuda-fa3-ws" or r.get("ours_fwdbwd_tflops") is None or fa2 is None:
            continue
        ours = r["ours_fwdbwd_tflops"]
        out.append(f"| {d} | {'yes' if causal else 'no'} | {n} | {ours:.0f} | {fa2:.0f} | {r['flash_fwdbwd_tflops']:.0f} | "
                   f"{r['cudnn_fwdbwd_tflops']:.0f} | **{fmt_ratio(r['fwdbwd_ratio_vs_cudnn'])}** | {fmt_ratio(ours / fa2)} | "
                   f"{backward_tflops(merged, 'cuda-fa3-ws', d, causal, n):.0f} |")
    return out


def fa3_forward_lines(merged):
    rows = ratio_rows(merged)
    out = ["| d | causal | N | cuda-fa3-ws | cuda-fa2 | flash | cuDNN | vs flash | vs cuDNN |",
           "|---|---|---|---|---|---|---|---|---|"]
    for (variant, d, causal, n), r in sorted(rows.items(), key=lambda kv: kv[0][1:]):
        if variant != "cuda-fa3-ws":
            continue
        fa2 = rows.get(("cuda-fa2", d, causal, n), {}).get("ours_fwd_tflops", NAN)
        out.append(f"| {d} | {'yes' if causal else 'no'} | {n} | {r['ours_fwd_tflops']:.0f} | {fa2:.0f} | "
                   f"{r['flash_fwd_tflops']:.0f} | {r['cudnn_fwd_tflops']:.0f} | {fmt_ratio(r['fwd_ratio_vs_flash'])} | "
                   f"**{fmt_ratio(r['fwd_ratio_vs_cudnn'])}** |")
    return out


LADDER = ["cuda-fa3-ws-step1", "cuda-fa3-ws-step2", "cuda-fa3-ws-step3", "cuda-fa3-ws-step4", "cuda-fa3-ws"]


def fa3_ladder_lines(merged, head_dim):
    """The ablation ladder at one head dim; where the same run timed the FP8 forward ("cuda-fa3-ws e4m3", DTYPES
    with e4m3), its rung too: step 5 on e4m3 operands. cuDNN's column is bf16."""
    ladder = [r for r in merged.get("ladder", []) if r["head_dim"] == head_dim]
    if not ladder:
        return []
    fp8 = {(d, c, n): r for (v, d, c, n), r in ratio_rows(merged).items() if v == "cuda-fa3-ws e4m3"} \
        if "ratios" in merged else {}
    fp8_rung = any((head_dim, r["causal"], r["seq"]) in fp8 for r in ladder)
    out = ["| causal | N | 1: one warpgroup, TMA + wgmma | 2: + producer/consumer | 3: + ping-pong | "
           "4: + intra-warpgroup overlap | 5: + persistent (`cuda-fa3-ws`) | "
           + ("6: + FP8 operands (e4m3) | " if fp8_rung else "") + "cuDNN |",
           "|---|---|---|---|---|---|---|" + ("---|" if fp8_rung else "") + "---|"]
    for r in sorted(ladder, key=lambda r: (r["causal"], r["seq"])):
        t = " | ".join(f"{r['fwd_tflops'][s]:.0f}" for s in LADDER)
        if fp8_rung:
            e = fp8.get((head_dim, r["causal"], r["seq"]))
            t += " | " + (f"{e['ours_fwd_tflops']:.0f}" if e else "–")
        out.append(f"| {'yes' if r['causal'] else 'no'} | {r['seq']} | {t} | {r['cudnn_fwd_tflops']:.0f} |")
    return out


def classic_main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("merged", help="a merged JSON written by bench_vs_sdpa.sh (vs_sdpa_table.py --merged)")
    ap.add_argument("--ladder-head-dim", type=int, default=128)
    ap.add_argument("--backward", action="store_true", help="the forward+backward table instead")
    args = ap.parse_args(argv)
    with open(args.merged) as f:
        merged = json.load(f)
    if args.backward:
        print("\n".join(fa3_backward_lines(merged)))
        return 0
    print("\n".join(fa3_forward_lines(merged)))
    ladder = fa3_ladder_lines(merged, args.ladder_head_dim)
    if ladder:
        print()
        print("\n".join(ladder))
    return 0


# ---------------------------------------------------------------------------------------------------------
# The other kinds. Each takes (sources, options) and returns its lines; sources are [(display path, json)].


def one(kind, sources):
    if len(sources) != 1:
        raise Error(f"{kind} reads one file, and its arguments name {len(sources)}: "
                    f"{', '.join(p for p, _ in sources) or 'none'}")
    return sources[0][1]


def cpu_bench(sources, opts):
    j = one("cpu-bench", sources)
    rows = {(r["variant"], r["seq_q"]): r for r in j["rows"]}
    seqs = sorted({n for _, n in rows})

    def cell(variant, n, what):
        r = rows.get((variant, n))
        if r is None:
            return "not run"
        if r.get("status") != "ok":
            return status_text(r)
        return fmt_ms(r["forward_ms"]) if what == "ms" else fmt_mib(r["extra_bytes"])

    body = [[ring_tables.size(n), cell("cpu-naive", n, "ms"), cell("cpu-fa2", n, "ms"), cell("cpu-naive", n, "mem"),
             cell("cpu-fa2", n, "mem")] for n in seqs]
    return table_lines(["N", "cpu-naive fwd", "cpu-fa2 fwd", "naive extra memory", "cpu-fa2 extra memory"], body)


def status_text(r):
    """A row that did not run, shortened: "refused: needs 1 TiB" for a size whose matrices do not fit."""
    reason = r.get("reason") or r.get("error") or ""
    m = re.search(r"needs (\d+) MiB", reason)
    if r.get("status") == "skipped" and m:
        return f"refused: needs {fmt_bytes(int(m.group(1)) << 20)}"
    return r.get("status", "failed")


READABLE = [("cuda-naive", "naive"), ("cuda-cublas", "cuBLAS"), ("cuda-fa1", "fa1"), ("cuda-fa2-simt", "fa2-simt")]


def int_list(text, name):
    try:
        return [parse_number(x) for x in text.split(",")]
    except ValueError:
        raise Error(f"{name}={text} is not a comma-separated list of numbers")


def readable_cuda(sources, opts):
    rows = {}
    for _, j in sources:
        for r in j["rows"]:
            rows[(r["variant"], r["seq_q"])] = r
    present = [(v, name) for v, name in READABLE if any(k[0] == v for k in rows)]
    seqs = sorted({n for _, n in rows})
    if "seq" in opts:
        seqs = [int(n) for n in int_list(opts["seq"], "seq")]
    body = []
    for n in seqs:
        cells, last = [], None
        for v, _ in present:
            r = rows.get((v, n))
            if r is None:
                text = "not run"
            elif r.get("status") == "ok":
                text = fmt_ms(r["forward_ms"])
            else:
                text = status_text(r)
                # a second refusal for the same reason in a row says only "refused"
                text = "refused" if text == last and text.startswith("refused") else text
            last = text if r is not None and r.get("status") != "ok" else None
            cells.append(text)
        simt = rows.get(("cuda-fa2-simt", n))
        naive = rows.get(("cuda-naive", n))
        tflops = f"{simt['forward_tflops']:.1f}" if simt and simt.get("status") == "ok" else DASH
        mem_naive = fmt_bytes(naive["extra_bytes"]) if naive and naive.get("status") == "ok" else DASH
        mem_simt = fmt_bytes(simt["extra_bytes"]) if simt and simt.get("status") == "ok" else DASH
        body.append([ring_tables.size(n)] + cells + [tflops, f"{mem_naive} → {mem_simt}"])
    header = ["N"] + [f"{name} fwd" for _, name in present] + ["fa2-simt TFLOP/s", "extra memory, naive → fa2-simt"]
    return table_lines(header, body)


def fa2_vs_sdpa(sources, opts):
    j = one("fa2-vs-sdpa", sources)
    variant = opts.get("variant", "cuda-fa2")
    rows = [r for r in j["ratios"] if r.get("variant", "cuda-fa2") == variant]
    if not rows:
        raise Error(f"{sources[0][0]} has no ratio rows of {variant}")
    body = []
    for r in sorted(rows, key=lambda r: (r["head_dim"], r["causal"], r["seq"])):
        def t(key):
            v = r.get(key)
            return DASH if v is None else f"{v:.0f}"

        def q(key):
            v = r.get(key)
            return DASH if v is None else f"**{fmt_ratio(v)}**"

        body.append([str(r["head_dim"]), yes_no(r["causal"]), str(r["seq"]), t("ours_fwd_tflops"),
                     t("flash_fwd_tflops"), t("cudnn_fwd_tflops"), q("fwd_ratio_vs_flash"), t("ours_fwdbwd_tflops"),
                     t("flash_fwdbwd_tflops"), q("fwdbwd_ratio_vs_flash")])
    return table_lines(["d", "causal", "N", "ours fwd", "flash fwd", "cuDNN fwd", "fwd ratio", "ours f+b",
                        "flash f+b", "f+b ratio"], body)


def fa3_forward(sources, opts):
    return fa3_forward_lines(one("fa3-forward", sources))


def fa3_vs_cudnn(sources, opts):
    """cuda-fa3-ws against cuDNN alone, both passes (a bench_vs_sdpa.sh run of that one variant, e.g. one head dim):
    forward TFLOP/s and forward+backward TFLOP/s, each with the ratio to cuDNN's in the same run."""
    rows = ratio_rows(one("fa3-vs-cudnn", sources))
    body = []
    for (variant, d, causal, n), r in sorted(rows.items(), key=lambda kv: kv[0][1:]):
        if variant != "cuda-fa3-ws":
            continue
        both = r.get("ours_fwdbwd_tflops")
        body.append([str(d), yes_no(causal), str(n), f"{r['ours_fwd_tflops']:.0f}", f"{r['cudnn_fwd_tflops']:.0f}",
                     f"**{fmt_ratio(r['fwd_ratio_vs_cudnn'])}**",
                     "—" if both is None else f"{both:.0f}",
                     "—" if both is None else f"{r['cudnn_fwdbwd_tflops']:.0f}",
                     "—" if both is None else f"**{fmt_ratio(r['fwdbwd_ratio_vs_cudnn'])}**"])
    if not body:
        raise Error(f"{sources[0][0]} has no cuda-fa3-ws rows")
    return table_lines(["d", "causal", "N", "forward", "cuDNN", "vs cuDNN", "fwd+bwd", "cuDNN fwd+bwd", "vs cuDNN"],
                       body)


def timeline_blocks(sources, opts):
    """Per recorded forward timeline (flashlab bench --timeline): medians over its consumer lanes of one K/V block
    (a consumer's wgmma issue to its next), the S GEMM (an issue to the wait that follows it), the softmax span, and
    the softmax's share of the lanes' time; keys=B1,B2,... (the runs' K/V block widths, in file order) adds the
    same per key."""
    keys = []
    if "keys" in opts:
        try:
            keys = [int(k) for k in opts["keys"].split(",")]
        except ValueError:
            raise Error(f"keys={opts['keys']} is not a list of numbers")
        if len(keys) != len(sources):
            raise Error(f"keys= names {len(keys)} block widths for {len(sources)} timelines")
    head = ["run", "K/V block", "S GEMM", "softmax", "softmax's share"]
    if keys:
        head += ["K/V block a key", "softmax a key"]
    body = []
    for n, (path, j) in enumerate(sources):
        lanes = {}
        for e in j.get("traceEvents", []):
            if e.get("ph") in ("X", "i", "I") and e.get("tid", 0) != 0:  # lane 0 is the producer
                lanes.setdefault((e["pid"], e["tid"]), []).append(e)
        if not lanes:
            raise Error(f"{path} has no consumer lanes: is it a flashlab bench --timeline file of a forward?")
        cycle, gemm, soft, share_num, share_den = [], [], [], 0.0, 0.0
        for events in lanes.values():
            events.sort(key=lambda e: e["ts"])
            issues = [e["ts"] for e in events if e["name"] == "wgmma_issue"]
            cycle += [b - a for a, b in zip(issues, issues[1:])]
            last = None
            for e in events:
                if e["name"] == "wgmma_issue":
                    last = e["ts"]
                elif e["name"] == "wgmma_wait" and last is not None:
                    gemm.append(e["ts"] - last)
                    last = None
            spans = [e["dur"] for e in events if e["name"] == "softmax"]
            soft += spans
            share_num += sum(spans)
            share_den += max(e["ts"] + e.get("dur", 0) for e in events) - events[0]["ts"]
        # The first issue of each tile follows the previous tile's epilogue: the median leaves those gaps out.
        med = lambda xs: sorted(xs)[len(xs) // 2]
        label = j.get("otherData", {}).get("label", path).split(", B=")[0].replace("ladder step 5, ", "")
        row = [label, f"{med(cycle):.2f} µs", f"{med(gemm):.2f} µs", f"{med(soft):.2f} µs",
               f"{100 * share_num / share_den:.0f}%"]
        if keys:
            row += [f"{1000 * med(cycle) / keys[n]:.1f} ns", f"{1000 * med(soft) / keys[n]:.1f} ns"]
        body.append(row)
    return table_lines(head, body)


def fp8_forward(sources, opts):
    """The FP8 (e4m3) forward beside our bf16 forward and cuDNN's bf16, from one bench_vs_sdpa.sh run with
    DTYPES="bf16 e4m3" (the variant "cuda-fa3-ws e4m3")."""
    rows = ratio_rows(one("fp8-forward", sources))
    out = ["| d | causal | N | e4m3 | bf16 (ours) | cuDNN bf16 | vs our bf16 | vs cuDNN bf16 |",
           "|---|---|---|---|---|---|---|---|"]
    for (variant, d, causal, n), r in sorted(rows.items(), key=lambda kv: kv[0][1:]):
        bf16 = rows.get(("cuda-fa3-ws", d, causal, n), {}).get("ours_fwd_tflops")
        if variant != "cuda-fa3-ws e4m3" or bf16 is None:
            continue
        out.append(f"| {d} | {'yes' if causal else 'no'} | {n} | {r['ours_fwd_tflops']:.0f} | {bf16:.0f} | "
                   f"{r['cudnn_fwd_tflops']:.0f} | **{fmt_ratio(r['ours_fwd_tflops'] / bf16)}** | "
                   f"{fmt_ratio(r['fwd_ratio_vs_cudnn'])} |")
    return out


def fa3_ladder(sources, opts):
    try:
        head_dim = int(opts.get("head_dim", "128"))
    except ValueError:
        raise Error(f"head_dim={opts['head_dim']} is not a number")
    lines = fa3_ladder_lines(one("fa3-ladder", sources), head_dim)
    if not lines:
        raise Error(f"{sources[0][0]} has no ladder rows at head_dim={head_dim}")
    return lines


def fa3_backward(sources, opts):
    return fa3_backward_lines(one("fa3-backward", sources))


PEERS = {"flash": "flash", "cudnn": "cuDNN", "efficient": "efficient", "math": "math"}


def long_sequences(sources, opts):
    j = one("long-sequences", sources)
    benches = j["flashlab"] if isinstance(j["flashlab"], list) else [j["flashlab"]]
    series = []  # (name, {N: (ms, tflops)})

    def add(name, n, ms, tflops):
        for s in series:
            if s[0] == name:
                s[1][n] = (ms, tflops)
                return
        series.append((name, {n: (ms, tflops)}))

    for b in benches:
        for r in b["rows"]:
            if r.get("status") == "ok":
                add(r["variant"], r["seq_q"], r["forward_ms"], r["forward_tflops"])
    for r in j.get("pytorch_sdpa", []):
        if "fwd_tflops" in r:
            add(PEERS.get(r["backend"], r["backend"]), r["seq"], r["fwd_ms"], r["fwd_tflops"])
    seqs = sorted({n for _, d in series for n in d})
    header = ["N"]
    for name, _ in series:
        header += [f"{name} time", f"{name} TFLOP/s"]
    body = []
    for n in seqs:
        row = [ring_tables.size(n)]
        for _, d in series:
            row += [fmt_time(d[n][0]), f"{d[n][1]:.0f}"] if n in d else [DASH, DASH]
        body.append(row)
    return table_lines(header, body)


def determinism(sources, opts):
    j = one("determinism", sources)
    rows = {}
    for r in j["rows"]:
        if r.get("status") == "ok" and r.get("backward_ms", -1) > 0:
            rows[(r["head_dim"], r["causal"] != "none", r["seq_q"], bool(r.get("deterministic")))] = r
    body = []
    for d, causal, n in sorted({k[:3] for k in rows}):
        plain, det = rows.get((d, causal, n, False)), rows.get((d, causal, n, True))
        if not plain or not det:
            continue
        a, b = plain["backward_tflops"], det["backward_tflops"]
        body.append([str(d), yes_no(causal), ring_tables.size(n), f"{a:.0f}", f"{b:.0f}", f"{(1 - b / a) * 100:.0f}%"])
    return table_lines(["d", "causal", "N", "backward TFLOP/s", "with `--deterministic`", "cost"], body)


def python_overhead(sources, opts):
    j = one("python-overhead", sources)
    ways = [("attention_out_given", "out given"), ("attention_new_arrays", "new arrays"),
            ("torch_sdpa_wrapper", "`flashlab.torch`")]
    variant = next((r["flashlab"].get("variant") for r in j["rows"]), "flashlab")
    header = ["N", "B × H", f"`{variant}` kernel"] + [f"beyond it: {name}" for _, name in ways] + \
             ["PyTorch SDPA kernel", "beyond it: PyTorch's call"]
    body = []
    for r in sorted(j["rows"], key=lambda r: r["seq"]):
        f, p = r["flashlab"], r["pytorch_sdpa"]
        body.append([ring_tables.size(r["seq"]), f"{r['batch']} × {r['heads']}", fmt_ms(f["kernel_ms"])] +
                    [f"{f[key]['overhead_us']:.0f} µs" if key in f else DASH for key, _ in ways] +
                    [fmt_ms(p["kernel_ms"]), f"{p['overhead_us']:.0f} µs"])
    return table_lines(header, body)


SDPA_BACKENDS = {"cudnn": "cuDNN", "flash": "flash", "efficient": "memory-efficient", "math": "math"}


def with_backend(cell, sdpa):
    """A cell of SDPA's, with the backend it ran (torch_overhead.py records it from the kernels' names) where known."""
    return f"{cell} ({SDPA_BACKENDS[sdpa['backend']]})" if "backend" in sdpa else cell


def torch_overhead(sources, opts):
    j = one("torch-overhead", sources)
    names = {"forward": "forward", "forward_backward": "forward + backward"}
    paired = all("host_us_over_sdpa_quartiles" in r[key] for r in j["rows"] for key in names)
    header = ["N", "B × H, d", "pass", "`flashlab.torch`", "its operator alone", "PyTorch SDPA", "difference"]
    if paired:
        header.append("middle half of the rounds")
    body = []
    for r in sorted(j["rows"], key=lambda r: r["seq"]):
        for key, name in names.items():
            p = r[key]
            line = [ring_tables.size(r["seq"]), torch_heads(r), name,
                    f"{p['flashlab']['host_us']:.0f} µs", f"{p['flashlab']['operator_alone_host_us']:.0f} µs",
                    with_backend(f"{p['sdpa']['host_us']:.0f} µs", p["sdpa"]), f"{p['host_us_over_sdpa']:+.0f} µs"]
            if paired:
                low, high = p["host_us_over_sdpa_quartiles"]
                line.append(f"{low:+.0f} to {high:+.0f} µs")
            body.append(line)
    return table_lines(header, body)


def torch_calls(sources, opts):
    """The forward's rounds split: the first call of a round, made right after the host waited for the GPU, and the
    calls after it (torch_overhead.py's first_call_host_us, later_calls_host_us)."""
    j = one("torch-calls", sources)
    rows = [r for r in sorted(j["rows"], key=lambda r: r["seq"]) if "first_call_host_us" in r["forward"]]
    if not rows:
        raise Error("torch-calls: the file was written before torch_overhead.py split a round's first call from the "
                    "later ones (first_call_host_us)")
    who = (("flashlab", "`flashlab.torch`"), ("operator", "its operator alone"), ("sdpa", "PyTorch SDPA"))
    header = ["N", "B × H, d", "call of a round"] + [name for _, name in who]
    body = []
    for r in rows:
        p = r["forward"]
        for key, name in (("first_call_host_us", "the first"), ("later_calls_host_us", "each later one")):
            body.append([ring_tables.size(r["seq"]), torch_heads(r), name] +
                        [f"{p[key][w]:.0f} µs" for w, _ in who])
    return table_lines(header, body)


def torch_heads(r):
    """B × H (or B × H_q/H_kv under GQA), d: a torch_overhead.py row's problem."""
    kv = r.get("kv_heads", r["heads"])
    heads = str(r["heads"]) if kv == r["heads"] else f"{r['heads']}/{kv}"
    return f"{r['batch']} × {heads}, {r['head_dim']}"


def torch_kernel_time(sources, opts):
    header = ["N", "B × H, d", "pass", "FlashLab (GPU)", "PyTorch SDPA (GPU)", "SDPA / FlashLab"]
    body = []
    for path, j in sources:
        if not all("kv_heads" in r for r in j["rows"]):
            raise Error(f"{path} was written before scripts/torch_overhead.py timed GPU time from CUDA graph replays "
                        "(its gpu_ms then timed back-to-back calls, which the host paces at small N)")
        for r in sorted(j["rows"], key=lambda r: r["seq"]):
            for key, name in (("forward", "forward"), ("forward_backward", "forward + backward")):
                ours, theirs = r[key]["flashlab"]["gpu_ms"], r[key]["sdpa"]["gpu_ms"]
                body.append([ring_tables.size(r["seq"]), torch_heads(r), name, fmt_ms(ours),
                             with_backend(fmt_ms(theirs), r[key]["sdpa"]), fmt_ratio(theirs / ours)])
    if not body:
        raise Error("torch-kernel-time: the files hold no rows")
    return table_lines(header, body)


def llama_step(sources, opts):
    """A row per (S, d, mode). Files from llama_step_bench.py's paired rounds add the median over the rounds of SDPA's
    step over FlashLab's in the same round, and its quartiles."""
    rows = [r for _, j in sources for r in j["rows"]]
    if not rows:
        raise Error("llama-step: the files hold no rows")
    paired = any("paired_sdpa_over_flashlab" in r for r in rows)
    header = ["S", "d", "mode", "SDPA step", "FlashLab step", "SDPA / FlashLab"]
    if paired:
        header += ["round by round", "middle half of the rounds"]
    body = []
    for r in sorted(rows, key=lambda r: (r["compiled"], r["head_dim"], r["seq"])):
        line = [ring_tables.size(r["seq"]), str(r["head_dim"]), "compiled" if r["compiled"] else "eager",
                fmt_ms(r["sdpa"]["step_ms"]), fmt_ms(r["flashlab"]["step_ms"]), fmt_ratio(r["sdpa_over_flashlab"])]
        if "paired_sdpa_over_flashlab" in r:
            low, high = r["paired_sdpa_over_flashlab_quartiles"]
            line += [fmt_ratio(r["paired_sdpa_over_flashlab"]), f"{low:.2f}–{high:.2f}×"]
        elif paired:
            line += ["—", "—"]  # (a run from before the paired rounds)
        body.append(line)
    return table_lines(header, body)


LAYOUTS = ["contiguous", "zigzag", "striped"]


def ring_one_gpu(sources, opts):
    want = opts.get("causal")
    if want not in (None, "yes", "no"):
        raise Error(f"causal={want}: say causal=yes or causal=no")
    groups = []  # (kernel, N, causal, ranks, pass) -> {layout: row}
    cells = {}
    used = []
    for path, j in sources:
        s = j.get("settings", {})
        if "ring_ranks" not in s:
            raise Error(f"{path} is not a `flashlab bench --ring` file")
        causal = s["causal"] != "none"
        if want is not None and yes_no(causal) != want:
            continue
        used.append((path, j))
        for r in j["rows"]:
            if r.get("status") != "ok":
                continue
            for pas in ("forward", "backward"):
                if r.get(f"{pas}_ms") is None:
                    continue
                key = (s["block_kernel"], r["seq"], causal, s["ring_ranks"], pas)
                if key not in cells:
                    cells[key] = {}
                    groups.append(key)
                cells[key][r["layout"]] = r
    kernels = []
    for k in groups:
        if k[0] not in kernels:
            kernels.append(k[0])
    order = sorted(groups, key=lambda k: (kernels.index(k[0]), not k[2], k[1], k[3], k[4] != "forward"))
    show_causal = len({k[2] for k in groups}) > 1
    show_ranks = len({k[3] for k in groups}) > 1
    header = ["N"] + (["causal"] if show_causal else []) + (["ranks"] if show_ranks else []) + \
             ["blocks", "pass", "one-shot"] + LAYOUTS
    body = []
    for key in order:
        kernel, n, causal, ranks, pas = key
        c = cells[key]
        one_shot = c.get("one-shot")
        row = [ring_tables.size(n)] + ([yes_no(causal)] if show_causal else []) + ([str(ranks)] if show_ranks else [])
        row += [f"`{kernel}`", pas, f"{one_shot[pas + '_ms']:.0f} ms" if one_shot else DASH]
        row += [f"{c[l][pas + '_efficiency']:.3f}" if l in c and c[l].get(pas + "_efficiency") is not None else DASH
                for l in LAYOUTS]
        body.append(row)
    if not body:
        raise Error(f"no row of {', '.join(p for p, _ in sources)} is {'causal' if want == 'yes' else 'not causal'}")
    return table_lines(header, body), used


def ring_gpus(sources, opts):
    """ring_tables.py's own output for these files, less its heading (when one shape) and its Sources list."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            ring_tables.main([os.path.join(RESULTS, p[len("bench/results/"):]) for p, _ in sources])
    except SystemExit as e:
        raise Error(str(e).replace(RESULTS + os.sep, "bench/results/"))
    lines = out.getvalue().split("\n")
    if "Sources:" in lines:
        lines = lines[:lines.index("Sources:")]
    if sum(1 for l in lines if l.startswith("### ")) == 1:
        lines = [l for l in lines if not l.startswith("### ")]
    return strip_blank(lines)


def fmt_small(x):
    """Three significant digits in fixed notation, for errors that span several decades: 0.000193, 0.0282, 0.143."""
    if x == 0 or x != x:
        return "0" if x == 0 else DASH
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{digits}f}"


def head_dim_filter(kind, sources, opts):
    """The rows of one file, those at head_dim=N when the option is given."""
    rows = one(kind, sources)["rows"]
    if "head_dim" not in opts:
        return rows
    try:
        d = int(opts["head_dim"])
    except ValueError:
        raise Error(f"head_dim={opts['head_dim']} is not a number")
    picked = [r for r in rows if r["head_dim"] == d]
    if not picked:
        raise Error(f"{sources[0][0]} has no rows at head_dim={d}")
    return picked


def fp8_error(sources, opts):
    rows = head_dim_filter("fp8-error", sources, opts)
    body = [[str(r["head_dim"]), r["inputs"], sig3(r["score_std"]), fmt_small(r["rmse_bf16"]), fmt_small(r["rmse_fp8"]),
             fmt_small(r["rmse_fp8_rotated"]), fmt_ratio(r["rmse_fp8"] / r["rmse_fp8_rotated"])] for r in rows]
    return table_lines(["d", "inputs", "std(S)", "bf16", "FP8", "FP8 + rotation", "gain"], body)


def fp8_sweep(sources, opts):
    rows = head_dim_filter("fp8-sweep", sources, opts)
    body = [[str(r["head_dim"]), f"{r['outlier_factor']}×", sig3(r["score_std"]), fmt_small(r["score_rmse_fp8"]),
             fmt_small(r["score_rmse_fp8_rotated"]), fmt_ratio(r["score_rmse_fp8"] / r["score_rmse_fp8_rotated"]),
             fmt_small(r["rmse_bf16"]), fmt_small(r["rmse_fp8"]), fmt_small(r["rmse_fp8_rotated"])]
            for r in sorted(rows, key=lambda r: (r["head_dim"], r["outlier_factor"]))]
    return table_lines(["d", "outliers", "std(S)", "S error, FP8", "S error, FP8 + rotation", "S gain", "O: bf16",
                        "O: FP8", "O: FP8 + rotation"], body)


def fp8_prepass(sources, opts):
    """The FP8 forward beside the pre-pass that makes its inputs from bf16 activations, without and with the Hadamard
    rotation of Q and K (bench_fp8_prepass.sh): the rotation's cost is what it adds to the pre-pass, as a share of the
    forward's time, and as a share of the whole call from bf16 (pre-pass + forward), which is what a caller who asks
    for the rotation pays it against."""
    rows = one("fp8-prepass", sources)["rows"]
    pct = lambda x: f"{100 * x:.1f}%"
    body = []
    for r in sorted(rows, key=lambda r: (r["head_dim"], r["causal"] != "none", r["seq"])):
        if "plain" not in r or "rotated" not in r:
            continue
        fwd, plain, rot = r["plain"]["forward_ms"], r["plain"]["prepass_ms"], r["rotated"]["prepass_ms"]
        body.append([str(r["head_dim"]), yes_no(r["causal"]), str(r["seq"]), fmt_time(fwd), fmt_time(plain),
                     fmt_time(rot), pct((rot - plain) / fwd), pct((rot - plain) / (fwd + plain)), pct(rot / fwd)])
    if not body:
        raise Error(f"{sources[0][0]} has no shape timed both with and without the rotation")
    return table_lines(["d", "causal", "N", "FP8 forward", "pre-pass", "pre-pass + rotation", "rotation / forward",
                        "rotation / whole call", "pre-pass + rotation / forward"], body)


def lazy_rescale(sources, opts):
    """How often the online softmax rescales O (lazy_rescale_study): the share of (row, block) and (16-row warp,
    block) pairs, from the second block on, with the lag of 2^8 and without."""
    rows = one("lazy-rescale", sources)["rows"]
    pct = lambda x: f"{100 * x:.1f}%"
    body = [[str(r["head_dim"]), str(r["block_keys"]), r["inputs"], yes_no(r["causal"]), pct(r["lazy_row_fraction"]),
             pct(r["lazy_warp_fraction"]), pct(r["exact_row_fraction"]), pct(r["exact_warp_fraction"])]
            for r in sorted(rows, key=lambda r: (r["head_dim"], r["drift_log2"], r["causal"]))]
    return table_lines(["d", "Bc", "inputs", "causal", "lazy: rows", "lazy: warps", "exact: rows", "exact: warps"],
                       body)


FA4_RUNGS = [("cuda-fa3-ws-eager-rescale", "6: lazy rescale off"), ("cuda-fa3-ws", "5: ships"),
             ("cuda-fa3-ws-exp2-emulated", "7: 1 in 8 groups' exp2 emulated")]


def fa4_rungs(sources, opts):
    """FlashAttention-4's two softmax ideas as ladder rungs beside the shipped step (bench_fa4_rungs.sh): forward
    TFLOP/s (median of the rounds) and each rung over step 5; with part=timelines, each one's consumer warpgroups'
    softmax and waiting shares from its timeline instead."""
    j = one("fa4-rungs", sources)
    part = opts.get("part", "speed")
    pct = lambda x: f"{100 * x:.1f}%"
    if part == "timelines":
        names = [v for v, _ in FA4_RUNGS]
        body = [[str(t["head_dim"]), dict(FA4_RUNGS)[t["variant"]], pct(t["consumer_softmax_share"]),
                 pct(t["consumer_waiting_share"]), f"{t['forward_ms']:.3f} ms"]
                for t in sorted(j["timelines"], key=lambda t: (t["head_dim"], names.index(t["variant"])))]
        if not body:
            raise Error(f"{sources[0][0]} has no timelines")
        return table_lines(["d", "step", "softmax's share", "waiting's share", "forward (plain build)"], body)
    if part != "speed":
        raise Error(f"part={part} is not speed or timelines")
    by = {(r["variant"], r["head_dim"], r["causal"], r["seq"]): r["forward_tflops_median"] for r in j["rows"]}
    body = []
    for (v, d, c, n), ships in sorted(by.items(), key=lambda kv: kv[0][1:]):
        if v != "cuda-fa3-ws":
            continue
        eager, exp2 = by[(FA4_RUNGS[0][0], d, c, n)], by[(FA4_RUNGS[2][0], d, c, n)]
        body.append([str(d), yes_no(c), str(n), f"{eager:.0f}", f"{ships:.0f}", f"{exp2:.0f}",
                     fmt_ratio(eager / ships), fmt_ratio(exp2 / ships)])
    return table_lines(["d", "causal", "N"] + [name for _, name in FA4_RUNGS] + ["6 / 5", "7 / 5"], body)


def strip_blank(lines):
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


KINDS = {
    "cpu-bench": (cpu_bench, set()),
    "readable-cuda": (readable_cuda, {"seq"}),
    "fa2-vs-sdpa": (fa2_vs_sdpa, {"variant"}),
    "fa3-forward": (fa3_forward, set()),
    "fa3-vs-cudnn": (fa3_vs_cudnn, set()),
    "fp8-forward": (fp8_forward, set()),
    "fp8-prepass": (fp8_prepass, set()),
    "lazy-rescale": (lazy_rescale, set()),
    "fa4-rungs": (fa4_rungs, {"part"}),
    "timeline-blocks": (timeline_blocks, {"keys"}),
    "fa3-ladder": (fa3_ladder, {"head_dim"}),
    "fa3-backward": (fa3_backward, set()),
    "long-sequences": (long_sequences, set()),
    "determinism": (determinism, set()),
    "python-overhead": (python_overhead, set()),
    "torch-overhead": (torch_overhead, set()),
    "torch-calls": (torch_calls, set()),
    "torch-kernel-time": (torch_kernel_time, set()),
    "llama-step": (llama_step, set()),
    "ring-one-gpu": (ring_one_gpu, {"causal"}),
    "ring-gpus": (ring_gpus, set()),
    "fp8-error": (fp8_error, {"head_dim"}),
    "fp8-sweep": (fp8_sweep, {"head_dim"}),
}


# ---------------------------------------------------------------------------------------------------------
# range: a figure for prose, from one column of another kind's table


def parse_number(text):
    """A number as the tables print it: 1.15×, **0.98×**, 2k, 1M, 460 ms, 25%."""
    m = re.search(r"-?\d+(?:\.\d+)?", text.replace("*", ""))
    if not m:
        raise ValueError(text)
    v = float(m.group(0))
    rest = text[m.end():m.end() + 1]
    return v * (1 << 10) if rest == "k" else v * (1 << 20) if rest == "M" else v


def split_row(line):
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def range_of(kind_lines, column, wheres):
    first = []  # the first table's lines
    for l in kind_lines:
        if l.startswith("|"):
            first.append(l)
        elif first:
            break
    if len(first) < 3:
        raise Error("range: the table has no rows")
    header = split_row(first[0])
    names = [h.strip("`") for h in header]

    def col(name):
        for i, h in enumerate(header):
            if name in (h, names[i]):
                return i
        raise Error(f"range: no column {name!r} (columns: {', '.join(header)})")

    ci = col(column)
    conds = []
    for w in wheres:
        m = re.match(r"^(.+?)(>=|<=|!=|=|>|<)(.+)$", w)
        if not m:
            raise Error(f"range: where={w} is not COLUMN OP VALUE (OP one of = != < <= > >=)")
        conds.append((col(m.group(1).strip()), m.group(2), m.group(3).strip()))
    picked = []
    for l in first[2:]:
        cells = split_row(l)
        ok = True
        for i, op, value in conds:
            cell = cells[i].replace("*", "").strip("`")
            try:
                a, b = parse_number(cell), parse_number(value)
            except ValueError:
                a, b = cell, value
                if op not in ("=", "!="):
                    raise Error(f"range: {op} needs numbers, and {value!r} or {cell!r} is not one")
            ok = ok and {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
        if ok:
            text = cells[ci].replace("*", "").strip()
            try:
                picked.append((parse_number(text), text))
            except ValueError:
                continue
    if not picked:
        raise Error(f"range: no row with a number in column {column!r} matches")
    lo, hi = min(picked)[1], max(picked)[1]
    unit = ""
    m = re.search(r"[^\d.]+$", hi)
    if m:
        unit = m.group(0)
        lo, hi = lo[:len(lo) - len(unit)] if lo.endswith(unit) else lo, hi[:-len(unit)]
    return lo + unit if lo == hi else f"{lo}–{hi}{unit}"


# ---------------------------------------------------------------------------------------------------------
# One marker's block


def expand(pattern):
    """{a,b} alternatives, then the glob, relative to bench/results/."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m:
        return [p for alt in m.group(1).split(",")
                for p in expand(pattern[:m.start()] + alt + pattern[m.end():])]
    return glob.glob(os.path.join(RESULTS, pattern))


def load_sources(patterns):
    sources = []
    for pat in patterns:
        found = sorted(set(expand(pat)))
        if not found:
            what = "file" if not re.search(r"[*?\[{]", pat) else "file matching"
            raise Error(f"no {what} bench/results/{pat}")
        for path in found:
            rel = "bench/results/" + os.path.relpath(path, RESULTS).replace(os.sep, "/")
            if any(rel == p for p, _ in sources):
                continue
            try:
                with open(path) as f:
                    sources.append((rel, json.load(f)))
            except (OSError, ValueError) as e:
                raise Error(f"{rel} cannot be read as JSON ({e})")
    return sources


def source_note(sources):
    """*Source: FILE, FILE (device, date).* grouped by device and date, in the order the files came."""
    groups = []
    for path, j in sources:
        # A timeline (Trace Event JSON) keeps its device under otherData and has no date: its file name's.
        other = j.get("otherData", {}) if isinstance(j, dict) else {}
        named = re.search(r"_(\d{4}-\d{2}-\d{2})", path)
        key = (j.get("device") or other.get("device") or "?",
               (j.get("date") or (named.group(1) if named else "?"))[:10])
        for g in groups:
            if g[0] == key:
                g[1].append(path)
                break
        else:
            groups.append((key, [path]))
    parts = [f"{', '.join(paths)} ({device}, {date})" for (device, date), paths in groups]
    return f"*Source{'s' if len(sources) > 1 else ''}: {'; '.join(parts)}.*"


def generate(spec):
    """The block a marker's spec ("KIND ARG...") stands for, as one string without a final newline."""
    try:
        words = shlex.split(spec)
    except ValueError as e:
        raise Error(f"the marker's arguments cannot be split ({e})")
    if not words:
        raise Error("the marker names no KIND")
    kind, args = words[0], words[1:]
    ranged = kind == "range"
    if ranged:
        if not args:
            raise Error("range needs a KIND after it")
        kind, args = args[0], args[1:]
    if kind not in KINDS:
        raise Error(f"unknown KIND {kind!r} (known: {', '.join(sorted(KINDS))}, range)")
    fn, allowed = KINDS[kind]
    files, opts, wheres = [], {}, []
    for a in args:
        if re.match(r"^[A-Za-z_]+=", a):  # an option; a file name or glob never looks like one
            key, value = a.split("=", 1)
            if ranged and key == "where":
                wheres.append(value)
            elif ranged and key == "column":
                opts["column"] = value
            elif key == "source" and value in ("yes", "no"):
                opts["source"] = value
            elif key in allowed:
                opts[key] = value
            else:
                raise Error(f"{kind} takes no option {key}= (it takes: "
                            f"{', '.join(sorted(allowed | {'source'})) or 'none'})")
        else:
            files.append(a)
    if not files:
        raise Error(f"{kind} names no file")
    sources = load_sources(files)
    if ranged and "column" not in opts:
        raise Error("range needs column=NAME")
    try:
        lines = fn(sources, opts)
        if isinstance(lines, tuple):  # (lines, the sources that gave rows)
            lines, sources = lines
        if ranged:
            return range_of(lines, opts["column"], wheres)
    except (KeyError, TypeError, IndexError, ZeroDivisionError) as e:
        raise Error(f"{kind} cannot read {', '.join(p for p, _ in sources)} (missing or odd field {e})")
    if opts.get("source", "yes") == "yes":
        lines = lines + ["", source_note(sources)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Markers in Markdown files

START = re.compile(r"<!--\s*generated:(.*?)-->")
END = "<!-- end generated -->"
FENCE = re.compile(r"^\s{0,3}(```|~~~)")


class Block:
    def __init__(self, path, line, spec, inline, start, end, col0=0, col1=0):
        self.path, self.line, self.spec, self.inline = path, line, spec.strip(), inline
        self.start, self.end, self.col0, self.col1 = start, end, col0, col1  # line indices (and columns, inline)

    @property
    def kind(self):
        w = self.spec.split()
        return " ".join(w[:2]) if w[:1] == ["range"] else (w[0] if w else "?")


def in_code_span(line, pos):
    return line[:pos].count("`") % 2 == 1


def find_blocks(path, lines):
    """Every marker of a file, and the errors (one sentence each) of those that are malformed."""
    blocks, errors = [], []
    fence = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if m:
            fence = None if fence and m.group(1) == fence else (fence or m.group(1))
            i += 1
            continue
        if fence:
            i += 1
            continue
        stripped = line.strip()
        whole = START.fullmatch(stripped)
        if whole:
            j = i + 1
            while j < len(lines) and lines[j].strip() != END and not START.fullmatch(lines[j].strip()):
                j += 1
            if j == len(lines) or lines[j].strip() != END:
                errors.append(f"{path}:{i + 1}: the marker <!-- generated:{whole.group(1)}--> has no "
                              f"{END} after it")
                i = j
                continue
            blocks.append(Block(path, i + 1, whole.group(1), False, i, j))
            i = j + 1
            continue
        pos = 0
        while True:
            m = START.search(line, pos)
            if not m:
                break
            if in_code_span(line, m.start()):
                pos = m.end()
                continue
            e = line.find(END, m.end())
            if e < 0:
                errors.append(f"{path}:{i + 1}: the marker <!-- generated:{m.group(1)}--> has no {END} after it "
                              "on its line (a marker that does not stand alone on its line is closed on the same line)")
                break
            blocks.append(Block(path, i + 1, m.group(1), True, i, i, m.end(), e))
            pos = e + len(END)
        if END in line and not START.search(line) and not in_code_span(line, line.find(END)):
            errors.append(f"{path}:{i + 1}: {END} without a <!-- generated: ... --> marker before it")
        i += 1
    return blocks, errors


def current_lines(block, lines):
    if block.inline:
        return [lines[block.start][block.col0:block.col1]]
    return lines[block.start + 1:block.end]


def default_files():
    found = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + \
            sorted(glob.glob(os.path.join(ROOT, "lessons", "*", "README.md")))
    return [f for f in found if os.path.isfile(f)]


def display(path):
    ap = os.path.abspath(path)
    return os.path.relpath(ap, ROOT) if ap.startswith(ROOT + os.sep) else path


def run_files(paths, write):
    if not paths:
        paths = default_files()
    errors, results = [], []  # results: (path, name, lines, blocks, [generated text per block])
    for p in paths:
        name = display(p)
        try:
            with open(p, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            errors.append(f"{name}: cannot be read ({e.strerror})")
            continue
        lines = text.split("\n")
        blocks, errs = find_blocks(name, lines)
        errors += errs
        made = []
        for b in blocks:
            try:
                out = generate(b.spec)
                if b.inline and "\n" in out:
                    raise Error(f"{b.kind} prints several lines, so its markers must stand alone on their lines")
                made.append(out)
            except Error as e:
                errors.append(f"{name}:{b.line}: {b.kind}: {e}")
                made.append(None)
        results.append((p, name, lines, blocks, made))
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 2
    nblocks = sum(len(r[3]) for r in results)
    nfiles = sum(1 for r in results if r[3])
    if nblocks == 0:
        print("no generated blocks found: " + (", ".join(r[1] for r in results) or "no file") +
              (" holds" if len(results) == 1 else " hold") + " no <!-- generated: KIND ARG... --> marker",
              file=sys.stderr)
        return 1
    stale = 0
    for p, name, lines, blocks, made in results:
        differ = [(b, out) for b, out in zip(blocks, made) if current_lines(b, lines) != out.split("\n")]
        stale += len(differ)
        if not write:
            for b, out in differ:
                diff = list(difflib.unified_diff(current_lines(b, lines), out.split("\n"), f"{name} (as written)",
                                                 "from its sources now", n=1, lineterm=""))
                shown = diff[:24] + ([f"... ({len(diff) - 24} more diff lines)"] if len(diff) > 24 else [])
                print(f"{name}:{b.line}: {b.kind}: the block differs from what its sources give "
                      f"(python3 scripts/readme_tables.py --write {name} regenerates it)")
                print("\n".join("    " + d for d in shown))
            continue
        for b, out in sorted(differ, key=lambda bo: (bo[0].start, bo[0].col0), reverse=True):
            if b.inline:
                lines[b.start] = lines[b.start][:b.col0] + out + lines[b.start][b.col1:]
            else:
                lines[b.start + 1:b.end] = out.split("\n")
        if differ:
            with open(p, "w", encoding="utf-8") as f:
                f.write("\n".join(lines))
    if write:
        print(f"{nblocks} generated blocks in {nfiles} files: {stale} rewritten, {nblocks - stale} already matched")
        return 0
    if stale:
        print(f"{stale} of {nblocks} generated blocks differ from their sources")
        return 1
    print(f"{nblocks} generated blocks in {nfiles} files match their sources")
    return 0


def main(argv):
    if argv[:1] == ["--print"]:
        try:
            print(generate(" ".join(shlex.quote(a) for a in argv[1:])))
        except Error as e:
            print(f"readme_tables.py: {e}", file=sys.stderr)
            return 2
        return 0
    modes = [a for a in argv if a in ("--check", "--write")]
    if len(modes) > 1:
        print("readme_tables.py: give --check or --write, not both", file=sys.stderr)
        return 2
    if modes:
        return run_files([a for a in argv if a != modes[0]], modes[0] == "--write")
    return classic_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
