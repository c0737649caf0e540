"""flashlab.verify's PyTorch side: the engine's cases handed to a function of torch tensors on a device, its
gradients taken by autograd where asked, and the bench that times it beside FlashLab's CUDA variants and PyTorch's
own scaled_dot_product_attention.

flashlab.verify imports this module only when it is given a device (after checking that PyTorch imports and the
device exists), so `import flashlab` never needs PyTorch. The engine itself (module.cpp's verify) works on float64
(B, S, H, D) NumPy arrays; TorchCalls turns them into the tensors fn takes and its results back.
"""
import contextlib
import datetime
import math
import statistics
import warnings

import numpy as np
import torch
import torch.nn.functional as F

import flashlab
from . import _options_of

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

NOT_DIFFERENTIABLE = ("backward='autograd' differentiates fn's O, but fn returned an O that does not require grad "
                      "(a kernel autograd cannot see through, such as a Triton kernel without a backward): verify it "
                      "with backward=None, or give fn a torch.autograd.Function with a backward")


class TorchCalls:
    """The engine's forward and backward around fn (and its backward) on torch tensors.

    Inputs are made on `device` in the case's dtype from the values the engine drew, which it has rounded to that
    dtype already, so the tensors hold exactly those values; in `layout` ("bshd" or "bhsd"), contiguous. Outputs go
    back to the engine as float64 (B, S, H, D) arrays, the LSE as (B, H_q, S_q).

    With backward="autograd" the forward runs fn on inputs that require grad and keeps its O; the backward that
    follows for the same case is torch.autograd.grad(O, (q, k, v), dO) with the engine's dO. `not_differentiable`
    holds the sentence when fn's O carried no autograd history."""

    def __init__(self, fn, backward, layout, device):
        self.fn, self.user_backward, self.layout, self.device = fn, backward, layout, device
        self.autograd = backward == "autograd"
        self.graph = None  # (leaves, O) of the case just run forward, for autograd
        self.not_differentiable = None

    def to_user(self, x, dtype):
        t = torch.from_numpy(x).to(device=self.device, dtype=TORCH_DTYPES[dtype])
        return t.transpose(1, 2).contiguous() if self.layout == "bhsd" else t

    def from_user(self, x, what):
        if isinstance(x, torch.Tensor):
            x = x.detach().to(device="cpu", dtype=torch.float64).numpy()
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 4:
            raise ValueError(f"{what} must have 4 dimensions, got shape {x.shape}")
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3)) if self.layout == "bhsd" else x

    @staticmethod
    def lse_from_user(x):
        if isinstance(x, torch.Tensor):
            x = x.detach().to(device="cpu", dtype=torch.float64).numpy()
        return np.asarray(x, dtype=np.float64)

    def forward(self, q, k, v, dtype, causal, scale):
        self.graph = None
        inputs = [self.to_user(x, dtype) for x in (q, k, v)]
        options = _options_of(causal, scale)
        if self.autograd:
            inputs = [x.requires_grad_() for x in inputs]
            with torch.enable_grad():
                result = self.fn(*inputs, **options)
        else:
            result = self.fn(*inputs, **options)
        out, lse = result if isinstance(result, (tuple, list)) else (result, None)
        if self.autograd:
            self.graph = (inputs, out)
        return self.from_user(out, "O"), None if lse is None else self.lse_from_user(lse)

    def backward(self, q, k, v, out, lse, grad_out, dtype, causal, scale):
        if self.autograd:
            grads = self.autograd_grads(grad_out, dtype)
        else:
            lse_t = torch.from_numpy(lse).to(device=self.device, dtype=torch.float32)
            grads = self.user_backward(*(self.to_user(x, dtype) for x in (q, k, v, out)), lse_t,
                                       self.to_user(grad_out, dtype), **_options_of(causal, scale))
        if not isinstance(grads, (tuple, list)) or len(grads) != 3:
            raise ValueError(f"the backward must return (dq, dk, dv), got {type(grads).__name__}")
        return tuple(self.from_user(g, name) for g, name in zip(grads, ("dq", "dk", "dv")))

    def autograd_grads(self, grad_out, dtype):
        (leaves, out), self.graph = self.graph, None
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            self.not_differentiable = NOT_DIFFERENTIABLE
            raise ValueError(NOT_DIFFERENTIABLE)
        d_o = self.to_user(grad_out, dtype).to(out.dtype)
        grads = torch.autograd.grad(out, leaves, grad_outputs=d_o, allow_unused=True)
        # An input fn's O does not depend on has a zero gradient (autograd says None).
        return [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads)]


def autograd_notes(report):
    """With backward='autograd' the gradients are fn's own forward differentiated: where O is wrong they are wrong
    too. The sentence that says how many failing cases that explains (none when no case fails in O)."""
    failing = [c for c in report["cases"] if not c["passes"]]
    fails = lambda c, names: any(o["name"] in names and not o["passes"] for o in c["outputs"])
    o_fails = [c for c in failing if fails(c, ("O",))]
    if not o_fails:
        return []
    grads_only = [c for c in failing if not fails(c, ("O",)) and fails(c, ("dQ", "dK", "dV"))]
    return [f"autograd: {len(o_fails)} of the {len(failing)} failing cases fail in O, and their dQ, dK, dV are "
            "autograd's gradients of that wrong O, so fix the forward first; "
            f"{len(grads_only)} fail in the gradients alone."]


# --- The bench ------------------------------------------------------------------------------------------------

# The FlashAttention-2 paper's setting, as scripts/bench_vs_sdpa.sh runs it: B * N tokens, H * d hidden.
BENCH_TOKENS, BENCH_HIDDEN = 16384, 2048
BENCH_SEQS = (1024, 4096, 16384)
BENCH_VARIANTS = ("cuda-fa2", "cuda-fa3-ws")
SDPA_BACKENDS = (("sdpa-flash", "FLASH_ATTENTION"), ("sdpa-cudnn", "CUDNN_ATTENTION"))
WARMUP, RUNS = 3, 10
# core/flops.hpp: the backward is 2.5x the forward's FLOPs, so forward + backward is 3.5x.
BACKWARD_FLOPS_PER_FORWARD = 2.5


def forward_flops(batch, heads, seq, head_dim, causal):
    """FlashAttention's count (core/flops.hpp): 4 B H N^2 d, halved when causal."""
    full = 4.0 * batch * heads * seq * seq * head_dim
    return full / 2 if causal else full


def median_ms(call):
    """The median over RUNS calls, after WARMUP, of the time between two CUDA events around each call. A call's
    host-side work before its kernels counts (calls that queue their kernels on the current stream, PyTorch's and
    FlashLab's operators, are waited for by the stop event; FlashLab's other variants return when their kernels end)."""
    for _ in range(WARMUP):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(RUNS):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


class Candidate:
    """One column of the bench: a forward and (or None) a forward+backward on one shape's inputs, or the sentence
    why it does not run there; `context` is entered around its timing (an SDPA backend)."""

    def __init__(self, label, forward=None, both=None, why_not=None, why_not_both=None, context=None):
        self.label, self.forward, self.both = label, forward, both
        self.why_not, self.why_not_both = why_not, why_not_both
        self.context = context or contextlib.nullcontext


def _first(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def _fn_candidate(label, fn, backward, layout, inputs, causal, head_dim, timed_backward):
    q, k, v, d_o = (x if layout == "bshd" else x.transpose(1, 2).contiguous() for x in inputs)
    options = dict(is_causal=causal, causal_align="top-left", scale=1 / math.sqrt(head_dim))
    forward = lambda: fn(q, k, v, **options)
    both = None
    if timed_backward and backward == "autograd":
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        both = lambda: torch.autograd.grad(_first(fn(*leaves, **options)), leaves, d_o)
    elif timed_backward:
        def both():
            result = fn(q, k, v, **options)
            if not isinstance(result, (tuple, list)):
                raise ValueError("fn returns no LSE, which its backward takes")
            return backward(q, k, v, result[0], result[1], d_o, **options)
    return Candidate(label, forward, both)


def _flashlab_candidate(variant, inputs, causal, dtype, head_dim, timed_backward):
    import flashlab.torch as ft  # PyTorch is here: flashlab.torch imports
    row = next((r for r in flashlab.variants() if r["name"] == variant), None)
    why = None
    if row is None:
        why = "not in this build's variant table"
    elif not row["available"]:
        needs = row["needs_compute_capability"]
        why = f"needs compute capability {needs / 10:.1f}" if needs else "cannot run here (no CUDA device)"
    elif dtype not in row["dtypes"]:
        why = f"computes in {', '.join(row['dtypes'])}"
    elif head_dim not in row["head_dim_values"]:
        why = f"runs head dims {row['head_dims']}"
    if why:
        return Candidate(variant, why_not=why)
    q, k, v, d_o = (x.transpose(1, 2) for x in inputs)  # (B, H, S, D) views of (B, S, H, D) memory: read in place
    forward = lambda: ft.scaled_dot_product_attention(q, k, v, is_causal=causal, variant=variant)
    both, why_not_both = None, None
    if timed_backward:
        if row["backward"] and head_dim in row["backward_head_dim_values"]:
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            both = lambda: torch.autograd.grad(
                ft.scaled_dot_product_attention(*leaves, is_causal=causal, variant=variant), leaves, d_o)
        else:
            why_not_both = f"its backward runs head dims {row['backward_head_dims'] or 'none'}"
    return Candidate(variant, forward, both, why_not_both=why_not_both)


def _sdpa_candidates(inputs, causal, timed_backward):
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return [Candidate(label, why_not="this PyTorch has no torch.nn.attention.sdpa_kernel")
                for label, _ in SDPA_BACKENDS]
    q, k, v, d_o = (x.transpose(1, 2) for x in inputs)
    forward = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    both = None
    if timed_backward:
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        both = lambda: torch.autograd.grad(F.scaled_dot_product_attention(*leaves, is_causal=causal), leaves, d_o)
    candidates = []
    for label, backend in SDPA_BACKENDS:
        if not hasattr(SDPBackend, backend):
            candidates.append(Candidate(label, why_not=f"this PyTorch has no SDPBackend.{backend}"))
        else:
            chosen = getattr(SDPBackend, backend)
            candidates.append(Candidate(label, forward, both, context=lambda chosen=chosen: sdpa_kernel(chosen)))
    return candidates


def _timed(candidate, call):
    """(median ms, None), or (None, the first line of what the call raised)."""
    try:
        with candidate.context(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SDPA warns before it says it has no kernel for the shape
            return median_ms(call), None
    except Exception as error:  # noqa: BLE001 (any failure of a candidate is its cell's note, not the bench's end)
        torch.cuda.empty_cache()  # after an out-of-memory error, the next candidate starts clean
        return None, (str(error).strip().splitlines() or [type(error).__name__])[0][:160]


def passed_pairs(report):
    """The (dtype, head dim) pairs in bf16 and f16 that ran some case and passed every one."""
    passed = {}
    for case in report["cases"]:
        key = (case["dtype"], case["head_dim"])
        passed[key] = passed.get(key, True) and case["passes"]
    order = {"bf16": 0, "f16": 1}
    return sorted((key for key, ok in passed.items() if ok and key[0] in order), key=lambda p: (order[p[0]], p[1]))


def bench(fn, backward, layout, device, report, name):
    """fn timed beside FlashLab's CUDA variants and PyTorch's SDPA backends on the FlashAttention-2 paper's shapes,
    for the bf16 / f16 pairs fn passed in `report`. Returns a dict: settings, rows (one per candidate and shape),
    notes (why a cell is empty) and text (the table)."""
    pairs = passed_pairs(report)
    timed_backward = backward is not None
    settings = {
        "device": torch.cuda.get_device_name(device),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch.__version__, "tokens": BENCH_TOKENS, "hidden": BENCH_HIDDEN, "seqs": list(BENCH_SEQS),
        "warmup": WARMUP, "runs": RUNS, "causal_align": "top-left", "forward_backward": timed_backward,
        "pairs": [list(p) for p in pairs],
        "flops": "forward 4 B H N^2 d, halved when causal; forward+backward 3.5x the forward (backward 2.5x)",
    }
    rows, notes = [], {}  # notes: "label: why" -> None, in the order met
    labels = [name, *BENCH_VARIANTS, *(label for label, _ in SDPA_BACKENDS)]
    generator = torch.Generator(device=device)
    generator.manual_seed(0)
    with torch.cuda.device(device):
        for dtype, head_dim in pairs:
            if BENCH_HIDDEN % head_dim:
                notes[f"d={head_dim}: H * d = {BENCH_HIDDEN} needs a head dim that divides it"] = None
                continue
            heads = BENCH_HIDDEN // head_dim
            for causal in (False, True):
                for seq in BENCH_SEQS:
                    batch = BENCH_TOKENS // seq
                    inputs = [torch.randn(batch, seq, heads, head_dim, device=device, dtype=TORCH_DTYPES[dtype],
                                          generator=generator) for _ in range(4)]  # q, k, v, dO in (B, S, H, D)
                    candidates = [_fn_candidate(name, fn, backward, layout, inputs, causal, head_dim, timed_backward),
                                  *(_flashlab_candidate(v, inputs, causal, dtype, head_dim, timed_backward)
                                    for v in BENCH_VARIANTS),
                                  *_sdpa_candidates(inputs, causal, timed_backward)]
                    flops = forward_flops(batch, heads, seq, head_dim, causal)
                    for c in candidates:
                        rows.append(_measure(c, flops, notes, dict(candidate=c.label, dtype=dtype, head_dim=head_dim,
                                                                   causal=causal, seq=seq, batch=batch, heads=heads)))
                    del inputs, candidates
    result = {"settings": settings, "rows": rows, "notes": list(notes)}
    result["text"] = bench_text(result, labels)
    return result


def _measure(candidate, flops, notes, row):
    row.update(forward_ms=None, forward_tflops=None, forward_backward_ms=None, forward_backward_tflops=None,
               note=candidate.why_not)
    if candidate.why_not:
        notes[f"{candidate.label}: {candidate.why_not}"] = None
        return row
    with torch.no_grad():
        ms, why = _timed(candidate, candidate.forward)
    if why:
        row["note"] = why
        notes[f"{candidate.label}: {why}"] = None
        return row
    row.update(forward_ms=ms, forward_tflops=flops / (ms * 1e-3) / 1e12)
    if candidate.both is None:
        if candidate.why_not_both:
            row["note"] = candidate.why_not_both
            notes[f"{candidate.label} forward+backward: {candidate.why_not_both}"] = None
        return row
    ms, why = _timed(candidate, candidate.both)
    if why:
        row["note"] = why
        notes[f"{candidate.label} forward+backward: {why}"] = None
        return row
    total = flops * (1 + BACKWARD_FLOPS_PER_FORWARD)
    row.update(forward_backward_ms=ms, forward_backward_tflops=total / (ms * 1e-3) / 1e12)
    return row


def bench_text(result, labels):
    s = result["settings"]
    both = s["forward_backward"]
    lines = [f"bench on {s['device']}: TFLOP/s, " + ("forward | forward+backward" if both else "forward"),
             f"(B*N = {s['tokens']} tokens, H*d = {s['hidden']}, causal top-left; median of {s['runs']} calls after "
             f"{s['warmup']} warmup, each between CUDA events; FLOPs: 4 B H N^2 d, halved when causal, x3.5 with the "
             "backward)"]
    if not s["pairs"]:
        lines.append("nothing timed: fn passed no bf16 or f16 case, and the bench times only what verify passed")
        return "\n".join(lines) + "\n"
    width = max(16, *(len(label) + 2 for label in labels))
    lines.append((f"{'dtype':<6}{'d':<5}{'causal':<7}{'N':<7}" + "".join(f"{label:<{width}}" for label in labels)).rstrip())
    cells = {}
    for r in result["rows"]:
        key = (r["dtype"], r["head_dim"], r["causal"], r["seq"])
        text = "-" if r["forward_tflops"] is None else f"{r['forward_tflops']:.1f}"
        if both and r["forward_tflops"] is not None:
            text += " | " + ("-" if r["forward_backward_tflops"] is None else f"{r['forward_backward_tflops']:.1f}")
        cells.setdefault(key, {})[r["candidate"]] = text
    for (dtype, head_dim, causal, seq), row in cells.items():
        lines.append((f"{dtype:<6}{head_dim:<5}{'yes' if causal else 'no':<7}{seq:<7}" +
                      "".join(f"{row.get(label, '-'):<{width}}" for label in labels)).rstrip())
    if result["notes"]:
        lines.append("not timed (-):")
        lines += [f"  {note}" for note in result["notes"]]
    return "\n".join(lines) + "\n"
