"""`import flashlab` on a CUDA device, with PyTorch (CTest label gpu; run_pytest.py reports the suite as
skipped where there is no device):
  * every CUDA variant reads PyTorch tensors in place (the kernels get the tensors' own data pointers)
    and hands its results back in place (torch.from_dlpack keeps flashlab's pointer), computing exactly
    what the copying NumPy path computes; what cannot be read in place is refused with one sentence;
  * flashlab.torch.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention
    under FlashAttention's rule (flashlab.within_tolerance, the library's own): forward and backward,
    causal or not, MHA and GQA, bf16 and f16, head dims 64, 128 and 256;
  * a nanoGPT-style model (tests/python/nanogpt.py) trained 300 steps with PyTorch's attention and with
    each FlashLab variant that has a backward follows the same loss curve, within a stated tolerance
    that a model whose attention sees the future breaks;
  * flashlab.verify on torch tensors (device="cuda"): the values verify drew reach fn exactly, in the dtype and
    layout asked; a correct torch function passes the full suite at several seeds with backward="autograd"; each
    planted bug (tests/python/verify_kernels_torch.py, one per diagnosis, the GQA sum planted in autograd's path)
    is caught and named; a forward bug seen through autograd is named as the forward's, and the report says how
    many failures it explains; FlashLab's own CUDA variants pass through flashlab.torch; bench=True returns the
    table with fn, FlashLab's variants and SDPA's backends, in FlashAttention's TFLOP/s.
"""
import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import flashlab
import flashlab.torch as ft
import nanogpt
import verify_kernels_torch as vkt
from flashlab import _flashlab as native

assert torch.cuda.is_available(), ("this PyTorch has no CUDA, but the machine has a CUDA device: the GPU suite "
                                   "needs PyTorch with CUDA")
CUDA = torch.device("cuda")
CUDA_VARIANTS = [v for v in flashlab.variants() if v["device"] == "cuda"]
TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def variant_row(name):
    return next(v for v in flashlab.variants() if v["name"] == name)


def require_available(name):
    row = variant_row(name)
    if not row["available"]:
        pytest.skip(f"{name} needs compute capability {row['needs_compute_capability'] / 10:.1f}; this GPU is "
                    f"{flashlab.cuda_device_name()}")


def host(x):
    """A tensor's values as a NumPy array in host memory (float32 for bf16, which NumPy lacks)."""
    x = x.detach()
    return (x.float() if x.dtype == torch.bfloat16 else x).cpu().numpy()


def close_to_ulps(got, want, dtype, ulps=4):
    """Summed with atomics in a different order from run to run: equal to a few units in the last place."""
    eps = {"f32": 2.0 ** -23, "f16": 2.0 ** -10, "bf16": 2.0 ** -7}[dtype]
    return np.abs(got.astype(np.float64) - want).max() <= ulps * eps * max(1.0, np.abs(want).max())


# --- In place, and the same numbers as the host path --------------------------------------------------

@pytest.mark.parametrize("name", [v["name"] for v in CUDA_VARIANTS])
def test_every_cuda_variant_reads_and_writes_pytorch_tensors_in_place(name):
    require_available(name)
    row = variant_row(name)
    dtype = "f16" if "f16" in row["dtypes"] else "f32"
    torch.manual_seed(0)
    q = torch.randn(2, 100, 4, 64, device=CUDA, dtype=TORCH_DTYPE[dtype])
    k, v = (torch.randn(2, 130, 2, 64, device=CUDA, dtype=TORCH_DTYPE[dtype]) for _ in range(2))
    options = dict(variant=name, is_causal=True, causal_align="bottom-right", dropout_p=0.1, seed=3)

    o, lse = flashlab.attention(q, k, v, return_lse=True, **options)
    call = native.last_device_call()
    assert call["variant"] == name
    assert (call["q"], call["k"], call["v"]) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    o_t, lse_t = torch.from_dlpack(o), torch.from_dlpack(lse)
    assert o_t.data_ptr() == o.data_ptr == call["out"] and lse_t.data_ptr() == lse.data_ptr == call["lse"]
    assert o_t.shape == q.shape and o_t.dtype == q.dtype and o_t.device == q.device
    assert lse_t.shape == (2, 4, 100) and lse_t.dtype == torch.float32

    o_host, lse_host = flashlab.attention(host(q), host(k), host(v), return_lse=True, **options)
    assert np.array_equal(host(o_t), o_host) and np.array_equal(host(lse_t), lse_host)
    if not row["backward"]:
        return
    d_o = torch.randn_like(q)
    grads = flashlab.attention_backward(q, k, v, o, lse, d_o, **options)  # o, lse: flashlab's own DeviceArrays
    call = native.last_device_call()
    assert (call["q"], call["out"], call["lse"], call["grad_out"]) == (q.data_ptr(), o.data_ptr, lse.data_ptr,
                                                                       d_o.data_ptr())
    grads_host = flashlab.attention_backward(host(q), host(k), host(v), o_host, lse_host, host(d_o), **options)
    for name_, got, want in zip(("dq", "dk", "dv"), grads, grads_host):
        got_t = torch.from_dlpack(got)
        assert got_t.data_ptr() == call[name_] and got_t.shape == want.shape
        assert close_to_ulps(host(got_t), want, dtype), name_


def test_layouts_and_what_cannot_be_read_in_place():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 64, 4, 64, device=CUDA, dtype=torch.bfloat16) for _ in range(3))
    o = torch.from_dlpack(flashlab.attention(q, k, v, variant="cuda-fa2"))
    # (B, H, S, D) views of the same memory: read in place, and O comes back as such a view.
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    o_bhsd = torch.from_dlpack(flashlab.attention(qt, kt, vt, variant="cuda-fa2", layout="bhsd"))
    assert native.last_device_call()["q"] == q.data_ptr()
    assert o_bhsd.shape == (2, 4, 64, 64) and torch.equal(o_bhsd, o.transpose(1, 2))

    # Results written into the caller's tensors (flashlab.torch passes PyTorch's): nothing allocated.
    o_given, lse_given = torch.empty_like(q), torch.empty(2, 4, 64, device=CUDA)
    returned = flashlab.attention(q, k, v, variant="cuda-fa2", return_lse=True, out=(o_given, lse_given))
    assert returned[0] is o_given and returned[1] is lse_given and torch.equal(o_given, o)
    assert native.last_device_call()["out"] == o_given.data_ptr()

    o_flashlab, lse_flashlab = flashlab.attention(q, k, v, variant="cuda-fa2", return_lse=True)
    refused = [
        (lambda: flashlab.attention(q[..., ::2], k[..., ::2], v[..., ::2], variant="cuda-fa2"), "is not contiguous"),
        (lambda: flashlab.attention(*(x.transpose(1, 2).contiguous() for x in (q, k, v)), variant="cuda-fa2",
                                    layout="bhsd"), "must be a transposed view of it"),
        (lambda: flashlab.attention(*(misaligned(x) for x in (q, k, v)), variant="cuda-fa2"),
         "not a multiple of 16 bytes"),
        (lambda: flashlab.attention(q.float(), k.float(), v.float(), variant="cuda-fa2"),
         "variant cuda-fa2 does not compute in f32: it supports f16, bf16"),
        (lambda: flashlab.attention(q, k, v, variant="cpu-fa2"), "variant cpu-fa2 runs on the CPU"),
        (lambda: flashlab.attention(q, host(k), v, variant="cuda-fa2"), "q is in device memory but k is in host memory"),
        (lambda: flashlab.attention(q.clone().requires_grad_(), k, v, variant="cuda-fa2"), "q requires grad"),
        (lambda: flashlab.attention(q, k, v[..., :32], variant="cuda-fa2"), "v has shape (2, 64, 4, 32)"),
        (lambda: flashlab.attention_backward(q, k, v, o_flashlab, lse_flashlab, o.float(), variant="cuda-fa2"),
         "q is bf16 but grad_out is f32"),
        (lambda: flashlab.attention(q, k, v, variant="cuda-fa2", out=(o_given.float(), lse_given)),
         "out is f32 but the result it is to hold is bf16"),
        (lambda: flashlab.attention(q, k, v, variant="cuda-fa2", out=(o_given, lse_given[:, :, :32])),
         "lse has shape (2, 4, 32) but the result it is to hold has shape (2, 4, 64)"),
        (lambda: flashlab.attention(q, k, v, variant="cuda-fa2", out=(v, lse_given)),
         "out overlaps v in memory: the kernels would write out while they read v"),
    ]
    for call, sentence in refused:
        with pytest.raises(ValueError) as error:
            call()
        assert sentence in str(error.value)


def misaligned(x):
    """A copy of x that starts one element past a 16-byte boundary (a view into a larger buffer)."""
    view = torch.empty(x.numel() + 1, device=x.device, dtype=x.dtype)[1:].view(x.shape)
    view.copy_(x)
    return view


# --- flashlab.torch against PyTorch's scaled_dot_product_attention ------------------------------------

def attention_and_grads(attend, q, k, v, grad_out, **kwargs):
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = attend(*leaves, **kwargs)
    return (out, *torch.autograd.grad(out, leaves, grad_out))


def expand_heads(x, heads):
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def pytorch_sdpa(q, k, v, is_causal=False):
    """PyTorch's own attention, GQA through repeated K/V heads (whose gradients autograd sums back)."""
    return F.scaled_dot_product_attention(q, expand_heads(k, q.shape[1]), expand_heads(v, q.shape[1]),
                                          is_causal=is_causal)


@pytest.mark.parametrize("variant", ["cuda-fa2", "cuda-fa3-ws"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads_kv", [8, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_sdpa_matches_pytorch_under_the_flashattention_rule(dtype, is_causal, heads_kv, head_dim, variant):
    require_available(variant)
    torch.manual_seed(head_dim + heads_kv)
    shape_q, shape_kv = (2, 8, 257, head_dim), (2, heads_kv, 257, head_dim)
    q = torch.randn(shape_q, device=CUDA, dtype=TORCH_DTYPE[dtype])
    k, v = (torch.randn(shape_kv, device=CUDA, dtype=TORCH_DTYPE[dtype]) for _ in range(2))
    grad_out = torch.randn_like(q)
    ours = attention_and_grads(functools.partial(ft.scaled_dot_product_attention, variant=variant), q, k, v, grad_out,
                               is_causal=is_causal, enable_gqa=heads_kv != 8)
    theirs = attention_and_grads(pytorch_sdpa, q, k, v, grad_out, is_causal=is_causal)  # the low-precision baseline
    exact = attention_and_grads(pytorch_sdpa, *(x.double() for x in (q, k, v, grad_out)), is_causal=is_causal)
    for name, mine, baseline, ref in zip(("O", "dQ", "dK", "dV"), ours, theirs, exact):
        assert mine.shape == ref.shape and mine.dtype == q.dtype
        result = flashlab.within_tolerance(host(mine), host(ref), dtype=dtype, lowp=host(baseline),
                                           quantity="forward" if name == "O" else "gradient")
        assert result["passes"], (name, result)


def test_hopper_variant_at_head_dim_256_matches_pytorch_over_many_key_blocks():
    # At d = 256 the backward's K/V blocks hold 64 keys and the consumers split dK, dV by columns: 1000 tokens make
    # 16 K/V blocks and 16 query blocks, so every block walks a long pipeline and dQ sums 16 partials.
    require_available("cuda-fa3-ws")
    torch.manual_seed(7)
    q, k, v, grad_out = (torch.randn(2, 8, 1000, 256, device=CUDA, dtype=torch.bfloat16) for _ in range(4))
    for is_causal in (False, True):
        ours = attention_and_grads(functools.partial(ft.scaled_dot_product_attention, variant="cuda-fa3-ws"), q, k, v,
                                   grad_out, is_causal=is_causal)
        theirs = attention_and_grads(pytorch_sdpa, q, k, v, grad_out, is_causal=is_causal)
        exact = attention_and_grads(pytorch_sdpa, *(x.double() for x in (q, k, v, grad_out)), is_causal=is_causal)
        for name, mine, baseline, ref in zip(("O", "dQ", "dK", "dV"), ours, theirs, exact):
            result = flashlab.within_tolerance(host(mine), host(ref), dtype="bf16", lowp=host(baseline),
                                               quantity="forward" if name == "O" else "gradient")
            assert result["passes"], (is_causal, name, result)


def test_sdpa_refuses_what_it_cannot_do_in_one_sentence():
    q = torch.randn(1, 8, 16, 64, device=CUDA, dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 16, 64, device=CUDA, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="attn_mask is not supported: no FlashLab variant takes an arbitrary mask"):
        ft.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(16, 16, device=CUDA, dtype=torch.bool))
    with pytest.raises(ValueError, match="pass enable_gqa=True for grouped-query attention"):
        ft.scaled_dot_product_attention(q, kv, kv)
    with pytest.raises(ValueError, match="inputs must be 4-d, in layout \\(batch, heads, seq, head_dim\\)"):
        ft.scaled_dot_product_attention(q[0], q[0], q[0])


def test_dropout_uses_a_seed_from_pytorchs_generator_in_both_passes():
    q, k, v = (torch.randn(2, 4, 77, 64, device=CUDA, dtype=torch.bfloat16) for _ in range(3))
    grad_out = torch.randn_like(q)
    torch.manual_seed(11)
    seed = int(torch.randint(2**62, (1,)).item())  # what the wrapper draws after the same manual_seed
    torch.manual_seed(11)
    out, dq, dk, dv = attention_and_grads(ft.scaled_dot_product_attention, q, k, v, grad_out, dropout_p=0.2,
                                          is_causal=True, variant="cuda-fa2")
    options = dict(variant="cuda-fa2", is_causal=True, dropout_p=0.2, seed=seed, layout="bhsd")
    qb, kb, vb = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    o, lse = flashlab.attention(qb, kb, vb, return_lse=True, **options)
    assert torch.equal(out, torch.from_dlpack(o))
    grads = flashlab.attention_backward(qb, kb, vb, o, lse, grad_out.transpose(1, 2).contiguous().transpose(1, 2),
                                        **options)
    for mine, want in zip((dq, dk, dv), grads):
        assert close_to_ulps(host(mine), host(torch.from_dlpack(want)), "bf16")
    torch.manual_seed(12)
    assert not torch.equal(out, ft.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True,
                                                                variant="cuda-fa2"))


def test_cpu_tensors_go_through_the_cpu_variants_with_autograd():
    torch.manual_seed(2)
    q = torch.randn(2, 4, 9, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 12, 8, dtype=torch.float64) for _ in range(2))
    grad_out = torch.randn_like(q)
    ours = attention_and_grads(ft.scaled_dot_product_attention, q, k, v, grad_out, is_causal=True, enable_gqa=True,
                               variant="cpu-fa2")
    exact = attention_and_grads(pytorch_sdpa, q, k, v, grad_out, is_causal=True)
    for mine, ref in zip(ours, exact):
        assert flashlab.within_tolerance(host(mine), host(ref), dtype="f64")["passes"]


def test_sdpa_hands_deterministic_to_the_backward():
    # cpu-fa2 has one summation order: the same gradients bit for bit. cuda-fa2 adds dQ with atomics, so its
    # forward runs and its backward refuses deterministic with the registry's sentence.
    torch.manual_seed(4)
    q, k, v, grad_out = (torch.randn(1, 2, 9, 8, dtype=torch.float64) for _ in range(4))
    plain = attention_and_grads(ft.scaled_dot_product_attention, q, k, v, grad_out, variant="cpu-fa2")
    fixed = attention_and_grads(ft.scaled_dot_product_attention, q, k, v, grad_out, variant="cpu-fa2",
                                deterministic=True)
    for mine, want in zip(fixed, plain):
        assert torch.equal(mine, want)
    q, k, v = (torch.randn(1, 2, 16, 64, device=CUDA, dtype=torch.bfloat16) for _ in range(3))
    out = ft.scaled_dot_product_attention(q.requires_grad_(), k, v, variant="cuda-fa2", deterministic=True)
    with pytest.raises(ValueError, match="variant cuda-fa2's backward adds dQ's partial sums with atomics"):
        out.sum().backward()


# --- Training: the same loss curve with every attention backend ---------------------------------------

WINDOW = 25  # steps averaged per point of a loss curve
# Each point of a curve trained through FlashLab must be within this relative distance of PyTorch's. Runs
# in bf16 differ by bf16 rounding in every attention call, runs in f32 by summation order only.
CURVE_TOLERANCE = {"bf16": 0.03, "f32": 0.01}
TRAINED_WITH = [("cuda-fa2", "bf16"), ("cuda-fa3-ws", "bf16")] + [(v["name"], "f32") for v in CUDA_VARIANTS
                                                                if v["backward"] and "f32" in v["dtypes"]]


@functools.lru_cache(maxsize=None)
def pytorch_run(dtype):
    model, losses = nanogpt.train(F.scaled_dot_product_attention, device=CUDA, autocast_dtype=_autocast(dtype))
    return model, losses


def _autocast(dtype):
    return torch.bfloat16 if dtype == "bf16" else None


def relative_gap(curve, reference):
    return max(abs(a - b) / b for a, b in zip(nanogpt.windowed(curve, WINDOW), nanogpt.windowed(reference, WINDOW)))


@pytest.mark.parametrize("name, dtype", TRAINED_WITH)
def test_training_follows_pytorchs_loss_curve(name, dtype):
    require_available(name)
    _, reference = pytorch_run(dtype)
    attend = functools.partial(ft.scaled_dot_product_attention, variant=name)
    _, losses = nanogpt.train(attend, device=CUDA, autocast_dtype=_autocast(dtype))
    assert losses[-1] < 0.6 * losses[0], "the model did not learn"
    gap = relative_gap(losses, reference)
    print(f"{name} ({dtype}): windowed loss within {gap:.4f} of PyTorch's (tolerance {CURVE_TOLERANCE[dtype]})")
    assert gap <= CURVE_TOLERANCE[dtype]


def test_the_curve_tolerance_catches_attention_that_sees_the_future():
    _, reference = pytorch_run("bf16")

    def leaky(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        return ft.scaled_dot_product_attention(q, k, v, is_causal=False)

    _, losses = nanogpt.train(leaky, device=CUDA, autocast_dtype=torch.bfloat16)
    assert relative_gap(losses, reference) > CURVE_TOLERANCE["bf16"]


# --- FP8 (e4m3): the numpy path held to the FP8 rule, the torch path bit-identical to it ------------------------

def fp8_head_dims():
    return variant_row("cuda-fa3-ws")["e4m3_head_dim_values"]


FP8_PROBLEMS = [  # (B, H_q, H_kv, S_q, S_k), causal alignment or None
    ((2, 4, 2, 300, 300), None),
    ((1, 3, 1, 77, 1000), None),               # MQA, seq_q != seq_k
    ((1, 4, 2, 200, 333), "top-left"),
    ((2, 2, 1, 333, 200), "bottom-right"),     # rows that see no key
]


@pytest.mark.parametrize("problem, causal", FP8_PROBLEMS, ids=["gqa", "mqa-ragged", "top-left", "bottom-right"])
def test_fp8_numpy_path_within_the_fp8_rule_and_torch_path_bit_identical(problem, causal):
    require_available("cuda-fa3-ws")
    b, hq, hkv, sq, sk = problem
    options = dict(is_causal=causal is not None, causal_align=causal or "top-left")
    for d in fp8_head_dims():
        rng = np.random.default_rng(d + sq)
        q = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
        k, v = (rng.standard_normal((b, sk, hkv, d)).astype(np.float32) for _ in range(2))
        o, lse, quantized = flashlab.attention(q, k, v, variant="cuda-fa3-ws", dtype="e4m3", return_lse=True,
                                               return_quantized=True, **options)
        assert o.dtype == np.float32 and o.shape == q.shape and lse.dtype == np.float32 and lse.shape == (b, hq, sq)
        # O holds bf16 values: the low 16 bits of each float32 are zero.
        assert not np.any(o.view(np.uint32) & 0xFFFF)
        # The rule flashlab check --dtype e4m3 applies (check_fp8_kernel): within 2x the CPU emulation's error
        # against attention in float64 on the dequantized inputs, and the rms error too.
        result = flashlab.within_fp8_rule(q, k, v, o, lse, **options)
        assert result["emulation_passes"] and result["passes"], (d, result)
        assert result["o_rmse"] <= 2 * result["emulation_o_rmse"], (d, result)

        # The same bytes and descales through flashlab.torch, in (B, H, S, D) views: the same kernel on the same
        # operands, so the same bits.
        to_torch = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(CUDA)
        qt, kt, vt = (to_torch(quantized[n]).view(torch.float8_e4m3fn).transpose(1, 2) for n in ("q", "k", "v"))
        descales = [to_torch(quantized[n]) for n in ("q_descale", "k_descale", "v_descale")]
        o_t, lse_t = ft.fp8_attention(qt, kt, vt, *descales, **options)
        assert o_t.dtype == torch.bfloat16 and o_t.shape == (b, hq, sq, d) and lse_t.dtype == torch.float32
        assert o_t.stride() == qt.stride()  # laid out as q is: (B, S, H, D) rows, as SDPA lays out its output
        assert np.array_equal(host(o_t.transpose(1, 2)), o) and np.array_equal(host(lse_t), lse, equal_nan=True)
        # and in (B, S, H, D), FlashAttention-3's layout.
        o_s, lse_s = ft.fp8_attention(*(x.transpose(1, 2) for x in (qt, kt, vt)), *descales, layout="bshd",
                                      **options)
        assert np.array_equal(host(o_s), o) and np.array_equal(host(lse_s), lse)


def test_fp8_torch_path_on_its_own_quantization_and_what_it_refuses():
    require_available("cuda-fa3-ws")
    torch.manual_seed(5)
    d = fp8_head_dims()[0]
    q = torch.randn(2, 8, 130, d, device=CUDA)
    k, v = (torch.randn(2, 2, 130, d, device=CUDA) for _ in range(2))

    def quantize(x):  # per (batch, head) of a (B, H, S, D) tensor, as FlashAttention-3's users do
        amax = x.abs().amax(dim=(2, 3))
        scale = 448.0 / amax
        return (x * scale[:, :, None, None]).to(torch.float8_e4m3fn), (1.0 / scale).float().contiguous()

    (q8, qd), (k8, kd), (v8, vd) = (quantize(x) for x in (q, k, v))
    o, lse = ft.fp8_attention(q8, k8, v8, qd, kd, vd, is_causal=True)
    # The project's FP8 rule (flashlab check --dtype e4m3) on the operands the kernel was given: within_fp8_rule
    # quantizes the dequantized values per head again, which gives back the same e4m3 bytes (each block's largest
    # value maps to 448 once more) with descales equal to these up to float rounding, and holds O and the LSE to
    # twice the CPU emulation's error against attention in float64 on those operands.
    deq = lambda x8, xd: host(x8.float() * xd[:, :, None, None])
    result = flashlab.within_fp8_rule(deq(q8, qd), deq(k8, kd), deq(v8, vd), host(o), host(lse), is_causal=True,
                                      layout="bhsd")
    assert result["emulation_passes"] and result["passes"], result
    refused = [
        (lambda: ft.fp8_attention(q8, k8, v8, qd, kd), "v_descale is missing"),
        (lambda: ft.fp8_attention(q8, k8, v8, qd, vd, vd), None),  # shapes fit: runs (k's descale is v's)
        (lambda: ft.fp8_attention(q8, k8, v8, kd, kd, vd), "q_descale has shape (2, 2) but the problem needs (B, H_q)"),
        (lambda: ft.fp8_attention(q8, k8, v8, qd.double(), kd, vd), "q_descale is f64 but descales are float32"),
        (lambda: ft.fp8_attention(q8.float(), k8, v8, qd, kd, vd), "fp8_attention takes torch.float8_e4m3fn"),
        (lambda: ft.fp8_attention(q8.cpu(), k8, v8, qd, kd, vd), "q is on the cpu"),
        (lambda: ft.fp8_attention(q8, k8, v8, qd, kd, vd, variant="cuda-fa2"),
         "variant cuda-fa2 takes f16 or bf16, not e4m3: only cuda-fa3-ws has an FP8 (e4m3) kernel"),
        (lambda: ft.scaled_dot_product_attention(q8, k8, v8), "use flashlab.torch.fp8_attention"),
    ]
    for call, sentence in refused:
        if sentence is None:
            call()
            continue
        with pytest.raises(ValueError) as error:
            call()
        assert sentence in str(error.value)


# --- flashlab.verify on torch tensors: autograd, the planted bugs in torch, FlashLab's own variants, the bench ------

VERIFY_DEVICE = "cuda"
VERIFY_IDS = {"mask": "mask", "alignment": "alignment", "tail": "tail", "rescale": "rescale",
              "lse_base2": "lse-base-2", "group_sum": "group-sum", "scale": "scale"}
TORCH_DTYPE_NAME = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def through_flashlab_torch(row):
    """A FlashLab variant as a verify function on (B, S, H, D) torch tensors, through the public API: O from
    flashlab.torch.FlashLabAttention (autograd runs the variant's backward), the LSE from flashlab.attention. What the
    variant does not run (a dtype, a head dim of its backward) is refused, and verify lists it."""
    name = row["name"]

    def attend(q, k, v, *, is_causal, causal_align, scale):
        if TORCH_DTYPE_NAME[q.dtype] not in row["dtypes"]:
            raise NotImplementedError(f"{name} computes in {', '.join(row['dtypes'])}")
        if q.shape[-1] not in row["backward_head_dim_values"]:
            raise NotImplementedError(f"{name}'s backward runs head dims {row['backward_head_dims']}")
        o = ft.FlashLabAttention.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), name, is_causal,
                                       causal_align, scale, 0.0, 0, False)
        _, lse = flashlab.attention(q.detach(), k.detach(), v.detach(), variant=name, is_causal=is_causal,
                                    causal_align=causal_align, scale=scale, return_lse=True)
        return o.transpose(1, 2), torch.from_dlpack(lse)

    attend.__name__ = name
    return attend


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_verify_hands_fn_the_drawn_values_on_the_device_in_the_dtype_and_layout(dtype):
    # The first case as fn gets it from the torch path and from the NumPy path (same seed): the same values, on the
    # device, in the torch dtype asked, (B, H, S, D) and contiguous.
    seen = {}

    def recorder(path):
        def fn(q, k, v, **options):
            seen.setdefault(path, ([x.detach().clone() if path == "torch" else x.copy() for x in (q, k, v)], options))
            raise NotImplementedError("recorded")
        return fn

    for path, device in (("torch", VERIFY_DEVICE), ("numpy", None)):
        report = flashlab.verify(recorder(path), dtypes=dtype, head_dims=(64,), layout="bhsd", seed=46, device=device)
        assert not report.as_dict()["cases"] and len(report.as_dict()["refused"]) == 20
    (tensors, torch_options), (arrays, numpy_options) = seen["torch"], seen["numpy"]
    assert torch_options == numpy_options
    for t, a in zip(tensors, arrays):
        assert t.device.type == torch.device(VERIFY_DEVICE).type and t.dtype == TORCH_DTYPE[dtype]
        assert t.is_contiguous() and tuple(t.shape) == a.shape
        assert np.array_equal(t.float().cpu().numpy(), a.astype(np.float32))


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_verify_passes_a_correct_torch_function_with_autograd_at_every_seed(seed):
    report = flashlab.verify(vkt.forward, backward="autograd", device=VERIFY_DEVICE, dtypes=("f32", "f16", "bf16"),
                             head_dims=(32, 64), suite="full", seed=seed, name="torch-online-softmax")
    data = report.as_dict()
    assert report and data["failed"] == 0 and not data["refused"], str(report)
    assert data["passed"] == len(data["cases"]) >= 200
    assert all({o["name"] for o in c["outputs"]} == {"O", "LSE", "dQ", "dK", "dV"} for c in data["cases"])
    assert data["notes"] == [] and data["bench"] is None


@pytest.mark.parametrize("bug", vkt.BUGS)
def test_verify_catches_and_names_each_planted_torch_bug(bug):
    fwd = functools.partial(vkt.forward, bug=bug)
    for seed in (41, 42):
        report = flashlab.verify(fwd, backward="autograd", device=VERIFY_DEVICE, dtypes=("f32", "bf16"),
                                 head_dims=(32, 64), seed=seed)
        assert not report, str(report)
        assert report.diagnosis["id"] == VERIFY_IDS[bug], str(report)
        first = report.as_dict()["first_failure"]
        assert first is not None and first["ours"] != first["reference"]


def test_verify_with_autograd_names_a_forward_bug_as_the_forwards_and_says_so():
    # The mask left out: autograd differentiates that wrong forward, so the gradients of the masked cases fail too;
    # the diagnosis still names the mask, and the report says the failures in O explain the gradients'.
    report = flashlab.verify(functools.partial(vkt.forward, bug="mask"), backward="autograd", device=VERIFY_DEVICE,
                             dtypes="bf16", head_dims=(64,), seed=44)
    data = report.as_dict()
    failing = [c for c in data["cases"] if not c["passes"]]
    assert report.diagnosis["id"] == "mask", str(report)
    assert failing and all(any(o["name"] == "O" and not o["passes"] for o in c["outputs"]) for c in failing)
    assert any(o["name"].startswith("d") and not o["passes"] for c in failing for o in c["outputs"])
    n = len(failing)
    assert len(data["notes"]) == 1 and data["notes"][0].startswith(f"autograd: {n} of the {n} failing cases fail in O")
    assert data["notes"][0].endswith("0 fail in the gradients alone.") and data["notes"][0] in str(report)
    # A bug in the backward alone (the GQA sum, inside autograd's path): O passes everywhere, and there is no note.
    report = flashlab.verify(functools.partial(vkt.forward, bug="group_sum"), backward="autograd",
                             device=VERIFY_DEVICE, dtypes="bf16", head_dims=(64,), seed=44)
    assert report.diagnosis["id"] == "group-sum" and report.as_dict()["notes"] == [], str(report)


def test_verify_takes_a_backward_function_on_torch_tensors():
    report = flashlab.verify(vkt.forward, backward=vkt.backward, device=VERIFY_DEVICE, dtypes=("f32", "bf16"),
                             head_dims=(32, 64), seed=45)
    assert report, str(report)
    assert {o["name"] for o in report.as_dict()["cases"][0]["outputs"]} == {"O", "LSE", "dQ", "dK", "dV"}
    planted = flashlab.verify(vkt.forward, backward=functools.partial(vkt.backward, bug="group_sum"),
                              device=VERIFY_DEVICE, dtypes=("f32", "bf16"), head_dims=(32, 64), seed=45)
    assert planted.diagnosis["id"] == "group-sum", str(planted)


def test_verify_autograd_refuses_a_function_autograd_cannot_see_through():
    def detached(q, k, v, **options):  # as a Triton kernel without a backward looks to autograd
        with torch.no_grad():
            return vkt.forward(q, k, v, **options)

    with pytest.raises(ValueError, match="fn returned an O that does not require grad"):
        flashlab.verify(detached, backward="autograd", device=VERIFY_DEVICE, dtypes="bf16", head_dims=(64,), seed=47)
    assert flashlab.verify(detached, device=VERIFY_DEVICE, dtypes="bf16", head_dims=(64,), seed=47)  # forward only


@pytest.mark.parametrize("variant", ["cuda-fa2", "cuda-fa3-ws"])
def test_verify_passes_flashlabs_cuda_variants_through_flashlab_torch(variant):
    require_available(variant)
    report = flashlab.verify(through_flashlab_torch(variant_row(variant)), backward="autograd", device=VERIFY_DEVICE,
                             dtypes=("f32", "bf16", "f16"), head_dims=(64, 128), seed=48)
    data = report.as_dict()
    assert report, str(report)
    # f32 is refused, case by case, with the variant's reason; the other pairs pass.
    assert data["refused"] and all(r["dtype"] == "f32" and "computes in f16, bf16" in r["why"] for r in data["refused"])
    assert data["passed"] + len(data["refused"]) == 20


def test_verify_bench_times_fn_beside_flashlab_and_sdpa():
    require_available("cuda-fa2")
    fn = through_flashlab_torch(variant_row("cuda-fa2"))
    report = flashlab.verify(fn, backward="autograd", device=VERIFY_DEVICE, dtypes=("bf16", "f32"), head_dims=(64,),
                             seed=49, bench=True, name="mine")
    assert report, str(report)
    bench = report.as_dict()["bench"]
    assert bench["settings"]["pairs"] == [["bf16", 64]]  # the pairs fn passed, bf16 and f16 only
    rows = bench["rows"]
    by_candidate = {}
    for r in rows:
        by_candidate.setdefault(r["candidate"], []).append(r)
    assert set(by_candidate) == {"mine", "cuda-fa2", "cuda-fa3-ws", "sdpa-flash", "sdpa-cudnn"}
    for label, timed in by_candidate.items():
        assert {(r["causal"], r["seq"]) for r in timed} == {(c, n) for c in (False, True) for n in (1024, 4096, 16384)}
        for r in timed:
            assert r["batch"] * r["seq"] == 16384 and r["heads"] * r["head_dim"] == 2048 and r["dtype"] == "bf16"
            if label in ("mine", "cuda-fa2", "sdpa-flash"):  # these run every shape here
                assert r["forward_ms"] > 0 and r["forward_backward_ms"] > 0, r
            elif r["forward_ms"] is None:  # cuda-fa3-ws off Hopper, cuDNN where this PyTorch has none: said why
                assert r["note"] and any(note.startswith(label) for note in bench["notes"]), r
            if r["forward_ms"] is not None:
                # FlashAttention's count (core/flops.hpp): 4 B H N^2 d, halved when causal; 3.5x with the backward.
                flops = 4 * r["batch"] * r["heads"] * r["seq"] ** 2 * r["head_dim"] / (2 if r["causal"] else 1)
                assert math.isclose(r["forward_tflops"], flops / r["forward_ms"] / 1e9, rel_tol=1e-9)
            if r["forward_backward_ms"] is not None:
                assert math.isclose(r["forward_backward_tflops"], 3.5 * flops / r["forward_backward_ms"] / 1e9,
                                    rel_tol=1e-9)
    # str(report): the CLI's table, then the bench's, with a column per candidate.
    table, bench_table = str(report).split("\nbench on ", 1)
    passed = report.as_dict()["passed"]  # the bf16 cases (f32 is refused, case by case)
    assert f"\n{passed} cases: {passed} pass, 0 fail" in table
    assert all(label in bench_table.splitlines()[2] for label in by_candidate)
