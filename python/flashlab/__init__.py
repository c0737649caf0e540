"""FlashLab from Python: every attention variant of the table, on NumPy arrays or on GPU tensors.

    import numpy as np, flashlab
    q, k, v = (np.random.randn(1, 128, 4, 64).astype(np.float32) for _ in range(3))
    o, lse = flashlab.attention(q, k, v, variant="cpu-fa2", is_causal=True, return_lse=True)

Inputs:
  * NumPy arrays (float64, float32, float16; any strides): copied in, computed by any variant (CUDA
    ones copy to the GPU and back), results returned as new NumPy arrays. Tensors of another library in
    host memory (a CPU torch.Tensor) are read through NumPy the same way.
  * Tensors in CUDA memory from any DLPack producer (PyTorch, CuPy): read in place by the CUDA
    variants, with no host copy; results come back in GPU memory as DeviceArray, which
    torch.from_dlpack / cupy.from_dlpack read in place. The kernels read (B, S, H, D) rows, so such a
    tensor must be contiguous in its layout, or, with layout="bhsd", a (B, H, S, D) view of (B, S, H, D)
    memory (x.transpose(1, 2) of a contiguous tensor); anything else is refused, never copied.

Layouts: "bshd" (batch, seq, heads, head_dim), as `flashlab run` reads .npy files, and "bhsd" (batch,
heads, seq, head_dim), as PyTorch's scaled_dot_product_attention takes them. q is (B, S_q, H_q, D), k
and v (B, S_k, H_kv, D) with H_q a multiple of H_kv (grouped-query attention); the LSE is always
(B, H_q, S_q).

FP8: attention(..., dtype="e4m3") runs cuda-fa3-ws's FP8 forward, on NumPy values it quantizes per head, or on
e4m3 GPU tensors with their descales (flashlab.torch.fp8_attention from PyTorch); within_fp8_rule is the rule
FlashLab holds it to.

variant="auto" picks the first variant of AUTO_ORDER (fastest first, as measured) that can run the problem where
its tensors are (NumPy arrays: a CPU variant; GPU tensors: a CUDA one); flashlab.explain(q, k, v, ...) says which,
and why not each other variant.

Bad input raises ValueError with one sentence saying what is wrong and what is supported; a failure on
the GPU raises RuntimeError. flashlab.torch (imported only where PyTorch is present) wraps the CUDA
variants as a torch.autograd.Function and a drop-in for torch.nn.functional.scaled_dot_product_attention.
"""
import dataclasses as _dataclasses
import os as _os

import numpy as _np

from . import _flashlab as _native

__all__ = ["attention", "attention_backward", "explain", "Explanation", "AUTO_ORDER", "variants", "check",
           "within_tolerance", "within_fp8_rule", "verify", "VerifyReport", "DeviceArray", "cuda_device_count",
           "cuda_device_name", "built_with_cuda"]

DeviceArray = _native.DeviceArray
built_with_cuda = _native.built_with_cuda

# DLPack device types (dlpack.h): where a tensor's memory is.
_DLPACK_CPU = 1
# The stream a DLPack consumer names to mean CUDA's legacy default stream, on which every kernel runs.
_LEGACY_DEFAULT_STREAM = 1


def variants():
    """The variant table, one dict per row, as `flashlab check --list` prints it: name, device,
    dtypes, whether it supports causal masks, dropout, GQA and a backward pass, its head dims (as text,
    and every accepted value in head_dim_values), whether it can run here (available), the compute
    capability it needs (0: any GPU) and a one-line summary.

    deterministic: whether its backward gives bit-identical gradients run to run under
    attention_backward(..., deterministic=True) (False for the variants that add dQ with atomics, and for
    those with no backward). backward_head_dims and backward_head_dim_values: the head dims its backward
    accepts, the same as head_dims where the backward takes all of them. e4m3_head_dims and
    e4m3_head_dim_values: the head dims of its FP8 forward (attention(..., dtype="e4m3")), "" and [] without one."""
    return _native.variants()


def cuda_device_count():
    """How many CUDA devices this machine has (0 without one, or in a build without CUDA)."""
    return _native.cuda_device_count()


def cuda_device_name():
    """The current CUDA device's name, e.g. "NVIDIA H100 80GB HBM3"; "" without one."""
    return _native.cuda_device_name()


def attention(q, k, v, *, variant="cpu-fa2", is_causal=False, causal_align="top-left", scale=None,
              dropout_p=0.0, seed=0, return_lse=False, layout="bshd", out=None, dtype=None, q_descale=None,
              k_descale=None, v_descale=None, return_quantized=False):
    """Attention O = softmax(scale Q K^T [+ causal mask]) V with dropout on P, computed by `variant` ("auto": the
    variant flashlab.explain(q, k, v, ...) names for this problem, among those on the tensors' device).

    is_causal: mask keys after each query; causal_align says which diagonal: "top-left" (query i sees
    keys j <= i, as PyTorch's is_causal) or "bottom-right" (j <= i + S_k - S_q, as FlashAttention >= 2.1).
    scale: the softmax scale, None for 1/sqrt(head_dim). dropout_p: the probability of dropping an
    element of P (kept ones are scaled by 1/(1 - dropout_p)); the mask is a Philox draw keyed by `seed`,
    batch, head, row and column, so every variant drops the same elements. layout: "bshd" or "bhsd".

    Returns O, shaped and laid out like q, in q's dtype (NumPy arrays in, NumPy arrays out; GPU tensors
    in, DeviceArray out), and with return_lse=True also the log-sum-exp of each row, (B, H_q, S_q),
    float32 (float64 for float64 inputs); a fully masked row has O = 0 and LSE = -inf.

    out: for tensors in GPU memory, a pair (o, lse) of tensors to write the results into instead of new
    DeviceArrays (no allocation): o like q (shape, layout, dtype, device), lse (B, H_q, S_q) float32, both
    laid out as the inputs must be; they are what is returned.

    dtype: the precision to compute in; None (the default) is the inputs' own. "e4m3" runs the FP8 forward
    (cuda-fa3-ws: forward only, no dropout, flashlab.variants()'s FP8 head dims):
      * on NumPy arrays of float64, float32 or float16 values, which are quantized per head as `flashlab run
        --dtype e4m3` does (Q per (batch, query head), K and V per (batch, kv head): scale 448 / amax, rounded to
        e4m3). O comes back as float32 holding the kernel's bf16 values (NumPy has no bfloat16), the LSE as
        float32. return_quantized=True appends a dict of what the kernel was given, as `run --save-quantized`
        writes it: "q", "k", "v" the e4m3 bytes as uint8 arrays in `layout` (view them as float8_e4m3fn), and
        "q_descale" (B, H_q), "k_descale" and "v_descale" (B, H_kv) float32 (value = e4m3 value x descale);
      * on e4m3 tensors in GPU memory (torch.float8_e4m3fn, or uint8 holding e4m3 bytes with dtype="e4m3"; GPU
        tensors of float8_e4m3fn need no dtype), with q_descale (B, H_q), k_descale and v_descale (B, H_kv):
        float32 tensors on the same GPU, one descale per (batch, head), as FlashAttention-3 takes them. O comes
        back in bf16, the LSE in float32 (out=: a bf16 o and a float32 lse).
    """
    options = _options(is_causal, causal_align, scale, dropout_p, seed)
    variant, layout = _text("variant", variant), _text("layout", layout)
    dtype = None if dtype is None else _text("dtype", dtype)
    place, (q, k, v) = _inputs_in_one_place(q=q, k=k, v=v)
    if variant == "auto":
        variant = _auto_variant(q, k, v, place, is_causal=is_causal, dropout_p=dropout_p, backward=False,
                                deterministic=False, dtype=dtype, layout=layout)
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    if place == "host":
        _refuse_out_on_host(out, "out")
        given = [name for name, d in descales.items() if d is not None]
        if given:
            raise ValueError(f"{given[0]} goes with e4m3 tensors in GPU memory; NumPy arrays are values, which "
                             "dtype='e4m3' quantizes per head itself (return_quantized=True returns the bytes and "
                             "descales it made)")
        o, lse, quantized = _native.forward_host(q, k, v, variant, layout, *options, dtype, bool(return_quantized))
        o, lse = _np.asarray(o), _np.asarray(lse)
        if return_quantized:
            quantized = {name: _np.asarray(x) for name, x in quantized.items()}
            if layout == "bhsd":  # the bytes as the values were given: (B, H, S, D) views of (B, S, H, D) memory
                for name in ("q", "k", "v"):
                    quantized[name] = quantized[name].transpose(0, 2, 1, 3)
            return (o, lse, quantized) if return_lse else (o, quantized)
        return (o, lse) if return_lse else o
    if return_quantized:
        raise ValueError("return_quantized returns the e4m3 bytes that dtype='e4m3' makes from NumPy values; GPU "
                         "tensors in e4m3 are quantized already (you hold their bytes and descales)")
    for name, d in descales.items():
        if d is not None and _where(name, d)[0] != "device":
            raise ValueError(f"{name} is in host memory but q is in device memory: pass the descales as float32 "
                             "tensors on the inputs' GPU")
    given = _given_buffers(out, ("o", "lse"), "out")
    made = _native.forward_device(*_capsules(q, k, v), *_capsules(q_descale, k_descale, v_descale),
                                  *_capsules(*given), variant, layout, *options, dtype)
    o, lse = (m if g is None else g for m, g in zip(made, given))
    return (o, lse) if return_lse else o


def attention_backward(q, k, v, out, lse, grad_out, *, variant="cpu-fa2", is_causal=False,
                       causal_align="top-left", scale=None, dropout_p=0.0, seed=0, layout="bshd", grads_out=None,
                       deterministic=False, dtype=None):
    """The gradients (dq, dk, dv) of attention(q, k, v, ...) for the upstream gradient grad_out (dL/dO).

    out and lse are what attention(..., return_lse=True) returned for the same inputs and options
    (dropout_p and seed included: the backward redraws the same mask). variant="auto": the variant
    flashlab.explain(q, k, v, backward=True, deterministic=deterministic, ...) names. Returns dq, dk, dv shaped, laid
    out and typed like q, k, v, in the same place as the inputs.

    grads_out: for tensors in GPU memory, (dq, dk, dv) tensors to write the gradients into (shaped, typed
    and laid out like q, k, v), which are then what is returned.

    deterministic: sum dQ's partial sums in a fixed order, so that repeated calls give bit-identical
    gradients. Variants whose backward adds them with atomics (variants()'s "deterministic" is False)
    refuse it with ValueError; the CPU variants have one order, so it changes nothing there.

    dtype: None (the inputs' own) or the inputs' dtype. There is no FP8 backward: "e4m3" (or e4m3 GPU tensors) is
    refused with the library's sentence.
    """
    options = (*_options(is_causal, causal_align, scale, dropout_p, seed), bool(deterministic))
    variant, layout = _text("variant", variant), _text("layout", layout)
    dtype = None if dtype is None else _text("dtype", dtype)
    place, tensors = _inputs_in_one_place(q=q, k=k, v=v, out=out, lse=lse, grad_out=grad_out)
    if variant == "auto":
        variant = _auto_variant(*tensors[:3], place, is_causal=is_causal, dropout_p=dropout_p, backward=True,
                                deterministic=deterministic, dtype=dtype, layout=layout)
    if place == "host":
        _refuse_out_on_host(grads_out, "grads_out")
        return tuple(_np.asarray(g) for g in _native.backward_host(*tensors, variant, layout, *options, dtype))
    given = _given_buffers(grads_out, ("dq", "dk", "dv"), "grads_out")
    made = _native.backward_device(*_capsules(*tensors), *_capsules(*given), variant, layout, *options, dtype)
    return tuple(m if g is None else g for m, g in zip(made, given))


# --- variant="auto" and explain: which variant runs a problem, and why not the others -----------------------------

# The order variant="auto" tries the variants in, fastest first: it takes the first that can run the problem where its
# tensors are. Each entry says why it sits above the ones after it; a variant competes only with those that take the
# same dtypes on the same device, so the order matters within those groups alone. The measurements are
# docs/RESULTS.md's tables (from bench/results/); where a pair was never measured the entry says "by construction".
# A new row of the variant table belongs here too (a test checks that every row is listed).
AUTO_ORDER = (
    ("cuda-fa3-ws", "the Hopper kernel: ahead of cuda-fa2 in every row of RESULTS.md's Hopper forward table, and the "
                    "only one with an FP8 forward"),
    ("cuda-fa3-ws-eager-rescale", "cuda-fa3-ws without its conditional rescale, a FlashAttention-4 rung kept for "
                                  "teaching (forward only, Hopper only): level with cuda-fa3-ws at d = 64 and slower at "
                                  "d = 128 and 256 in the race, and only ever competes with it, which runs every "
                                  "problem it runs"),
    ("cuda-fa3-ws-exp2-emulated", "cuda-fa3-ws with part of its exponentials on the FMA pipes, a FlashAttention-4 "
                                  "rung kept for teaching (forward only, Hopper only): slower than cuda-fa3-ws in the "
                                  "race, and only ever competes with it"),
    ("cuda-fa3-ws-step4", "a rung of cuda-fa3-ws's ladder (forward only, Hopper only, kept for teaching); the rungs "
                          "measured mostly, not always, faster one step up, and only ever compete with cuda-fa3-ws, "
                          "which runs every problem they run"),
    ("cuda-fa3-ws-step3", "a rung of cuda-fa3-ws's ladder, below step 4 (one idea fewer)"),
    ("cuda-fa3-ws-step2", "a rung of cuda-fa3-ws's ladder, below step 3 (one idea fewer)"),
    ("cuda-fa3-ws-step1", "a rung of cuda-fa3-ws's ladder, below step 2 (no warp specialization, the big step)"),
    ("cuda-fa2", "f16 and bf16 on tensor cores on any GPU: below cuda-fa3-ws as measured on Hopper; it never competes "
                 "with the fp32 kernels below (other dtypes)"),
    ("cuda-fa2-simt", "the fastest fp32 CUDA kernel from N = 1k on in RESULTS.md's readable-kernel table (level with "
                      "cuda-cublas below that), head dims up to 128"),
    ("cuda-cublas", "ahead of cuda-naive and cuda-fa1 at every length of the same table, head dims up to 256"),
    ("cuda-naive", "ahead of cuda-fa1 at every length of the same table (it refuses sizes whose S and P do not fit)"),
    ("cuda-fa1", "the slowest fp32 CUDA kernel at every length of the same table"),
    ("cpu-fa2", "ahead of cpu-naive at every length of RESULTS.md's CPU table (and of bench/results' CPU backward "
                "run)"),
    ("cpu-fa1", "not in the CPU table: below cpu-fa2 by construction (its K/V-outer loop rereads and rewrites O for "
                "every K/V block), above cpu-naive by construction (no N x N S and P)"),
    ("cpu-naive", "below cpu-fa2 as measured, and below cpu-fa1 by construction (S and P materialized)"),
)

_DTYPE_NAMES = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3"}
_DLPACK_CUDA, _DLPACK_CUDA_MANAGED = 2, 13

# How far a variant got through the checks before one ruled it out: the problem's own needs first, then where it runs.
# The closest variants (furthest stage) name the refusal when nothing can run a problem.
_NOT_BUILT, _DTYPE, _HEAD_DIM, _MASK, _DROPOUT, _BACKWARD, _DEVICE, _AVAILABLE, _CAN_RUN = range(9)


def explain(q, k, v, *, is_causal=False, causal_align="top-left", dropout_p=0.0, backward=False, dtype=None,
            layout="bshd", deterministic=False):
    """Which variant variant="auto" picks for this problem on this machine, and why not each other one.

    q, k, v as attention takes them (NumPy arrays, PyTorch tensors on the CPU or a GPU, other DLPack tensors); only
    their shapes, dtypes and place are read. backward=True (and deterministic) asks for a variant whose backward pass
    runs the problem, as attention_backward(..., variant="auto") does. Tensors in host memory go to CPU variants and
    tensors on a GPU to CUDA variants: auto never moves them.

    Returns an Explanation: .choice (the variant's name, None when no variant can run the problem), .reasons (every
    variant of AUTO_ORDER and of the table, in that order, -> one sentence: why it is chosen, what rules it out, or
    why it ranks below the choice), .problem (what was read off the tensors) and .refusal (the ValueError sentence
    attention(variant="auto") raises when .choice is None). print() it for a table.
    """
    named = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        named[name] = x.detach() if getattr(x, "requires_grad", False) and hasattr(x, "detach") else x
    place, (q, k, v) = _inputs_in_one_place(**named)
    _options(is_causal, causal_align, None, dropout_p, 0)
    return _explain(q, k, v, place, is_causal=is_causal, dropout_p=dropout_p, backward=backward,
                    deterministic=deterministic, dtype=None if dtype is None else _text("dtype", dtype),
                    layout=_text("layout", layout))


@_dataclasses.dataclass(frozen=True)
class Explanation:
    """What explain found: choice (a variant's name, or None), reasons (name -> one sentence, in auto's order),
    problem (dtype, head_dim, heads_q, heads_kv, causal, dropout_p, backward, deterministic, where), refusal (the
    sentence attention(variant="auto") raises when choice is None, else "")."""
    choice: object
    reasons: dict
    problem: dict
    refusal: str

    def __str__(self):
        p = self.problem
        heads = f"{p['heads_q']} heads" if p["heads_q"] == p["heads_kv"] else f"{p['heads_q']}/{p['heads_kv']} heads"
        what = ", ".join([p["dtype"], f"head dim {p['head_dim']}", heads, "causal" if p["causal"] else "no mask",
                          f"dropout {p['dropout_p']:g}" if p["dropout_p"] > 0 else "no dropout",
                          "forward and backward" + (" (deterministic)" if p["deterministic"] else "")
                          if p["backward"] else "forward", f"tensors in {p['where']}"])
        head = f"variant='auto' picks {self.choice}" if self.choice else "variant='auto' finds no variant"
        width = max(len("variant"), *map(len, self.reasons))
        lines = [f"{head} for: {what}", f"{'variant':<{width}}  why", f"{'-' * width}  ---"]
        lines += [f"{name:<{width}}  {sentence}" for name, sentence in self.reasons.items()]
        return "\n".join(lines + ([self.refusal] if self.refusal else []))


def _explain(q, k, v, place, *, is_causal, dropout_p, backward, deterministic, dtype, layout):
    """explain on tensors already read by _inputs_in_one_place."""
    problem = _problem(q, k, v, place, is_causal=is_causal, dropout_p=dropout_p, backward=backward,
                       deterministic=deterministic, dtype=dtype, layout=layout)
    rows = {row["name"]: row for row in variants()}
    why = dict(AUTO_ORDER)
    names = [name for name, _ in AUTO_ORDER] + [name for name in rows if name not in why]
    verdicts = {name: _rule_out(rows[name], problem) if name in rows else _not_built(name, problem)
                for name in names}
    choice = next((name for name in names if verdicts[name] is None), None)
    reasons = {}
    for name in names:
        if name == choice:
            reasons[name] = f"chosen: the first in auto's order that can run this problem ({why.get(name, '')})"
        elif verdicts[name] is None:
            reasons[name] = (f"{name} can run this problem too, but ranks below {choice} in auto's order "
                             f"({choice}: {why.get(choice)}; {name}: {why[name]})" if name in why else
                             f"{name} can run this problem too, but is not in auto's order (AUTO_ORDER)")
        else:
            reasons[name] = _sentence(name, verdicts[name][1])
    return Explanation(choice, reasons, problem, "" if choice else _refusal(verdicts))


def _refusal(verdicts):
    """One sentence from the variants that got furthest through the checks, those ruled out for one reason together."""
    furthest = max(stage for stage, _ in verdicts.values())
    alike = {}  # reason -> the variants it rules out, in auto's order
    for name, (stage, reason) in verdicts.items():
        if stage == furthest:
            alike.setdefault(reason, []).append(name)
    clauses = [_sentence(names[0], reason) + (f" (likewise {_spoken(names[1:], 'and')})" if names[1:] else "")
               for reason, names in list(alike.items())[:3]]
    return "variant='auto' finds no variant that can run this problem here: " + "; ".join(clauses)


def _sentence(name, reason):
    """The variant's name and the reason, which starts with a verb or with "'s"."""
    return name + ("" if reason.startswith("'") else " ") + reason


def _auto_variant(q, k, v, place, **problem):
    """The name variant="auto" resolves to, or ValueError with explain's refusal."""
    explanation = _explain(q, k, v, place, **problem)
    if explanation.choice is None:
        raise ValueError(explanation.refusal)
    return explanation.choice


def _problem(q, k, v, place, *, is_causal, dropout_p, backward, deterministic, dtype, layout):
    """What the choice depends on, read off the tensors' shapes, dtypes and place."""
    if layout.lower() not in ("bshd", "bhsd"):
        raise ValueError(f"unknown layout '{layout}': supported are bshd (batch, seq, heads, head_dim) and bhsd "
                         "(batch, heads, seq, head_dim)")
    spelled = "(batch, seq, heads, head_dim)" if layout.lower() == "bshd" else "(batch, heads, seq, head_dim)"
    shapes = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        shapes[name] = tuple(int(n) for n in x.shape)
        if len(shapes[name]) != 4:
            raise ValueError(f"{name} has shape {shapes[name]} but inputs must be 4-d, in layout {spelled}")
    heads = 2 if layout.lower() == "bshd" else 1
    own = str(q.dtype).removeprefix("torch.")
    return dict(dtype=dtype or _DTYPE_NAMES.get(own, own), head_dim=shapes["q"][3], heads_q=shapes["q"][heads],
                heads_kv=shapes["k"][heads], causal=bool(is_causal), dropout_p=float(dropout_p),
                backward=bool(backward), deterministic=bool(deterministic), where=_memory(q, place))


def _memory(x, place):
    if place == "host":
        return "host memory"
    kind = int(x.__dlpack_device__()[0])
    return {_DLPACK_CUDA: "CUDA device memory", _DLPACK_CUDA_MANAGED: "CUDA managed memory"}.get(
        kind, f"memory of DLPack device type {kind}")


def _not_built(name, p):
    """A variant of AUTO_ORDER that this build lacks: for tensors on a GPU, a missing CUDA variant is the closest
    reason there is (the CPU ones are ruled out for their device)."""
    if not built_with_cuda and name.startswith("cuda-"):
        stage = _AVAILABLE if p["where"] == "CUDA device memory" else _NOT_BUILT
        return stage, "is not in this build (it was built without CUDA)"
    return _NOT_BUILT, "is not in this build"


def _spoken(items, conjunction="or"):
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {conjunction} " + items[-1]


def _rule_out(row, p):
    """None when the row can run problem p here, else (stage, what rules it out: a sentence without its
    subject, the variant's name)."""
    e4m3 = p["dtype"] == "e4m3"
    if p["dtype"] not in row["dtypes"]:
        return _DTYPE, f"computes in {_spoken(row['dtypes'])}, not {p['dtype']}"
    dims, text = ((row["e4m3_head_dim_values"], row["e4m3_head_dims"]) if e4m3 else
                  (row["head_dim_values"], row["head_dims"]))
    if p["head_dim"] not in dims:
        return _HEAD_DIM, f"{'in e4m3 ' if e4m3 else ''}takes head dims {text}, not {p['head_dim']}"
    if p["causal"] and not row["causal"]:
        return _MASK, "has no causal mask"
    if p["heads_q"] != p["heads_kv"] and not row["gqa"]:
        return _MASK, (f"needs as many key/value heads as query heads (no grouped-query attention), and this "
                       f"problem has {p['heads_q']} and {p['heads_kv']}")
    if p["dropout_p"] > 0 and (e4m3 or not row["dropout"]):
        return _DROPOUT, (f"has no dropout{' in its FP8 (e4m3) forward' if e4m3 else ''}, and dropout_p is "
                          f"{p['dropout_p']:g}")
    if p["backward"]:
        if e4m3:
            return _BACKWARD, "has no FP8 (e4m3) backward pass"
        if not row["backward"]:
            return _BACKWARD, "has no backward pass (it is forward only)"
        if p["head_dim"] not in row["backward_head_dim_values"]:
            return _BACKWARD, f"'s backward takes head dims {row['backward_head_dims']}, not {p['head_dim']}"
        if p["deterministic"] and not row["deterministic"]:
            return _BACKWARD, "'s backward adds dQ with atomics and has no deterministic mode"
    if row["device"] == "cpu" and p["where"] != "host memory":
        return _DEVICE, f"runs on the CPU, and the tensors are in {p['where']}: auto never moves them"
    if row["device"] != "cpu" and p["where"] == "host memory":
        return _DEVICE, ("runs on a CUDA GPU, and the tensors are in host memory: auto keeps them there (naming "
                         "the variant copies them to the GPU and back)")
    if row["device"] != "cpu" and p["where"] != "CUDA device memory":
        return _DEVICE, f"takes tensors in CUDA device memory, and these are in {p['where']}"
    if not row["available"]:
        need = row["needs_compute_capability"]
        if cuda_device_count() == 0:
            return _AVAILABLE, "needs a CUDA GPU and this machine has none"
        if need:
            return _AVAILABLE, (f"needs a GPU of compute capability {need // 10}.{need % 10}, and this GPU "
                                f"({cuda_device_name()}) has another")
        return _AVAILABLE, "cannot run on this machine"
    return None


def check(*, batch=1, heads=2, heads_kv=None, seq_q=128, seq_k=None, head_dim=64, causal="none", scale=None,
          dropout_p=0.0, seed=0, dtype=None, variants=None, backward=False, deterministic=False):
    """`flashlab check` from Python: the variants (every row of the table, or the names given) on the same
    random inputs (drawn from `seed`) against naive attention in double, under the tolerance rule.

    Returns the table as rows, one dict per output of each (variant, dtype) pair: variant, device,
    dtype, output ("O", "LSE", "dQ", "dK", "dV"; "-" / "grads" for a skipped pair or backward,
    "forward" / "backward" for a pass that raised), max_abs_error and rel_error (None unless compared),
    bound (the rule applied), result ("PASS", "FAIL ...", or "SKIP: <why it cannot run>"). A variant named
    in `variants` that cannot run the problem raises ValueError instead of being skipped.
    causal: "none", "top-left" or "bottom-right". dtype: "f64", "f32", "f16" or "bf16" (None: every dtype
    each variant supports). deterministic: run the backward as attention_backward(..., deterministic=True)
    does (a variant without that mode has its gradients skipped, or is refused where named).
    """
    names = [variants] if isinstance(variants, str) else list(variants or [])
    return _native.check(batch, heads, heads_kv, seq_q, seq_k, head_dim, causal, _scale(scale), float(dropout_p),
                         _seed(seed), dtype, names, bool(backward), bool(deterministic))


def within_tolerance(out, ref, *, dtype, quantity="forward", lowp=None):
    """FlashLab's one tolerance rule (the one `flashlab check` applies) for `out` against the reference
    `ref` (attention computed in float64): for f64 / f32, ||out - ref|| / ||ref|| <= 1e-12 / 1e-5; for f16 /
    bf16, FlashAttention's rule, max|out - ref| <= k max|lowp - ref| + 1e-5 max(1, max|ref|), k = 2 for the
    forward outputs ("forward") and 3 for gradients ("gradient"), where `lowp` is a standard attention
    run in that low precision. NaN never passes. Arrays: anything NumPy can read as float64, any shape.

    Returns a dict: passes, max_abs_error, rel_error, has_nan, limit, on (which error the limit bounds),
    rule (as `flashlab check` prints it), and lowp_max_abs_error when lowp was given.
    """
    as_float64 = lambda x: _np.asarray(x, dtype=_np.float64)
    return _native.within_tolerance(as_float64(out), as_float64(ref), dtype, quantity,
                                    None if lowp is None else as_float64(lowp))


def within_fp8_rule(q, k, v, out, lse, *, is_causal=False, causal_align="top-left", scale=None, layout="bshd"):
    """The rule FlashLab holds its FP8 forward to (`flashlab check --dtype e4m3`), for `out` and `lse` from
    attention(q, k, v, dtype="e4m3", return_lse=True, ...) with the same options: q, k, v (NumPy, the values
    before quantization) are quantized per head as that call quantizes them, the FP8 forward is emulated on the
    CPU operation by operation on those operands, and both it and (out, lse) are measured against naive
    attention in float64 on the dequantized inputs (so the error of quantizing the inputs, the format's, is left
    out). out passes when max|out - ref| <= 2 x the emulation's, and lse when max|lse - ref| <= 2 x the
    emulation's + 2^-9 (1 + max|ref|).

    Returns a dict: passes, o_max_abs_error, o_rmse, o_limit, lse_max_abs_error, lse_limit, and the emulation's
    own errors and worst-case bounds (emulation_o_max_abs_error, emulation_o_rmse, emulation_lse_max_abs_error,
    emulation_o_bound, emulation_lse_bound, emulation_passes).
    """
    as_array = lambda x: _np.asarray(x)
    options = _options(is_causal, causal_align, scale, 0.0, 0)
    return _native.within_fp8_rule(*map(as_array, (q, k, v, out, lse)), _text("layout", layout), *options[:3])


def verify(fn, *, backward=None, dtypes=("f32", "f16", "bf16"), head_dims=(32, 64, 128), suite="quick", seed=None,
           layout="bshd", name=None, device=None, bench=False):
    """Check your own attention function the way FlashLab checks its kernels (`flashlab verify`): about 20 cases
    (suite="full": about 200) of odd lengths, seq_q != seq_k both ways, many K/V blocks, both causal alignments,
    GQA and MQA, each on fresh random inputs, judged by FlashLab's rule, and when some fail, a diagnosis of
    what the failing cases have in common (the mask, its alignment, the tail, the online softmax's rescale, the
    LSE's base, the GQA sum of dK/dV, the scale).

    fn(q, k, v, *, is_causal, causal_align, scale) returns O, or (O, LSE). q is (B, S_q, H_q, D), k and v
    (B, S_k, H_kv, D) with H_q a multiple of H_kv, in `layout` ("bshd" or "bhsd"), contiguous. O comes back in the
    same layout; the LSE is (B, H_q, S_q), natural log, -inf for a row that sees no key. Raise NotImplementedError
    for what fn does not run (a dtype, a head dim): the case is listed as refused.

    device: None (the default) hands fn NumPy arrays: float32 for "f32", float16 for "f16", and float32 holding
    bfloat16 values for "bf16" (NumPy has no bfloat16). A PyTorch device ("cuda", "cuda:1", "cpu") hands fn torch
    tensors on it instead, torch.float32, float16 or bfloat16, holding exactly the values verify drew; fn returns
    tensors (read back as float64).

    backward: None; or backward(q, k, v, out, lse, grad_out, *, is_causal, causal_align, scale) returning
    (dq, dk, dv), arrays or tensors as fn's (lse float32), which gets FlashLab's reference out and lse, so it is
    judged on its own; or "autograd" (with a device): dQ, dK and dV are torch.autograd.grad of fn's own O for
    FlashLab's dO, so a wrong forward makes them wrong too, and the report says how many failing cases that
    explains.

    bench: with device="cuda", also time fn beside FlashLab's cuda-fa2 and cuda-fa3-ws (through flashlab.torch)
    and PyTorch's scaled_dot_product_attention (its flash and cuDNN backends), each where it runs the problem, on the
    FlashAttention-2 paper's shapes (B*N = 16384 tokens, H*d = 2048, N = 1024, 4096, 16384, causal and not), for
    each bf16 / f16 (dtype, head dim) pair fn passed: forward, and forward+backward when fn has a backward; the
    median of several calls between CUDA events, in TFLOP/s as FlashAttention counts them. The table is printed
    after the report, and is .as_dict()["bench"].

    Returns a VerifyReport: true when every case passed; print it for the table; .as_dict() for the data.
    """
    if not callable(fn):
        raise ValueError(f"fn must be a callable, got {type(fn).__name__}")
    if backward is not None and backward != "autograd" and not callable(backward):
        raise ValueError(f"backward must be None, a callable or 'autograd', got {backward!r}")
    layout = _text("layout", layout)
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout is bshd or bhsd, not {layout!r}")
    if not isinstance(bench, bool):
        raise ValueError(f"bench must be True or False, got {bench!r}")
    name = name or getattr(fn, "__name__", "fn")
    if device is None:
        if backward == "autograd":
            raise ValueError("backward='autograd' needs PyTorch tensors: pass device='cuda' (or 'cpu') so that fn gets "
                             "torch tensors, or give a backward function")
        if bench:
            raise ValueError("bench=True times fn on a CUDA GPU with CUDA events: pass device='cuda'")
        return _verify(_numpy_calls(fn, backward, layout), name, dtypes, head_dims, suite, seed)

    device = _torch_device(device)
    if bench and device.type != "cuda":
        raise ValueError(f"bench=True times fn on a CUDA GPU with CUDA events, not on the {device.type}: pass "
                         "device='cuda'")
    from . import _verify_torch
    calls = _verify_torch.TorchCalls(fn, backward, layout, device)
    report = _verify((calls.forward, None if backward is None else calls.backward), name, dtypes, head_dims, suite,
                     seed)
    if calls.not_differentiable:
        raise ValueError(calls.not_differentiable)
    if backward == "autograd":
        report._add_notes(_verify_torch.autograd_notes(report.as_dict()))
    if bench:
        report._add_bench(_verify_torch.bench(fn, backward, layout, device, report.as_dict(), name))
    return report


class VerifyReport:
    """What verify found: true when every case passed. str(report) is the table `flashlab verify` prints (then, for
    backward='autograd', how many failures the forward explains, and with bench=True the bench's table);
    .as_dict() the data (cases, refused, diagnosis, first_failure, seed, notes, and bench: settings, rows, notes);
    .raise_on_failure() raises AssertionError with the table, for a test."""

    def __init__(self, report):
        self._report = dict(report, notes=[], bench=None)

    def __bool__(self):
        return bool(self._report["ok"])

    def __str__(self):
        text = self._report["text"] + "".join(note + "\n" for note in self._report["notes"])
        bench = self._report["bench"]
        return text if bench is None else text + "\n" + bench["text"]

    def __repr__(self):
        return (f"<VerifyReport {self._report['kernel']}: {self._report['passed']} pass, "
                f"{self._report['failed']} fail, seed {self._report['seed']}>")

    def as_dict(self):
        data = {k: v for k, v in self._report.items() if k != "text"}
        if data["bench"] is not None:
            data["bench"] = {k: v for k, v in data["bench"].items() if k != "text"}
        return data

    @property
    def diagnosis(self):
        return self._report["diagnosis"]

    def raise_on_failure(self):
        if not self:
            raise AssertionError(str(self))
        return self

    def _add_notes(self, notes):
        self._report["notes"] += notes

    def _add_bench(self, bench):
        self._report["bench"] = bench


def _verify(calls, name, dtypes, head_dims, suite, seed):
    """The engine on (forward, backward) that take and return float64 (B, S, H, D) arrays."""
    dtypes = [dtypes] if isinstance(dtypes, str) else [_text("dtypes' items", d) for d in dtypes]
    head_dims = [int(d) for d in ([head_dims] if isinstance(head_dims, int) else head_dims)]
    seed = int.from_bytes(_os.urandom(8), "little") if seed is None else _seed(seed)
    forward, backward = calls
    return VerifyReport(_native.verify(forward, backward, _text("name", name), dtypes, head_dims,
                                       _text("suite", suite), seed))


def _torch_device(device):
    """device as a torch.device where fn's tensors can be made, or ValueError with one sentence."""
    try:
        import torch
    except ImportError:
        raise ValueError(f"device={device!r} hands fn PyTorch tensors, but this Python cannot import torch: install "
                         "PyTorch, or leave device out to get NumPy arrays") from None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device must name a PyTorch device such as 'cuda', 'cuda:1' or 'cpu', got {device!r}") from None
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"verify hands fn tensors on 'cuda' or 'cpu', not on {device.type!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} is missing: this PyTorch sees no CUDA device "
                             "(torch.cuda.is_available() is False); device='cpu' hands fn tensors in host memory")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r} is missing: this PyTorch sees {torch.cuda.device_count()} CUDA "
                             "device(s), numbered from 0")
    return device


_NUMPY_DTYPES = {"f32": _np.float32, "f16": _np.float16, "bf16": _np.float32}


def _options_of(causal, scale):
    return dict(is_causal=causal != "none", causal_align="top-left" if causal == "none" else causal, scale=scale)


def _numpy_calls(fn, backward, layout):
    """The engine's float64 (B, S, H, D) calls around fn and backward on NumPy arrays in `layout`."""
    def to_user(x, dtype):
        x = x.astype(_NUMPY_DTYPES[dtype])
        return _np.ascontiguousarray(x.transpose(0, 2, 1, 3)) if layout == "bhsd" else x

    def from_user(x, what):
        x = _np.asarray(x, dtype=_np.float64)
        if x.ndim != 4:
            raise ValueError(f"{what} must have 4 dimensions, got shape {x.shape}")
        return _np.ascontiguousarray(x.transpose(0, 2, 1, 3)) if layout == "bhsd" else x

    def forward(q, k, v, dtype, causal, scale):
        result = fn(to_user(q, dtype), to_user(k, dtype), to_user(v, dtype), **_options_of(causal, scale))
        out, lse = result if isinstance(result, (tuple, list)) else (result, None)
        return from_user(out, "O"), None if lse is None else _np.asarray(lse, dtype=_np.float64)

    def run_backward(q, k, v, out, lse, grad_out, dtype, causal, scale):
        grads = backward(to_user(q, dtype), to_user(k, dtype), to_user(v, dtype), to_user(out, dtype),
                         lse.astype(_np.float32), to_user(grad_out, dtype), **_options_of(causal, scale))
        return tuple(from_user(g, name) for g, name in zip(grads, ("dq", "dk", "dv")))

    return forward, None if backward is None else run_backward


# --- What the calls share ---------------------------------------------------------------------------

def _text(name, value):
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a name (a str), got {type(value).__name__}")
    return value


def _scale(scale):
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ValueError(f"scale must be a number or None (1/sqrt(head_dim)), got {type(scale).__name__}")
    return float(scale)


def _seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2^64), got {seed!r}")
    return seed


def _options(is_causal, causal_align, scale, dropout_p, seed):
    _text("causal_align", causal_align)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    return bool(is_causal), causal_align, _scale(scale), float(dropout_p), _seed(seed)


def _where(name, x):
    """("host", array) for NumPy arrays and host-memory DLPack tensors (read through NumPy), ("device", x)
    for DLPack tensors anywhere else (the library checks that they are in CUDA device memory); ValueError
    for anything else."""
    if isinstance(x, _np.ndarray):
        return "host", x
    if getattr(x, "requires_grad", False):
        raise ValueError(f"{name} requires grad: pass {name}.detach(), or use "
                         "flashlab.torch.scaled_dot_product_attention, which computes gradients through autograd")
    if not (hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")):
        raise ValueError(f"{name} must be a NumPy array or a DLPack tensor (PyTorch, CuPy), got {type(x).__name__}")
    if int(x.__dlpack_device__()[0]) != _DLPACK_CPU:
        return "device", x
    try:
        return "host", _np.from_dlpack(x)
    except (BufferError, TypeError, RuntimeError) as error:
        raise ValueError(f"{name} is in host memory but NumPy cannot read it ({error}): pass a NumPy array of "
                         "float64, float32 or float16") from None


def _inputs_in_one_place(**named):
    """("host" or "device", the inputs) when all are in one place, else ValueError naming two that are not."""
    places = {name: _where(name, x) for name, x in named.items()}
    (first, (first_place, _)), *rest = places.items()
    for name, (place, _) in rest:
        if place != first_place:
            describe = {"host": "in host memory", "device": "in device memory"}
            raise ValueError(f"{first} is {describe[first_place]} but {name} is {describe[place]}: pass every "
                             "tensor in one place (NumPy arrays, or tensors on one GPU)")
    return first_place, [x for _, x in places.values()]


def _capsules(*tensors):
    # The producer makes the legacy default stream wait for its pending work on each tensor.
    return [None if t is None else t.__dlpack__(stream=_LEGACY_DEFAULT_STREAM) for t in tensors]


def _given_buffers(given, names, argument):
    """The buffers passed for the results (None for each when none were), each a DLPack tensor."""
    if given is None:
        return (None,) * len(names)
    if not isinstance(given, (tuple, list)) or len(given) != len(names):
        raise ValueError(f"{argument} must be a tuple ({', '.join(names)}) of tensors in GPU memory")
    for name, buffer in zip(names, given):
        if not (hasattr(buffer, "__dlpack__") and hasattr(buffer, "__dlpack_device__")):
            raise ValueError(f"{argument}'s {name} must be a DLPack tensor in GPU memory, got {type(buffer).__name__}")
    return tuple(given)


def _refuse_out_on_host(given, argument):
    if given is not None:
        raise ValueError(f"{argument} takes buffers for results in GPU memory; with NumPy inputs the results are new "
                         "NumPy arrays")
