"""FlashLab's PyTorch operators (torch.ops.flashlab.*, python/torch_ops.cpp) on a CUDA device (CTest label gpu;
run_pytest.py reports the suite as skipped where there is none):
  * they are there wherever FlashLab was built with CUDA for a Python with PyTorch, and flashlab.torch routes the
    variants that run on a caller's stream through them, variant="auto" included; a repeated call of one kind goes
    straight to the operator, with the first call's results and checks;
  * torch.library.opcheck passes: schemas, fake (Meta) implementations, the autograd registration, AOT dispatch;
  * the kernels run on torch.cuda.current_stream() and the call returns without waiting for them;
  * a forward and backward captured in a CUDA graph replay on new inputs to the eager results; dropout inside a
    capture is refused, since its host-drawn seed would repeat the same mask on every replay;
  * torch.compile(fullgraph=True) and mode="reduce-overhead" compile a model that uses them, with the eager results;
  * the outputs have the strides SDPA's outputs have, for both memory layouts of q;
  * bad input is one ValueError sentence through the operator;
  * the FP8 forward, torch.ops.flashlab.fp8_attention_forward (flashlab.torch.fp8_attention): the same bits as
    flashlab.attention's path, on the current stream without waiting, replayed from a CUDA graph, compiled, opcheck, and
    its sentences for bad descales and dtypes.
"""
import functools
import re

import pytest
import torch
import torch.nn.functional as F

import flashlab
import flashlab.torch as ft

assert torch.cuda.is_available(), ("this PyTorch has no CUDA, but the machine has a CUDA device: the GPU suite "
                                   "needs PyTorch with CUDA")
CUDA = torch.device("cuda")
ROWS = {row["name"]: row for row in flashlab.variants()}
ON_STREAM = [name for name, row in ROWS.items() if row["runs_on_caller_stream"] and row["backward"]]


def require_available(name):
    if not ROWS[name]["available"]:
        pytest.skip(f"{name} needs compute capability {ROWS[name]['needs_compute_capability'] / 10:.1f}; this GPU "
                    f"is {flashlab.cuda_device_name()}")


def host(x):
    x = x.detach()
    return (x.float() if x.dtype == torch.bfloat16 else x).cpu().numpy()


def bshd_memory(b, h, s, d, dtype=torch.bfloat16, seed=0):
    """(B, H, S, D) views of (B, S, H, D) memory, as a transformer's projections give them."""
    torch.manual_seed(seed)
    return torch.randn(b, s, h, d, device=CUDA, dtype=dtype).transpose(1, 2)


def within_rule(mine, baseline, exact, quantity, dtype="bf16"):
    result = flashlab.within_tolerance(host(mine), host(exact), dtype=dtype, lowp=host(baseline), quantity=quantity)
    return result["passes"], result


def sdpa_gqa(q, k, v, is_causal=False):
    groups = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1),
                                          is_causal=is_causal)


def test_the_operators_are_built_and_carry_the_stream_variants():
    assert ft.OPERATORS, "FlashLab was built with CUDA for this Python, which has PyTorch: _flashlab_ops must be there"
    assert {"cuda-fa2", "cuda-fa3-ws"} <= {name for name, row in ROWS.items() if row["runs_on_caller_stream"]}
    assert not ROWS["cuda-naive"]["runs_on_caller_stream"]
    for op in ("attention", "attention_forward", "attention_backward", "fp8_attention_forward"):
        assert hasattr(torch.ops.flashlab, op)


@pytest.mark.parametrize("variant", ON_STREAM)
def test_opcheck(variant):
    require_available(variant)
    q, k, v = (bshd_memory(2, 4, 130, 64, seed=s) for s in range(3))
    args = (variant, True, False, None, 0.0, 0)
    torch.library.opcheck(torch.ops.flashlab.attention_forward.default, (q, k, v, *args))
    out, lse = torch.ops.flashlab.attention_forward(q, k, v, *args)
    d_o = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashlab.attention_backward.default, (d_o, q, k, v, out, lse, *args, False))
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    torch.library.opcheck(torch.ops.flashlab.attention.default, (*leaves, *args, False))


@pytest.mark.parametrize("variant", ON_STREAM)
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_operator_forward_and_backward_match_pytorch_with_gqa_and_both_diagonals(variant, align):
    require_available(variant)
    q = bshd_memory(2, 8, 200, 128, seed=1)
    k, v = (bshd_memory(2, 2, 333, 128, seed=s) for s in (2, 3))
    grad_out = torch.randn_like(q)
    offset = 333 - 200 if align == "bottom-right" else 0
    mask = torch.ones(200, 333, dtype=torch.bool, device=CUDA).tril(offset)

    def theirs(q, k, v):
        groups = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1),
                                              attn_mask=mask)

    def grads(attend, *inputs):
        leaves = [x.detach().requires_grad_() for x in inputs]
        out = attend(*leaves)
        return (out, *torch.autograd.grad(out, leaves, grad_out.to(out.dtype)))

    ours = grads(functools.partial(ft.scaled_dot_product_attention, is_causal=True, enable_gqa=True, variant=variant,
                                   causal_align=align), q, k, v)
    baseline = grads(theirs, q, k, v)
    exact = grads(theirs, *(x.double() for x in (q, k, v)))
    for name, mine, low, ref in zip(("O", "dQ", "dK", "dV"), ours, baseline, exact):
        passes, result = within_rule(mine, low, ref, "forward" if name == "O" else "gradient")
        assert passes, (name, result)


def test_auto_goes_through_the_operator_and_says_which_variant():
    require_available("cuda-fa3-ws")
    q, k, v = (bshd_memory(1, 4, 256, 64, seed=s) for s in range(3))
    traced = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with traced:
        ft.scaled_dot_product_attention(q, k, v, is_causal=True)
    names = {event.name for event in traced.events()}
    assert "flashlab::attention" in names, sorted(names)[:20]
    assert ft.supports(q, k, v, is_causal=True) is None
    wide = torch.empty(1, 4, 8, 320, device=CUDA, dtype=torch.bfloat16)  # no variant takes head dim 320
    assert "finds no variant" in ft.supports(wide, wide, wide)


def test_a_repeated_call_goes_straight_to_the_operator_with_the_first_calls_results_and_checks():
    require_available("cuda-fa3-ws")
    q, k, v = (bshd_memory(1, 8, 300, 64, seed=s) for s in range(3))
    kv = [x[:, :2].contiguous() for x in (k, v)]  # 2 K/V heads: grouped-query

    def direct(query):  # the operator itself, with what auto picks here
        return torch.ops.flashlab.attention(query, *kv, "cuda-fa3-ws", True, False, None, 0.0, 0, False)

    first = ft.scaled_dot_product_attention(q, *kv, is_causal=True, enable_gqa=True)
    again, names = ops_run(lambda: ft.scaled_dot_product_attention(q, *kv, is_causal=True, enable_gqa=True))
    assert "flashlab::attention" in names and torch.equal(first, again) and torch.equal(again, direct(q))
    assert first.grad_fn is None and again.grad_fn is None  # (no input requires grad)
    assert "cuda-fa3-ws" in ft._OPERATOR_CALLS.values()  # the kind was kept for the calls after the first
    # What the first call checked is checked again wherever the kind differs.
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        ft.scaled_dot_product_attention(q, *kv, is_causal=True)
    with pytest.raises(ValueError, match="attn_mask is not supported"):
        ft.scaled_dot_product_attention(q, *kv, attn_mask=torch.ones(300, 300, dtype=torch.bool, device=CUDA),
                                        is_causal=True, enable_gqa=True)
    with pytest.raises(ValueError, match="causal_align is top-left or bottom-right"):
        ft.scaled_dot_product_attention(q, *kv, is_causal=True, enable_gqa=True, causal_align="diagonal")
    with pytest.raises(ValueError, match="query has shape"):
        ft.scaled_dot_product_attention(q[0], *kv, is_causal=True, enable_gqa=True)
    # Other sequence lengths are the same kind; a query that requires grad is another (the backward is needed).
    shorter = ft.scaled_dot_product_attention(q[:, :, :100], *kv, is_causal=True, enable_gqa=True)
    assert torch.equal(shorter, direct(q[:, :, :100]))
    # The diagonal is part of the kind: bottom-right (query i sees keys up to i + 200) is not the cached top-left.
    right = ft.scaled_dot_product_attention(q[:, :, :100], *kv, is_causal=True, enable_gqa=True,
                                            causal_align="bottom-right")
    assert torch.equal(right, torch.ops.flashlab.attention(q[:, :, :100], *kv, "cuda-fa3-ws", True, True, None, 0.0,
                                                           0, False))
    assert not torch.equal(right, shorter)
    leaf = q.detach().requires_grad_()
    out = ft.scaled_dot_product_attention(leaf, *kv, is_causal=True, enable_gqa=True)
    assert out.grad_fn is not None and torch.equal(out.detach(), first)
    out.sum().backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()


def test_kernels_run_on_the_current_stream_and_the_call_does_not_wait():
    require_available("cuda-fa3-ws")
    q0, k, v = (bshd_memory(2, 8, 1024, 128, seed=s) for s in range(3))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keeps the side stream busy for a while
        q = q0 * 1.0  # written on the side stream after the sleep: a kernel on another stream would read it too soon
        out = ft.scaled_dot_product_attention(q, k, v, is_causal=True, variant="cuda-fa3-ws")
        busy_after_call = not side.query()
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    side.synchronize()
    assert busy_after_call, "the call waited for the side stream's work: it must only queue its kernels there"
    exact = F.scaled_dot_product_attention(q0.double(), k.double(), v.double(), is_causal=True)
    passes, result = within_rule(out, ref, exact, "forward")
    assert passes, result


def captured_in_a_graph(step):
    """step() captured in a CUDA graph, after two warm-up calls on a side stream as PyTorch asks: (the graph, the
    tensors the captured call returned, which each replay rewrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    return graph, captured


def test_forward_and_backward_replay_from_a_cuda_graph():
    require_available("cuda-fa3-ws")
    static = [bshd_memory(2, 8, 512, 64, seed=s).detach().requires_grad_() for s in range(3)]
    grad_out = torch.randn(2, 512, 8, 64, device=CUDA, dtype=torch.bfloat16).transpose(1, 2)

    def step():
        out = ft.scaled_dot_product_attention(*static, is_causal=True, variant="cuda-fa3-ws")
        return (out, *torch.autograd.grad(out, static, grad_out))

    graph, captured = captured_in_a_graph(step)
    fresh = [bshd_memory(2, 8, 512, 64, seed=10 + s) for s in range(3)]
    with torch.no_grad():
        for x, new in zip(static, fresh):
            x.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    for name, replayed, want in zip(("O", "dQ", "dK", "dV"), captured, eager):
        assert torch.equal(replayed, want), name  # the same kernels on the same inputs: bit-identical


def test_dropout_inside_a_cuda_graph_capture_is_one_sentence():
    require_available("cuda-fa3-ws")
    q, k, v = (bshd_memory(1, 4, 256, 64, seed=s) for s in range(3))
    graph = torch.cuda.CUDAGraph()
    refusal = r"^dropout_p=0\.1 inside CUDA graph capture is not supported: .* drop the same elements"
    with pytest.raises(ValueError, match=refusal):
        with torch.cuda.graph(graph):
            ft.scaled_dot_product_attention(q, k, v, dropout_p=0.1, variant="cuda-fa3-ws")
    # The stream captures no more, and the same call outside a graph runs, with dropout.
    assert not torch.cuda.is_current_stream_capturing()
    out = ft.scaled_dot_product_attention(q, k, v, dropout_p=0.1, variant="cuda-fa3-ws")
    assert out.shape == q.shape and torch.isfinite(out).all()


def test_dropout_under_reduce_overhead_never_replays_one_mask():
    # torch.compile's mode="reduce-overhead" records CUDA graphs of what it compiled, and flashlab.torch's own capture
    # check does not run in compiled code. Either the operator refuses inside the recording with its one sentence,
    # or each call drops different elements: never the same mask replayed.
    require_available("cuda-fa3-ws")
    q, k, v = (bshd_memory(1, 4, 256, 64, seed=s) for s in range(3))
    attend = torch.compile(lambda q, k, v: ft.scaled_dot_product_attention(q, k, v, dropout_p=0.1,
                                                                          variant="cuda-fa3-ws"),
                           mode="reduce-overhead")
    outs = []
    try:
        for _ in range(4):  # warm-up, recording, replays
            outs.append(attend(q, k, v).clone())
    except ValueError as e:
        assert str(e).startswith("dropout inside CUDA graph capture is not supported: "), str(e)
        assert not torch.cuda.is_current_stream_capturing()
        print("reduce-overhead with dropout: refused inside the recording")
        return
    print("reduce-overhead with dropout: ran, each call with its own mask")
    for a, b in zip(outs, outs[1:]):
        assert not torch.equal(a, b), "two calls with dropout gave the same output: one mask replayed"


def test_dropout_backward_captured_apart_from_its_forward_is_one_sentence():
    require_available("cuda-fa3-ws")
    q, k, v = (bshd_memory(1, 4, 256, 64, seed=s).detach().requires_grad_() for s in range(3))
    # The forward runs on the stream that will capture, so that autograd runs its backward there (as a captured
    # training step's warm-up does), outside the graph.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = ft.scaled_dot_product_attention(q, k, v, dropout_p=0.1, variant="cuda-fa3-ws")
        grad = torch.ones_like(out)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match=r"^dropout inside CUDA graph capture is not supported: .* same elements"):
        with torch.cuda.graph(graph, stream=side):
            torch.autograd.grad(out, (q, k, v), grad)
    assert not torch.cuda.is_current_stream_capturing()
    torch.cuda.current_stream().wait_stream(side)


class TinyAttentionModel(torch.nn.Module):
    """Projections, FlashLab's attention (GQA 4/2), an output projection: what a transformer block asks of it."""

    def __init__(self, dim=256, heads=4, heads_kv=2):
        super().__init__()
        self.heads, self.heads_kv, self.head_dim = heads, heads_kv, dim // heads
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * heads_kv * self.head_dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.heads_kv, self.head_dim).unbind(2)
        y = ft.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_fullgraph_matches_eager_forward_and_backward(mode):
    require_available("cuda-fa3-ws")
    torch.manual_seed(0)
    model = TinyAttentionModel().to(CUDA, torch.bfloat16)
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    for step in range(3):  # reduce-overhead records its CUDA graph after the first calls
        x = torch.randn(2, 384, 256, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
        eager_out = model(x)
        eager_grads = torch.autograd.grad(eager_out.float().square().sum(), [x, *model.parameters()])
        out = compiled(x)
        grads = torch.autograd.grad(out.float().square().sum(), [x, *model.parameters()])
        torch.testing.assert_close(out, eager_out, atol=2e-2, rtol=2e-2)
        for got, want in zip(grads, eager_grads):
            torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("layout", ["bshd-memory", "contiguous"])
def test_output_strides_are_sdpas(layout):
    require_available("cuda-fa3-ws")
    q, k, v = (bshd_memory(2, 4, 256, 64, seed=s) for s in range(3))
    if layout == "contiguous":
        q, k, v = (x.contiguous() for x in (q, k, v))
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    ours = ft.scaled_dot_product_attention(*leaves, variant="cuda-fa3-ws")
    theirs = F.scaled_dot_product_attention(q, k, v)
    assert ours.shape == theirs.shape and ours.stride() == theirs.stride(), (ours.stride(), theirs.stride())
    grads = torch.autograd.grad(ours, leaves, torch.randn_like(ours))
    for g, x in zip(grads, (q, k, v)):
        assert g.stride() == x.stride()


def test_bad_input_is_one_value_error_through_the_operator():
    require_available("cuda-fa3-ws")
    q = bshd_memory(1, 4, 64, 48)
    with pytest.raises(ValueError, match="head_dim 48"):
        torch.ops.flashlab.attention(q, q, q, "cuda-fa3-ws", False, False, None, 0.0, 0, False)
    with pytest.raises(ValueError, match="runs on the legacy default stream"):
        torch.ops.flashlab.attention_forward(q, q, q, "cuda-naive", False, False, None, 0.0, 0)
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        x = torch.zeros(1, 4, 64, 64, device=CUDA, dtype=torch.int32)
        torch.ops.flashlab.attention(x, x, x, "cuda-fa3-ws", False, False, None, 0.0, 0, False)
    with pytest.raises(ValueError, match="causal_align is top-left or bottom-right"):
        ft.scaled_dot_product_attention(q, q, q, is_causal=True, causal_align="diagonal")


# --- the FP8 forward: torch.ops.flashlab.fp8_attention_forward ------------------------------------------------------

FP8 = "cuda-fa3-ws"


def quantized(x):
    """x (B, H, S, D) in e4m3 with one descale per (batch, head), as FlashAttention-3's users make them: a head's
    largest magnitude maps to 448, e4m3's largest finite value. Returns (e4m3 laid out as x is, float32 (B, H))."""
    descale = x.float().abs().amax(dim=(2, 3)) / 448.0
    return (x.float() / descale[:, :, None, None]).to(torch.float8_e4m3fn), descale.contiguous()


def fp8_inputs(b, hq, hkv, sq, sk, d, seed):
    """(q, k, v, q_descale, k_descale, v_descale): e4m3 (B, H, S, D) views of (B, S, H, D) memory and their descales."""
    (q, qd), (k, kd), (v, vd) = (quantized(bshd_memory(b, h, s, d, seed=seed + i))
                                 for i, (h, s) in enumerate(((hq, sq), (hkv, sk), (hkv, sk))))
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))  # (a copy only if not already)
    return q, k, v, qd, kd, vd


def ops_run(call):
    """The names of the operators a call went through, from PyTorch's profiler."""
    traced = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with traced:
        result = call()
    return result, {event.name for event in traced.events()}


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_operator_gives_the_bits_of_the_flashlab_attention_path(layout, d):
    require_available(FP8)
    assert d in ROWS[FP8]["e4m3_head_dim_values"]
    q, k, v, qd, kd, vd = fp8_inputs(2, 8, 2, 200, 333, d, seed=d)  # GQA 8/2, causal, seq_q != seq_k
    if layout == "bshd":  # FlashAttention-3's layout: contiguous (B, S, H, D)
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        assert q.is_contiguous()
    (o, lse), names = ops_run(lambda: ft.fp8_attention(q, k, v, qd, kd, vd, is_causal=True, layout=layout))
    assert "flashlab::fp8_attention_forward" in names, sorted(names)[:20]
    o_ref, lse_ref = ft._fp8_through_module(q, k, v, qd, kd, vd, variant=FP8, is_causal=True, causal_align="top-left",
                                             scale=None, layout=layout)
    assert o.dtype == torch.bfloat16 and o.shape == q.shape and o.stride() == q.stride(), (o.shape, o.stride())
    assert lse.dtype == torch.float32 and lse.shape == (2, 8, 200) and lse.is_contiguous()
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()  # top-left, seq_q <= seq_k: every row sees a key
    # The same kernel on the same bytes and descales: the same bits.
    assert torch.equal(o, o_ref)
    assert torch.equal(lse, lse_ref)


def test_fp8_kernels_run_on_the_current_stream_and_the_call_does_not_wait():
    require_available(FP8)
    q0, k, v, qd0, kd, vd = fp8_inputs(2, 8, 2, 1024, 1024, 128, seed=3)
    want_o, want_lse = ft.fp8_attention(q0, k, v, qd0, kd, vd, is_causal=True)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keeps the side stream busy for a while
        # Written on the side stream after the sleep: a kernel on another stream would read them too soon.
        q, qd = q0.clone(), qd0.clone()
        o, lse = ft.fp8_attention(q, k, v, qd, kd, vd, is_causal=True)
        busy_after_call = not side.query()
    side.synchronize()
    assert busy_after_call, "the call waited for the side stream's work: it must only queue its kernels there"
    assert torch.equal(o, want_o) and torch.equal(lse, want_lse)


def test_fp8_forward_replays_from_a_cuda_graph():
    require_available(FP8)
    static = fp8_inputs(2, 8, 2, 512, 512, 128, seed=20)

    def step():
        return ft.fp8_attention(*static, is_causal=True)

    first_o = step()[0].clone()
    graph, captured = captured_in_a_graph(step)
    for x, new in zip(static, fp8_inputs(2, 8, 2, 512, 512, 128, seed=30)):
        x.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    assert not torch.equal(eager[0], first_o)  # new inputs, new results: the replay must have read them
    for name, replayed, want in zip(("O", "LSE"), captured, eager):
        assert torch.equal(replayed, want), name  # the same kernels on the same inputs: bit-identical


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_fp8_attention_compiles_fullgraph_with_the_eager_results(mode):
    require_available(FP8)

    def both_layouts(q, k, v, qd, kd, vd):
        o, lse = ft.fp8_attention(q, k, v, qd, kd, vd, is_causal=True)
        o_bshd, lse_bshd = ft.fp8_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), qd, kd, vd,
                                            is_causal=True, causal_align="bottom-right", layout="bshd")
        return o, lse, o_bshd, lse_bshd

    compiled = torch.compile(both_layouts, fullgraph=True, mode=mode)
    for step, seq in enumerate((256, 256, 384, 512)):  # a new length: recompiled, with symbolic sizes
        inputs = fp8_inputs(2, 4, 2, seq, seq + 64, 64, seed=40 + step)
        eager = both_layouts(*inputs)
        got = [x.clone() for x in compiled(*inputs)]  # reduce-overhead's outputs are overwritten by its next replay
        for name, mine, want in zip(("O", "LSE", "O (bshd)", "LSE (bshd)"), got, eager):
            assert mine.shape == want.shape and mine.stride() == want.stride(), (name, mine.stride(), want.stride())
            assert torch.equal(mine, want), (name, seq)


@pytest.mark.parametrize("layout", ["bshd-memory", "contiguous"])
def test_fp8_opcheck(layout):
    require_available(FP8)
    q, k, v, qd, kd, vd = fp8_inputs(2, 4, 2, 130, 200, 64, seed=7)
    if layout == "contiguous":  # copied into (B, S, H, D) rows, and O copied out: strides as q's all the same
        q, k, v = (x.contiguous() for x in (q, k, v))
    # Not "test_autograd_registration": it checks an operator's autograd kernel against inputs that require grad, and
    # this one has none by design (there is no FP8 backward) and refuses such inputs
    # (test_fp8_bad_input_is_one_value_error_through_the_operator); with no input requiring grad it checks nothing.
    # Not "test_schema": its mode compares every input before and after the call with arithmetic that PyTorch 2.11
    # has no float8 kernel for (it stops in "mul_cuda not implemented for 'Float8_e4m3fn'", on the H200, before our
    # operator is judged). What it checks, no input written and no output aliasing one, is asserted below.
    torch.library.opcheck(torch.ops.flashlab.fp8_attention_forward.default,
                          (q, k, v, qd, kd, vd, FP8, True, False, None),
                          test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))


def test_fp8_operator_writes_no_input_and_returns_new_tensors():
    require_available(FP8)
    inputs = fp8_inputs(2, 4, 2, 130, 200, 64, seed=8)
    before = [x.view(torch.uint8).clone() if x.dtype == torch.float8_e4m3fn else x.clone() for x in inputs]
    o, lse = torch.ops.flashlab.fp8_attention_forward.default(*inputs, FP8, True, False, None)
    torch.cuda.synchronize()
    for x, was in zip(inputs, before):
        assert torch.equal(x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x, was)
    storages = {x.untyped_storage().data_ptr() for x in inputs}
    assert o.untyped_storage().data_ptr() not in storages and lse.untyped_storage().data_ptr() not in storages
    assert o.untyped_storage().data_ptr() != lse.untyped_storage().data_ptr()


def test_fp8_bad_input_is_one_value_error_through_the_operator():
    require_available(FP8)
    q, k, v, qd, kd, vd = fp8_inputs(2, 8, 2, 64, 64, 64, seed=9)
    op = torch.ops.flashlab.fp8_attention_forward
    options = (FP8, False, False, None)
    refused = [
        (lambda: ft.fp8_attention(q, k, v, kd, kd, vd),
         "q_descale has shape (2, 2) but the problem needs (B, H_q) = (2, 8): one descale per (batch, head)"),
        (lambda: ft.fp8_attention(q, k, v, qd, kd.cpu(), vd), "k_descale is on the cpu but query is on cuda:"),
        (lambda: ft.fp8_attention(q, k, v, qd, kd, vd.half()), "v_descale is f16 but descales are float32"),
        (lambda: ft.fp8_attention(q, k, v, qd, kd), "v_descale is missing"),  # no operator call: flashlab.attention's
        (lambda: op(q.half(), k, v, qd, kd, vd, *options),
         "query is Half: flashlab::fp8_attention_forward takes float8_e4m3fn CUDA tensors"),
        (lambda: op(q, k.half(), v, qd, kd, vd, *options), "key is Half: flashlab::fp8_attention_forward takes"),
        (lambda: op(q, k, v, qd.clone().requires_grad_(), kd, vd, *options),
         "q_descale requires grad, but FlashLab has no FP8 backward"),
        (lambda: op(q.detach().requires_grad_(), k, v, qd, kd, vd, *options),
         "query requires grad, but FlashLab has no FP8 backward"),
        (lambda: op(q, k, v, qd, kd, vd, "cuda-fa2", False, False, None),
         "variant cuda-fa2 takes f16 or bf16, not e4m3: only cuda-fa3-ws has an FP8 (e4m3) kernel"),
        (lambda: op(q, k, v, qd, kd, vd, "cuda-naive", False, False, None), "runs on the legacy default stream"),
        # The bf16 operators keep refusing float8, pointing here.
        (lambda: torch.ops.flashlab.attention_forward(q, k, v, FP8, False, False, None, 0.0, 0),
         "query is Float8_e4m3fn: FlashLab's operators take float16, bfloat16 or float32 CUDA tensors (float8 goes "
         "through flashlab.torch.fp8_attention)"),
    ]
    for call, sentence in refused:
        with pytest.raises(ValueError, match=re.escape(sentence)):
            call()
    wide = fp8_inputs(1, 2, 2, 64, 64, 96, seed=11)  # no FP8 kernel at head dim 96
    with pytest.raises(ValueError, match="in e4m3: the FP8 kernel takes head dims"):
        op(*wide, *options)
