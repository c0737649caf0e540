"""FlashLab's PyTorch operators (torch.ops.flashlab.*, python/torch_ops.cpp) on a CUDA device (CTest label gpu;
run_pytest.py reports the suite as skipped where there is none):
  * they are there wherever FlashLab was built with CUDA for a Python with PyTorch, and flashlab.torch routes the
    variants that run on a caller's stream through them, variant="auto" included;
  * torch.library.opcheck passes: schemas, fake (Meta) implementations, the autograd registration, AOT dispatch;
  * the kernels run on torch.cuda.current_stream() and the call returns without waiting for them;
  * a forward and backward captured in a CUDA graph replay on new inputs to the eager results;
  * torch.compile(fullgraph=True) and mode="reduce-overhead" compile a model that uses them, with the eager results;
  * the outputs have the strides SDPA's outputs have, for both memory layouts of q;
  * bad input is one ValueError sentence through the operator.
"""
import functools

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
    for op in ("attention", "attention_forward", "attention_backward"):
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


def test_forward_and_backward_replay_from_a_cuda_graph():
    require_available("cuda-fa3-ws")
    static = [bshd_memory(2, 8, 512, 64, seed=s).detach().requires_grad_() for s in range(3)]
    grad_out = torch.randn(2, 512, 8, 64, device=CUDA, dtype=torch.bfloat16).transpose(1, 2)

    def step():
        out = ft.scaled_dot_product_attention(*static, is_causal=True, variant="cuda-fa3-ws")
        return (out, *torch.autograd.grad(out, static, grad_out))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as PyTorch asks
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    fresh = [bshd_memory(2, 8, 512, 64, seed=10 + s) for s in range(3)]
    with torch.no_grad():
        for x, new in zip(static, fresh):
            x.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    for name, replayed, want in zip(("O", "dQ", "dK", "dV"), captured, eager):
        assert torch.equal(replayed, want), name  # the same kernels on the same inputs: bit-identical


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
