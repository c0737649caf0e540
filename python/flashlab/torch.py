"""flashlab.torch: FlashLab's variants inside PyTorch, with autograd, torch.compile and CUDA graphs.

    from flashlab.torch import scaled_dot_product_attention
    y = scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.1, is_causal=True)

scaled_dot_product_attention has the signature and the (batch, heads, seq, head_dim) layout of
torch.nn.functional.scaled_dot_product_attention, plus `variant` (default "auto": the fastest variant that runs the
problem here, as flashlab.explain says), `deterministic` (the backward sums dQ in a fixed order, bit-identical run to
run, where the variant has that mode) and `causal_align` ("top-left", PyTorch's is_causal, or "bottom-right", the
diagonal a prefill against a KV cache needs). An attn_mask is refused: no FlashLab variant takes an arbitrary mask.

On CUDA tensors the variants that run on a caller's stream (cuda-fa3-ws, cuda-fa2: variants()'s
"runs_on_caller_stream") are PyTorch operators, torch.ops.flashlab.attention (and attention_forward,
attention_backward), compiled into _flashlab_ops beside the module where FlashLab was built with PyTorch: their
kernels run on torch.cuda.current_stream() and the call returns without waiting, outputs and scratch come from
PyTorch's allocator, so a model that uses them compiles with torch.compile(fullgraph=True) and can be captured in a
CUDA graph. The output has q's memory layout, as SDPA's does (no copy where q is a (B, H, S, D) view of (B, S, H, D)
memory, as a transformer's projections make it). The other CUDA variants run through flashlab.attention (the legacy
default stream, and the call waits for its kernels); CPU tensors go to the CPU variants through NumPy.

Dropout draws its mask from a seed taken from PyTorch's default (CPU) generator on every call, as a Python integer
(torch.compile breaks its graph there), so torch.manual_seed makes a run repeatable; the mask is FlashLab's own (a
Philox draw per element), not PyTorch's, so the two drop different elements. A call with dropout inside CUDA graph
capture is refused with ValueError: the seed would be fixed at capture, and every replay would drop the same
elements. The PyTorch operators refuse it themselves too, so a graph that torch.compile's mode="reduce-overhead"
records, or a backward captured apart from its forward, gets the same sentence rather than one mask replayed.

fp8_attention is cuda-fa3-ws's FP8 forward on torch.float8_e4m3fn CUDA tensors with FlashAttention-3's
descales (one float32 per (batch, head)): O in bfloat16 and the LSE in float32, forward only.
"""
try:
    import torch
except ImportError as error:
    raise ImportError("flashlab.torch needs PyTorch, which this Python cannot import; the rest of flashlab "
                      "(flashlab.attention on NumPy arrays or DLPack tensors) works without it") from error

import os as _os

import flashlab as _flashlab

__all__ = ["scaled_dot_product_attention", "FlashLabAttention", "fp8_attention", "supports", "OPERATORS"]


def _load_operators():
    """Loads _flashlab_ops (torch.ops.flashlab.*) where the build made it; returns whether it did."""
    path = _os.path.join(_os.path.dirname(_flashlab._native.__file__), "_flashlab_ops.so")
    if not _os.path.exists(path):
        return False
    try:
        torch.ops.load_library(path)
    except OSError as error:
        raise ImportError(f"flashlab.torch cannot load its PyTorch operators {path} ({error}): they were built against "
                          f"another PyTorch than this one ({torch.__version__}); rebuild FlashLab with this Python") from None
    return True


# Whether torch.ops.flashlab.* is here: FlashLab was built with CUDA for a Python that has PyTorch.
OPERATORS = _load_operators()

# Dropout seeds are drawn below this bound (Philox keys are 64-bit; torch.randint's bound is an int64).
_SEED_BOUND = 2**62
# PyTorch's 8-bit float dtypes (those this PyTorch has).
_FLOAT8 = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
                if hasattr(torch, name))


def _kernel_layout(x):
    """x, (batch, heads, seq, head_dim), as a view of (batch, seq, heads, head_dim) memory: the layout the
    kernels read in place. No copy when x already is one (as q.view(B, T, H, D).transpose(1, 2) is)."""
    if x.dim() != 4:
        return x  # refused by flashlab with the sentence about 4-d inputs
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def _from_torch(x):
    """What flashlab reads: CUDA tensors as they are (DLPack), CPU tensors through NumPy."""
    return x.detach() if x.is_cuda else x.detach().numpy()


def _like_kernel_layout(x):
    """An empty tensor shaped and typed like x, (batch, heads, seq, head_dim), in (B, S, H, D) memory: what
    the kernels write. PyTorch's caching allocator provides it, so a call allocates nothing itself."""
    b, h, s, d = x.shape
    return torch.empty(b, s, h, d, dtype=x.dtype, device=x.device).transpose(1, 2)


def _forward(q, k, v, options):
    """(o, lse) as tensors on q's device: written in place on a GPU, copied from NumPy on the CPU."""
    inputs = [_from_torch(x) for x in (q, k, v)]
    if not q.is_cuda:
        return tuple(torch.from_numpy(r) for r in _flashlab.attention(*inputs, return_lse=True, **options))
    if q.dim() != 4:  # refused by flashlab, with its sentence about 4-d inputs
        return _flashlab.attention(*inputs, return_lse=True, **options)
    b, h, s, _ = q.shape
    out = (_like_kernel_layout(q), torch.empty(b, h, s, dtype=torch.float32, device=q.device))
    return _flashlab.attention(*inputs, return_lse=True, out=out, **options)


def _backward(q, k, v, o, lse, grad_out, options):
    inputs = [_from_torch(x) for x in (q, k, v, o, lse, grad_out)]
    if not q.is_cuda:
        return tuple(torch.from_numpy(g) for g in _flashlab.attention_backward(*inputs, **options))
    grads_out = tuple(_like_kernel_layout(x) for x in (q, k, v))
    return _flashlab.attention_backward(*inputs, grads_out=grads_out, **options)


class FlashLabAttention(torch.autograd.Function):
    """Attention through a FlashLab variant, with its backward pass, for autograd.

    FlashLabAttention.apply(q, k, v, variant, is_causal, causal_align, scale, dropout_p, seed, deterministic)
    with q, k, v (batch, heads, seq, head_dim) returns O like q. The forward saves q, k, v, O and the LSE;
    the backward runs the variant's backward pass (the same dropout mask, from the same seed), with dQ
    summed in a fixed order when deterministic is True (flashlab.attention_backward's deterministic).
    """

    @staticmethod
    def forward(ctx, q, k, v, variant, is_causal, causal_align, scale, dropout_p, seed, deterministic):
        q, k, v = (_kernel_layout(x) for x in (q, k, v))
        ctx.options = dict(variant=variant, is_causal=is_causal, causal_align=causal_align, scale=scale,
                           dropout_p=dropout_p, seed=seed, layout="bhsd")
        ctx.deterministic = deterministic  # the backward's alone: the forward takes no such option
        o, lse = _forward(q, k, v, ctx.options)
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, o, lse = ctx.saved_tensors
        options = dict(ctx.options, deterministic=ctx.deterministic)
        dq, dk, dv = _backward(q, k, v, o, lse, _kernel_layout(grad_out), options)
        return dq, dk, dv, None, None, None, None, None, None, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, variant="auto", deterministic=False, causal_align="top-left"):
    """torch.nn.functional.scaled_dot_product_attention computed by a FlashLab variant ("auto": the first of
    flashlab.AUTO_ORDER that runs this problem here, forward and, where the inputs require grad, backward).

    query (B, H_q, S_q, D), key and value (B, H_kv, S_k, D); returns (B, H_q, S_q, D), laid out in memory as query
    is. is_causal masks with the top-left diagonal, as PyTorch does; causal_align="bottom-right" aligns it to the
    last key (query i sees keys j <= i + S_k - S_q), as a prefill against a KV cache needs. H_q != H_kv needs
    enable_gqa=True, as in PyTorch. attn_mask must be None. deterministic=True makes the backward sum dQ in a fixed
    order, so gradients are bit-identical run to run; a variant whose backward adds dQ with atomics (cuda-fa2 among
    them: flashlab.variants()'s "deterministic" says which) refuses it with ValueError when the backward runs.
    """
    # Each of the tensors' attributes is read once: this runs on every layer's call, and a read costs the host about
    # 0.1 µs. A call of a kind seen before (below) goes straight to the operator: every check that follows depends on
    # nothing but the key's fields, and passed for them the first time.
    dtype, q_shape, k_shape = query.dtype, query.shape, key.shape
    backward = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    kind = None
    if (attn_mask is None and len(q_shape) == 4 and len(k_shape) == 4 and value.dim() == 4
            and not torch.compiler.is_compiling()):
        kind = (variant, dtype, query.device, q_shape[1], k_shape[1], q_shape[3], is_causal, enable_gqa, dropout_p,
                backward, deterministic, causal_align)
        name = _OPERATOR_CALLS.get(kind)
        if name is not None:
            return _OPERATOR(query, key, value, name, bool(is_causal), causal_align == "bottom-right", scale, 0.0, 0,
                             bool(deterministic))
    if dtype in _FLOAT8:
        raise ValueError(f"query is {dtype}: scaled_dot_product_attention takes no descales and FlashLab has no "
                         "FP8 backward; for float8_e4m3fn use flashlab.torch.fp8_attention(q, k, v, q_descale, "
                         "k_descale, v_descale), the FP8 forward")
    if attn_mask is not None:
        raise ValueError("attn_mask is not supported: no FlashLab variant takes an arbitrary mask; pass "
                         "is_causal=True for a causal one, or use torch.nn.functional.scaled_dot_product_attention")
    if len(q_shape) != 4 or len(k_shape) != 4 or value.dim() != 4:
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dim() != 4:  # (the sentence flashlab.attention says)
                raise ValueError(f"{name} has shape {tuple(x.shape)} but inputs must be 4-d, in layout "
                                 "(batch, heads, seq, head_dim)")
    if q_shape[1] != k_shape[1] and not enable_gqa:
        raise ValueError(f"query has {q_shape[1]} heads and key {k_shape[1]}: pass enable_gqa=True for "
                         "grouped-query attention, as PyTorch's scaled_dot_product_attention asks")
    if causal_align != "top-left" and causal_align != "bottom-right":
        raise ValueError(f"causal_align is top-left or bottom-right, not {causal_align!r}")
    name = variant
    if variant == "auto":
        name, refusal = _auto_of(query, key, value, dtype, q_shape, k_shape, is_causal, dropout_p, backward,
                                 deterministic)
        if name is None:
            raise ValueError(refusal)
    if kind is not None and dropout_p == 0 and query.is_cuda and _is_operator(name):
        _OPERATOR_CALLS[kind] = name  # (with dropout, each call draws its own seed)
    return _attend(query, key, value, name, is_causal, causal_align, scale, dropout_p, deterministic)


# The calls that went to torch.ops.flashlab.attention, by what decided that: (variant asked for, dtype, device, heads_q,
# heads_kv, head_dim, is_causal, enable_gqa, dropout_p, backward needed, deterministic, causal_align) -> the variant
# run. Sequence lengths play no part, so the table stays as small as a model's kinds of attention call.
_OPERATOR_CALLS = {}
_OPERATOR = torch.ops.flashlab.attention.default if OPERATORS else None


def _needs_backward(query, key, value):
    """Whether autograd will run the backward of an attention of these tensors."""
    return torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)


def _auto_of(query, key, value, dtype, q_shape, k_shape, is_causal, dropout_p, backward, deterministic):
    """(variant, "") that variant="auto" runs for these checked 4-d tensors, or (None, the sentence why none can), for
    a caller that has read their dtype and shapes. Under torch.compile, _auto's result is folded into the graph.
    Outside it, the answer is kept by the tensors' own dtype and device objects, so that a repeated call builds no
    _problem_key (its strings and conversions cost about 2 µs of host time)."""
    if torch.compiler.is_compiling():
        return _auto(*_problem_key(query, key, value, is_causal, dropout_p, backward, deterministic))
    kind = (dtype, query.device, q_shape[1], k_shape[1], q_shape[3], is_causal, dropout_p, backward, deterministic)
    choice = _AUTO_BY_TENSORS.get(kind)
    if choice is None:
        choice = _AUTO_BY_TENSORS[kind] = _auto(*_problem_key(query, key, value, is_causal, dropout_p, backward,
                                                              deterministic))
    return choice


_AUTO_BY_TENSORS = {}


def _attend(query, key, value, variant, is_causal, causal_align, scale, dropout_p, deterministic):
    """The attention of a checked call, by a named variant: the PyTorch operator where there is one, else the
    autograd Function over flashlab.attention."""
    seed = 0
    if dropout_p > 0:
        # (Under torch.compile this Python runs while tracing, when nothing is captured: not asked there.)
        if query.is_cuda and not torch.compiler.is_compiling() and torch.cuda.is_current_stream_capturing():
            raise ValueError(f"dropout_p={dropout_p} inside CUDA graph capture is not supported: FlashLab's dropout "
                             "seed is drawn on the host, so every replay of the graph would drop the same elements; "
                             "capture with dropout_p=0, or make this call outside the graph")
        seed = int(torch.randint(_SEED_BOUND, (1,)).item())
    if query.is_cuda and _is_operator(variant):
        return torch.ops.flashlab.attention.default(query, key, value, variant, bool(is_causal),
                                                    causal_align == "bottom-right", scale, float(dropout_p), seed,
                                                    bool(deterministic))
    return FlashLabAttention.apply(query, key, value, variant, bool(is_causal), causal_align, scale, float(dropout_p),
                                   seed, bool(deterministic))


def supports(query, key, value, *, is_causal=False, dropout_p=0.0, backward=False, deterministic=False):
    """None when variant="auto" finds a FlashLab variant for this problem here, else the one sentence saying why not
    (flashlab.explain's refusal). Only the tensors' shapes, dtypes and device are read."""
    return _choice(query, key, value, is_causal, dropout_p, backward, deterministic)[1] or None


def _choice(query, key, value, is_causal, dropout_p, backward, deterministic=False):
    """supports() as (variant, "") or (None, the sentence): what a caller that goes on to _attend needs."""
    dtype, q_shape, k_shape = query.dtype, query.shape, key.shape
    if dtype in _FLOAT8 or len(q_shape) != 4 or len(k_shape) != 4 or value.dim() != 4:
        return None, ("FlashLab's scaled_dot_product_attention takes 4-d float16, bfloat16 or float32 tensors "
                      "(B, H, S, D)")
    return _auto_of(query, key, value, dtype, q_shape, k_shape, is_causal, dropout_p, backward, deterministic)


def _problem_key(query, key, value, is_causal, dropout_p, backward, deterministic):
    """What auto's choice depends on, as constants (torch.compile folds _auto's result; the sequence lengths, which
    it may treat as symbols, play no part)."""
    return (query.device.type, query.device.index, str(query.dtype).removeprefix("torch."), int(query.shape[1]),
            int(key.shape[1]), int(query.shape[-1]), bool(is_causal), float(dropout_p), bool(backward),
            bool(deterministic))


@torch.compiler.assume_constant_result
def _auto(device_type, device_index, dtype, heads_q, heads_kv, head_dim, is_causal, dropout_p, backward, deterministic):
    """(variant, "") that variant="auto" runs, or (None, the sentence why none can); one explain per problem kind."""
    kind = (device_type, device_index, dtype, heads_q != heads_kv, head_dim, is_causal, dropout_p > 0, backward,
            deterministic)
    if kind not in _AUTO_CHOICES:
        device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
        # explain reads shapes, dtypes and place alone: tensors of one row stand for the problem.
        q, k = (torch.empty((1, heads, 1, head_dim), dtype=getattr(torch, dtype), device=device)
                for heads in (heads_q, heads_kv))
        explanation = _flashlab.explain(q, k, k, is_causal=is_causal, dropout_p=dropout_p, backward=backward,
                                        deterministic=deterministic, layout="bhsd")
        _AUTO_CHOICES[kind] = (explanation.choice, explanation.refusal)
    return _AUTO_CHOICES[kind]


_AUTO_CHOICES = {}


@torch.compiler.assume_constant_result
def _is_operator(variant):
    """Whether variant runs as torch.ops.flashlab.attention (a variant that runs on a caller's stream, and the
    operators are built), rather than through flashlab.attention."""
    if variant not in _OPERATOR_VARIANTS:
        row = next((r for r in _flashlab.variants() if r["name"] == variant), None)
        _OPERATOR_VARIANTS[variant] = OPERATORS and row is not None and row["runs_on_caller_stream"]
    return _OPERATOR_VARIANTS[variant]


_OPERATOR_VARIANTS = {}


def fp8_attention(q, k, v, q_descale=None, k_descale=None, v_descale=None, *, is_causal=False,
                  causal_align="top-left", scale=None, layout="bhsd", variant="cuda-fa3-ws"):
    """The FP8 forward of cuda-fa3-ws on e4m3 tensors: returns (O, LSE), O bfloat16 shaped and laid out like q, the
    LSE (B, H_q, S_q) float32 (natural log, of the real scores; -inf for a row that sees no key).

    q, k, v: CUDA tensors of torch.float8_e4m3fn, (B, H, S, D) as scaled_dot_product_attention takes them, or
    (B, S, H, D) with layout="bshd" as FlashAttention-3's flash_attn_func does; H_q a multiple of H_kv, D one of
    the FP8 head dims (flashlab.variants()). q_descale (B, H_q), k_descale and v_descale (B, H_kv): float32 CUDA
    tensors on the same GPU, one factor per (batch, head) that maps the stored e4m3 values back to the real ones
    (value = e4m3 value x descale), as in FlashAttention-3's interface; all three are required (pass ones for
    tensors stored unscaled). is_causal masks with the top-left diagonal by default, as PyTorch does
    (causal_align="bottom-right": FlashAttention's); scale: the softmax scale, None for 1/sqrt(D).

    Forward only (there is no FP8 backward; tensors that require grad are refused), no dropout. As the bf16 path,
    it is a PyTorch operator, torch.ops.flashlab.fp8_attention_forward, where FlashLab's operators are built
    (OPERATORS): its kernels run on torch.cuda.current_stream() and the call returns without waiting for them, O, the
    LSE and the kernels' scratch come from PyTorch's caching allocator, and it has a Meta implementation, so a call
    can be captured in a CUDA graph and compiled with torch.compile(fullgraph=True). The tensors are read in place
    where their memory is contiguous (B, S, H, D) rows (a (B, H, S, D) tensor that is not a transposed view of such
    memory is copied into rows first). Without the operators it runs through flashlab.attention, on the legacy
    default stream, and returns when the kernels have finished.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of float8_e4m3fn, got {type(x).__name__}")
        if x.dtype != getattr(torch, "float8_e4m3fn", None):
            raise ValueError(f"{name} is {x.dtype}: fp8_attention takes torch.float8_e4m3fn tensors with their "
                             "descales; for float16 and bfloat16 use scaled_dot_product_attention")
        if not x.is_cuda:
            raise ValueError(f"{name} is on the {x.device.type}: the FP8 forward runs on a CUDA GPU; for values in "
                             "host memory use flashlab.attention(q, k, v, dtype='e4m3'), which quantizes them per head")
        if x.requires_grad:
            raise ValueError(f"{name} requires grad, but FlashLab has no FP8 backward (FlashAttention-3 ships none "
                             f"either): pass {name}.detach(), or run in bfloat16 for gradients")
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout is bhsd or bshd, not {layout!r}")
    descales_given = (isinstance(q_descale, torch.Tensor) and isinstance(k_descale, torch.Tensor)
                      and isinstance(v_descale, torch.Tensor))
    if OPERATORS and _is_operator(variant) and q.dim() == k.dim() == v.dim() == 4 and descales_given:
        # The operator takes (B, H, S, D): for bshd, views of the caller's (B, S, H, D) memory, read in place. O comes
        # back laid out as the q it was given, so turned back it is laid out as the caller's q. A missing descale, or
        # inputs that are not 4-d, go through _fp8_through_module, to flashlab.attention's sentence.
        if causal_align not in ("top-left", "bottom-right"):
            raise ValueError(f"causal_align is top-left or bottom-right, not {causal_align!r}")
        if layout == "bshd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        o, lse = torch.ops.flashlab.fp8_attention_forward.default(
            q, k, v, q_descale, k_descale, v_descale, variant, bool(is_causal), causal_align == "bottom-right",
            _flashlab._scale(scale))
        return (o.transpose(1, 2) if layout == "bshd" else o), lse
    return _fp8_through_module(q, k, v, q_descale, k_descale, v_descale, variant=variant, is_causal=is_causal,
                               causal_align=causal_align, scale=scale, layout=layout)


def _fp8_through_module(q, k, v, q_descale, k_descale, v_descale, *, variant, is_causal, causal_align, scale, layout):
    """fp8_attention through flashlab.attention (DLPack, the legacy default stream; the call waits): where the
    operators are not built, and for what the operator does not take (its sentences are flashlab.attention's)."""
    # The bytes go over DLPack as uint8 (the same memory, viewed): a PyTorch whose DLPack has no float8 exports them
    # too, and dtype="e4m3" tells flashlab what they hold.
    inputs = [x.view(torch.uint8) if layout == "bshd" else _kernel_layout(x.view(torch.uint8)) for x in (q, k, v)]
    options = dict(variant=variant, is_causal=is_causal, causal_align=causal_align, scale=scale, layout=layout,
                   dtype="e4m3", q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, return_lse=True)
    if q.dim() != 4:  # refused by flashlab, with its sentence about 4-d inputs
        return _flashlab.attention(*inputs, **options)
    if layout == "bhsd":
        b, h, s, d = q.shape
        o = torch.empty(b, s, h, d, dtype=torch.bfloat16, device=q.device).transpose(1, 2)
    else:
        b, s, h, d = q.shape
        o = torch.empty(b, s, h, d, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(b, h, s, dtype=torch.float32, device=q.device)
    return _flashlab.attention(*inputs, out=(o, lse), **options)
