#!/usr/bin/env python3
"""One training step (forward, backward, AdamW step) of a small Llama from Hugging Face transformers, with its
"sdpa" attention (PyTorch's scaled_dot_product_attention) and with FlashLab's (attn_implementation=flashlab.hf.NAME),
on the same weights and tokens, eager and under torch.compile. Needs a CUDA GPU, PyTorch with CUDA, transformers 5
and FlashLab's module from one build:

    source scripts/python_path.sh build-device
    python3 scripts/llama_step_bench.py --json bench/results/<gpu>-llama-step_<date>.json

The model: Llama with --layers (4) decoder layers, bf16 weights trained by AdamW in bf16, 16 query heads and
--kv-heads (4: grouped-query attention, as Llama 3 has; 16 for multi-head) of head dim d, hidden size 16 d, MLP
3.5 x hidden (Llama 3 8B's ratio, rounded to a multiple of 256), a vocabulary of --vocab (8192, so that the logits
of S = 16384 tokens, S x vocab in bf16 and again in float32 for the loss, stay under 1 GB), batch 1, random tokens
as input and as labels.

For each (S, d): both backends' models side by side, their steps taken in turn (one of each per round, so a drift of
the machine's speed falls on both alike); the median wall time of --iters rounds after --warmup, each step between
two torch.cuda.synchronize() calls (time.perf_counter), and sdpa_over_flashlab = SDPA's / FlashLab's (> 1: FlashLab
faster). The two steps of a round run in either order, swapped every round; paired_sdpa_over_flashlab is the median
over the rounds of SDPA's step over FlashLab's in the same round, with its quartiles
(paired_sdpa_over_flashlab_quartiles), which say how far one round moves it. Where the step is mostly the host's time
(small S), the machine's speed moves both backends' medians from one run to the next; the paired ratio moves less.
Compiled runs wrap the model in torch.compile (default mode) and reset dynamo first, so that each compiles for its
own shapes; the warmup steps include the compilation.

What each backend computes, as transformers' source has it (masking_utils; not measured here):
  * eager: transformers builds no mask (causal, nothing padded); SDPA runs with is_causal=True, FlashLab too;
  * compiled: transformers' own builder makes the causal mask a boolean tensor while dynamo traces the model (it does
    not look at data there), so SDPA runs with that mask; FlashLab's builder compares that mask with the causal
    pattern outside the graph (one graph break per forward pass) and, finding it, returns None, so every layer's
    operator is traced into the graph with is_causal=True.
Each row records what FlashLab did in its model's first step (eager: its attention calls; compiled: the graph breaks
dynamo took, with their reasons, beside SDPA's model's), the variant variant="auto" picks (flashlab.explain), and
every FlashLabFallbackWarning of its run, so a row where FlashLab did not compute the attention says so. The first
step's loss is kept for both backends: the same model on the same tokens, it agrees to bf16 rounding.
"""
import argparse
import copy
import datetime
import gc
import json
import statistics
import sys
import time
import warnings

import torch
import torch._dynamo
import torch._dynamo.utils
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig

import flashlab
import flashlab.hf as hf
import flashlab.torch as ft

HEADS = 16


def llama_config(args, head_dim):
    hidden = HEADS * head_dim
    return LlamaConfig(vocab_size=args.vocab, hidden_size=hidden, intermediate_size=round(3.5 * hidden / 256) * 256,
                       num_hidden_layers=args.layers, num_attention_heads=HEADS, num_key_value_heads=args.kv_heads,
                       head_dim=head_dim, max_position_embeddings=max(max(args.seqs), 2048), use_cache=False)


def initial_weights(config):
    """bf16 weights on the host, the same for both backends, every S and both modes (seed 0)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return {name: value.detach().to(torch.bfloat16).clone() for name, value in model.state_dict().items()}


class FlashLabCalls:
    """Counts the attention calls FlashLab makes (flashlab.torch._attend, where flashlab.hf's calls go through)."""

    def __init__(self):
        self.count, self._original = 0, None

    def __enter__(self):
        self._original = ft._attend

        def counting(*args, **kwargs):
            self.count += 1
            return self._original(*args, **kwargs)

        ft._attend = counting
        return self

    def __exit__(self, *exc):
        ft._attend = self._original


def first_step(step, compiled):
    """Runs a model's first step (the compilation, when compiled) and says what FlashLab did in it: eager, the
    attention calls it made; compiled, the graph breaks dynamo took (each with its reason) while compiling it."""
    if compiled:
        torch._dynamo.utils.counters.clear()
        step()
        breaks = dict(torch._dynamo.utils.counters["graph_break"])
        return {"graph_breaks": sum(breaks.values()), "graph_break_reasons": sorted(breaks)}
    with FlashLabCalls() as calls:
        step()
    return {"calls_per_step": calls.count}


def make_step(attn_implementation, config, weights, tokens, compiled):
    """One training step of a fresh model on the weights, and the list its losses go into. The model gets a config of
    its own: from_config writes the attention implementation into the config it is given, and a model reads it from
    there on every call, so two models sharing one config would both run the last one named."""
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=attn_implementation)
    model.load_state_dict(weights)
    model = model.to(device="cuda", dtype=torch.bfloat16).train()
    forward = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = forward(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())

    return step, losses


def time_in_turn(steps, args):
    """({name: (median step ms, peak GiB)}, [per-round ratios of the first name's step time to the second's]) of the
    steps taken in turn, one of each per round, the order swapped from round to round (so that a drift of the
    machine's speed, or what one step leaves the next, falls on both alike), --iters rounds after --warmup; each step
    between two synchronizations. The peak is the allocator's during that backend's first timed step."""
    for _ in range(args.warmup):
        for step in steps.values():
            step()
    torch.cuda.synchronize()
    names = list(steps)
    times, peaks = {name: [] for name in names}, {}
    for round_ in range(args.iters):
        for name in names if round_ % 2 == 0 else names[::-1]:
            if round_ == 0:
                torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
            start = time.perf_counter()
            steps[name]()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) * 1e3)
            if round_ == 0:
                peaks[name] = torch.cuda.max_memory_allocated() / 2**30
    ratios = [a / b for a, b in zip(times[names[0]], times[names[1]])]
    return {name: (statistics.median(times[name]), peaks[name]) for name in names}, ratios


def release_memory():
    """Drops what the last run left: dynamo's compiled code (which holds its model) and the allocator's cache."""
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def auto_variant(args, seq, head_dim):
    """The variant FlashLab's variant="auto" runs this model's attention with (flashlab.explain)."""
    q = torch.empty(1, HEADS, seq, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.empty(1, args.kv_heads, seq, head_dim, dtype=torch.bfloat16, device="cuda")
    return flashlab.explain(q, k, k, is_causal=True, backward=True, layout="bhsd").choice


def measure(args, seq, head_dim, compiled, weights):
    config = llama_config(args, head_dim)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (1, seq), generator=generator).to("cuda")

    hf._warned_reasons.clear()  # this row reports its own fallbacks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", hf.FlashLabFallbackWarning)
        sdpa_step, sdpa_losses = make_step("sdpa", config, weights, tokens, compiled)
        lab_step, lab_losses = make_step(hf.NAME, config, weights, tokens, compiled)
        sdpa_first, lab_first = first_step(sdpa_step, compiled), first_step(lab_step, compiled)
        timed, ratios = time_in_turn({"sdpa": sdpa_step, "flashlab": lab_step}, args)
    (sdpa_ms, sdpa_gib), (lab_ms, lab_gib) = timed["sdpa"], timed["flashlab"]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    sdpa_loss, lab_loss = sdpa_losses[0].item(), lab_losses[0].item()
    del sdpa_step, lab_step, sdpa_losses, lab_losses
    release_memory()
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, hf.FlashLabFallbackWarning)]
    for message in fallbacks:
        print(f"warning: {message}", file=sys.stderr)
    return {
        "seq": seq, "head_dim": head_dim, "hidden": HEADS * head_dim, "heads": HEADS, "kv_heads": args.kv_heads,
        "layers": args.layers, "vocab": args.vocab, "batch": 1, "compiled": compiled,
        "sdpa": {"step_ms": round(sdpa_ms, 3), "peak_gib": round(sdpa_gib, 2), "first_loss": sdpa_loss,
                 **sdpa_first},
        "flashlab": {"step_ms": round(lab_ms, 3), "peak_gib": round(lab_gib, 2), "first_loss": lab_loss,
                     **lab_first, "variant": auto_variant(args, seq, head_dim), "fallbacks": fallbacks},
        "sdpa_over_flashlab": round(sdpa_ms / lab_ms, 3),
        "paired_sdpa_over_flashlab": round(quartiles[1], 3),
        "paired_sdpa_over_flashlab_quartiles": [round(quartiles[0], 3), round(quartiles[2], 3)],
    }


def table(rows):
    lines = [f"{'S':>6} {'d':>4} {'mode':>8} {'SDPA ms':>9} {'FlashLab ms':>12} {'SDPA/FL':>8} {'paired [quartiles]':>22}"
             "  FlashLab's first step"]
    for r in rows:
        lab = r["flashlab"]
        first = (f"{lab['graph_breaks']} graph breaks (SDPA's: {r['sdpa']['graph_breaks']})" if r["compiled"]
                 else f"{lab['calls_per_step']} FlashLab calls")
        lines.append(f"{r['seq']:>6} {r['head_dim']:>4} {'compiled' if r['compiled'] else 'eager':>8} "
                     f"{r['sdpa']['step_ms']:>9.2f} {lab['step_ms']:>12.2f} {r['sdpa_over_flashlab']:>8.3f} "
                     f"{r['paired_sdpa_over_flashlab']:>6.3f} [{r['paired_sdpa_over_flashlab_quartiles'][0]:.3f}, "
                     f"{r['paired_sdpa_over_flashlab_quartiles'][1]:.3f}]  {first}"
                     + ("  (fell back to SDPA)" if lab['fallbacks'] else ""))
    return "\n".join(lines)


def positive_ints(text):
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=positive_ints, default=[2048, 4096, 16384], help="sequence lengths S")
    parser.add_argument("--head-dims", type=positive_ints, default=[64, 128], help="head dims d (hidden = 16 d)")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--compile", dest="modes", action="store_const", const=(True,),
                       help="only the torch.compile pair (default: eager, then compiled)")
    modes.add_argument("--no-compile", dest="modes", action="store_const", const=(False,),
                       help="only the eager pair")
    parser.add_argument("--iters", type=int, default=10, help="timed steps per run (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation included)")
    parser.add_argument("--kv-heads", type=int, default=4, choices=(1, 2, 4, 8, 16),
                        help="KV heads for the 16 query heads (16: multi-head attention)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.iters < 1 or args.warmup < 1:
        parser.error("--iters and --warmup must be at least 1 (the first step of a run compiles or warms caches)")
    if not torch.cuda.is_available():
        raise SystemExit("llama_step_bench needs a CUDA GPU, and this PyTorch sees none")
    hf.register()

    weights = {d: initial_weights(llama_config(args, d)) for d in args.head_dims}
    result = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["scripts/llama_step_bench.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": {"sdpa": "sdpa", "flashlab": hf.NAME},
        "setting": (f"one training step (forward, backward, AdamW) of a {args.layers}-layer Llama in bf16, {HEADS} "
                    f"query heads and {args.kv_heads} KV heads, hidden 16 d, vocabulary {args.vocab}, batch 1; "
                    f"median of {args.iters} steps after {args.warmup}, synchronized around each step, the two backends' "
                    "steps in turn, order swapped every round; compiled: "
                    "torch.compile(model), default mode"),
        "rows": [],
    }
    rows = result["rows"]
    print(table([]), flush=True)
    for compiled in args.modes or (False, True):
        for head_dim in args.head_dims:
            for seq in args.seqs:
                rows.append(measure(args, seq, head_dim, compiled, weights[head_dim]))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
                if args.json:  # after every row, so a run stopped by a time limit keeps the rows it finished
                    with open(args.json, "w") as out:
                        out.write(json.dumps(result, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
