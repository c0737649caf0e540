#!/usr/bin/env python3
"""What a flashlab.torch call costs the host, beside torch.nn.functional.scaled_dot_product_attention's, in one run.
Needs a CUDA GPU, PyTorch with CUDA, and FlashLab's module built for this Python (with its PyTorch operators):

    source scripts/python_path.sh build-device
    python3 scripts/torch_overhead.py --json torch_overhead.json

Per sequence length N (by default the FA2 paper's setting: B * N = 16384 tokens, H * d = 2048; --batch, --heads and
--kv-heads set another, e.g. a Llama's grouped-query attention: --batch 1 --heads 16 --kv-heads 4; bf16, causal), two
passes:
  forward            y = attention(q, k, v) under torch.no_grad()
  forward_backward   y = attention(q, k, v); y.backward(dy), q, k, v requiring grad
and for each, for FlashLab (flashlab.torch.scaled_dot_product_attention, variant "auto") and for PyTorch's SDPA:

  host_us   the host time of one call: calls queued --layers at a time behind a sleep kernel (torch.cuda._sleep),
            so the GPU is busy and no launch waits for it, timed per round and divided by --layers; the median over
            --rounds rounds. What the call costs the host, the launches included, and none of the kernels' own time.
            forward: --layers calls in a row. forward_backward: a stack of --layers attention layers, as a model is
            (each layer's query is the previous layer's output, its own K and V leaves), and one backward() over
            the stack: so the autograd engine's hand-over to its device thread, which swings by tens of µs from one
            backward() to the next, is paid once per round, and each layer's share is its operator's forward, its
            autograd node and its backward. In each round FlashLab's calls, its operator's alone and SDPA's are taken
            in turn (the order rotated from round to round), so that a drift of the machine falls on all three alike.
  backend   (SDPA's) which of its backends ran the pass: cudnn, flash, efficient or math, read from the names of the
            kernels it launched (kernels, from torch.profiler)
  gpu_ms    the GPU time of one pass: the pass captured once in a CUDA graph, then CUDA events around --iters
            replays of it. Where a pass's launches take the host longer than its kernels take the GPU (small
            problems with backward), back-to-back calls would time the host instead; replays do not.

first_call_host_us and later_calls_host_us (the forward's) split each round's first call, made right after the host
waited for the previous round's kernels, from the calls after it, for the three kinds of call alike.

host_us_over_sdpa is what replacing SDPA adds to each call: the median over the rounds of FlashLab's time minus SDPA's
in the same round, with the quartiles of those differences (host_us_over_sdpa_quartiles) to say how far one round
can move it. operator_alone_host_us calls torch.ops.flashlab.attention itself, without flashlab.torch's Python checks
in front of it.
"""
import argparse
import datetime
import gc
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flashlab.torch as ft
from gpu_timing import gpu_ms  # (scripts/, beside this one)
from python_overhead import HIDDEN, TOKENS  # the same setting


# The sleep kernel a round's calls queue behind: about 20 ms of GPU cycles, longer than any round's launches here.
SLEEP_CYCLES = 40_000_000


def host_us_in_turn(rounds_of, rounds, layers, warmup=5):
    """The host time of one attention call in each of `rounds_of` ({name: round}, a round making `layers` calls), in µs
    per call, one figure per round: each round is queued behind a sleep kernel, so that the GPU is busy and no launch
    waits for it, and timed on the host. The rounds of each name are taken in turn, their order rotated from round to
    round, so that a drift of the machine's speed falls on all alike and two names can be compared round by round;
    Python's garbage collector runs between rounds only. A round may stamp the time after each of its calls (the
    forward's do), which splits its first call from the later ones. Returns ({name: [µs per call, a round each]},
    {name: [µs of the first call, a round each]}, {name: [µs per later call, a round each]}); the last two are empty
    for rounds that stamp nothing."""
    names = list(rounds_of)
    for name in names:
        for _ in range(warmup):
            rounds_of[name]([])
    torch.cuda.synchronize()
    times, first, later = ({name: [] for name in names} for _ in range(3))
    collecting = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                torch.cuda._sleep(SLEEP_CYCLES)
                stamps = [time.perf_counter()]
                rounds_of[name](stamps)
                end = time.perf_counter()
                times[name].append((end - stamps[0]) * 1e6 / layers)
                if len(stamps) == layers + 1 and layers > 1:
                    first[name].append((stamps[1] - stamps[0]) * 1e6)
                    later[name].append((stamps[-1] - stamps[1]) * 1e6 / (layers - 1))
                torch.cuda.synchronize()
            gc.collect()
    finally:
        if collecting:
            gc.enable()
    return times, first, later


def paired_difference(mine, theirs):
    """The median of the round-by-round differences mine - theirs, and their quartiles (µs)."""
    differences = [a - b for a, b in zip(mine, theirs)]
    q1, median, q3 = statistics.quantiles(differences, n=4)
    return median, [round(q1, 1), round(q3, 1)]


def kernels_of(call):
    """The CUDA kernels one call() launches (torch.profiler), each name once, in order of first launch, cut to 100
    characters."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        call()
        torch.cuda.synchronize()
    names = []
    for event in profile.events():
        name = event.name[:100]
        if event.device_type == torch.autograd.DeviceType.CUDA and name not in names:
            names.append(name)
    return names


def backend_of(kernels):
    """Which of SDPA's backends launched these kernels, read from their names."""
    text = " ".join(kernels).lower()
    for backend, marks in (("cudnn", ("cudnn",)), ("flash", ("flash",)), ("efficient", ("fmha", "efficient"))):
        if any(mark in text for mark in marks):
            return backend
    return "math"


def host_rounds(attend, q, k, v, dy, layers):
    """One round of host timing per pass, given a list to stamp the time into: forward, `layers` calls under no_grad,
    each stamped when it returns; forward_backward, a stack of `layers` attention layers (layer l's query is layer
    l - 1's output; its K and V are leaves of its own, as a model's projections are) and one backward() over it,
    unstamped (a layer's backward runs later, on the autograd engine's thread)."""
    def forward(stamps):
        with torch.no_grad():
            for _ in range(layers):
                attend(q, k, v)
                stamps.append(time.perf_counter())

    query = q.detach().requires_grad_()
    kv = [[x.detach().clone().requires_grad_() for x in (k, v)] for _ in range(layers)]

    def forward_backward(stamps):
        x = query
        for layer_k, layer_v in kv:
            x = attend(x, layer_k, layer_v)
        x.backward(dy)

    return {"forward": forward, "forward_backward": forward_backward}


def passes(attend, q, k, v, dy):
    def forward():
        with torch.no_grad():
            attend(q, k, v)

    leaves = [x.detach().requires_grad_() for x in (q, k, v)]

    def forward_backward():
        attend(*leaves).backward(dy)

    return {"forward": forward, "forward_backward": forward_backward}


def measure(args, seq):
    batch = args.batch or TOKENS // seq
    heads = args.heads or HIDDEN // args.head_dim
    kv_heads = args.kv_heads or heads
    gqa = kv_heads != heads
    torch.manual_seed(0)
    # (B, H, N, d) views of (B, N, H, d) memory, as a transformer's projections make them.
    q, dy = (torch.randn(batch, seq, heads, args.head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
             for _ in range(2))
    k, v = (torch.randn(batch, seq, kv_heads, args.head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            for _ in range(2))
    variant = ft._auto(*ft._problem_key(q, k, v, True, 0.0, True, False))[0]
    attends = {"flashlab": lambda *x: ft.scaled_dot_product_attention(*x, is_causal=True, enable_gqa=gqa),
               "operator": lambda *x: torch.ops.flashlab.attention(*x, variant, True, False, None, 0.0, 0, False),
               "sdpa": lambda *x: F.scaled_dot_product_attention(*x, is_causal=True, enable_gqa=gqa)}
    ours, theirs = passes(attends["flashlab"], q, k, v, dy), passes(attends["sdpa"], q, k, v, dy)
    row = {"seq": seq, "batch": batch, "heads": heads, "kv_heads": kv_heads, "head_dim": args.head_dim,
           "dtype": "bf16", "causal": True, "variant": variant}
    rounds_of = {who: host_rounds(attend, q, k, v, dy, args.layers) for who, attend in attends.items()}
    for name in ("forward", "forward_backward"):
        host, first, later = host_us_in_turn({who: rounds_of[who][name] for who in attends}, args.rounds,
                                             args.layers)
        difference, quartiles = paired_difference(host["flashlab"], host["sdpa"])
        sdpa_kernels = kernels_of(theirs[name])
        row[name] = {"flashlab": {"host_us": round(statistics.median(host["flashlab"]), 1),
                                  "gpu_ms": gpu_ms(ours[name], args.iters),
                                  "operator_alone_host_us": round(statistics.median(host["operator"]), 1)},
                     "sdpa": {"host_us": round(statistics.median(host["sdpa"]), 1),
                              "gpu_ms": gpu_ms(theirs[name], args.iters),
                              "backend": backend_of(sdpa_kernels), "kernels": sdpa_kernels},
                     "host_us_over_sdpa": round(difference, 1), "host_us_over_sdpa_quartiles": quartiles}
        if first["flashlab"]:
            # Where the time goes inside a round: its first call, right after the host waited for the last round's
            # kernels, against the calls after it.
            row[name]["first_call_host_us"] = {who: round(statistics.median(first[who]), 1) for who in attends}
            row[name]["later_calls_host_us"] = {who: round(statistics.median(later[who]), 1) for who in attends}
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", default="1024,16384")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=0, help="batch B (default: 16384 tokens / N)")
    parser.add_argument("--heads", type=int, default=0, help="query heads H (default: 2048 / d)")
    parser.add_argument("--kv-heads", type=int, default=0, help="K/V heads (default: --heads; fewer: grouped-query)")
    parser.add_argument("--iters", type=int, default=200, help="CUDA graph replays timed for gpu_ms")
    parser.add_argument("--rounds", type=int, default=100, help="rounds of host timing (each: --layers calls)")
    parser.add_argument("--layers", type=int, default=10, help="attention calls per round of host timing")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if not ft.OPERATORS:
        raise SystemExit("flashlab.torch has no PyTorch operators in this build: measure a build made for this Python")

    rows = [measure(args, int(n)) for n in args.seqs.split(",")]
    result = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["scripts/torch_overhead.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "setting": (f"bf16, causal; B * N = {TOKENS} tokens, H * d = {HIDDEN}" if not (args.batch or args.heads)
                    else f"bf16, causal; B = {rows[0]['batch']}, {rows[0]['heads']} query heads, "
                         f"{rows[0]['kv_heads']} K/V heads")
                   + f"; host: medians of {args.rounds} rounds of {args.layers} calls (forward + backward: a stack "
                     f"of {args.layers} layers, one backward()); GPU: {args.iters} CUDA graph replays",
        "rows": rows,
    }
    text = json.dumps(result, indent=1)
    print(text)
    for r in rows:
        for name in ("forward", "forward_backward"):
            p = r[name]
            print(f"N={r['seq']:>6} d={r['head_dim']} H={r['heads']}/{r['kv_heads']} {name:<17} host: flashlab "
                  f"{p['flashlab']['host_us']:7.1f} us (operator {p['flashlab']['operator_alone_host_us']:7.1f}) sdpa "
                  f"{p['sdpa']['host_us']:7.1f} us ({p['sdpa']['backend']}), difference {p['host_us_over_sdpa']:+7.1f} us; GPU: flashlab "
                  f"{p['flashlab']['gpu_ms']:.3f} ms sdpa {p['sdpa']['gpu_ms']:.3f} ms")
            if "first_call_host_us" in p:
                print(" " * 44 + "first call / later calls: " + ", ".join(
                    f"{who} {p['first_call_host_us'][who]:.1f} / {p['later_calls_host_us'][who]:.1f} us"
                    for who in p["first_call_host_us"]))
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
