"""`import flashlab` on the CPU (CTest label cpu): every CPU variant from NumPy computes what `flashlab run`
computes on the same inputs, gradients agree with finite differences, bad input raises ValueError with
the library's sentence (the CLI's own where both take the input), flashlab.check() and variants() are the
CLI's tables, and the module imports where PyTorch is absent. FLASHLAB_BIN names the `flashlab` binary
of the same build (CTest sets it)."""
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import flashlab
from fake_dlpack import KDL_CUDA_MANAGED, FakeDeviceTensor

FLASHLAB_BIN = os.environ.get("FLASHLAB_BIN", "flashlab")
CPU_VARIANTS = [v["name"] for v in flashlab.variants() if v["device"] == "cpu"]


def cli(*args):
    return subprocess.run([FLASHLAB_BIN, *map(str, args)], capture_output=True, text=True)


def cli_sentence(*args):
    """The one sentence `flashlab` prints for bad input (exit code 2), without its "flashlab: " prefix."""
    r = cli(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("flashlab: ") and r.stderr.count("\n") == 1, r.stderr
    return r.stderr[len("flashlab: "):].strip()


def random_inputs(shape_q, shape_kv, dtype, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape_q).astype(dtype)
    k, v = (rng.standard_normal(shape_kv).astype(dtype) for _ in range(2))
    d_o = rng.standard_normal(shape_q).astype(dtype)
    return q, k, v, d_o


# (B, S_q, H_q, D), (B, S_k, H_kv, D), causal alignment or None, dropout: GQA, ragged lengths, both masks.
PROBLEMS = [
    ((2, 13, 4, 16), (2, 21, 2, 16), None, 0.0),
    ((1, 24, 2, 8), (1, 17, 1, 8), "bottom-right", 0.2),
    ((1, 19, 3, 32), (1, 19, 3, 32), "top-left", 0.1),
]


@pytest.mark.parametrize("variant", CPU_VARIANTS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("problem", PROBLEMS, ids=["gqa", "bottom-right-dropout", "top-left-dropout"])
def test_every_cpu_variant_equals_flashlab_run(tmp_path, variant, dtype, problem):
    shape_q, shape_kv, causal, dropout = problem
    q, k, v, d_o = random_inputs(shape_q, shape_kv, dtype, seed=len(variant))
    files = {name: tmp_path / f"{name}.npy" for name in ("q", "k", "v", "do", "o", "lse", "dq", "dk", "dv")}
    for name, array in (("q", q), ("k", k), ("v", v), ("do", d_o)):
        np.save(files[name], array)
    r = cli("run", "--variant", variant, "--q", files["q"], "--k", files["k"], "--v", files["v"], "--out", files["o"],
            "--lse", files["lse"], "--dout", files["do"], "--dq", files["dq"], "--dk", files["dk"], "--dv", files["dv"],
            "--causal", causal or "none", "--dropout", dropout, "--seed", 7)
    assert r.returncode == 0, r.stderr

    options = dict(variant=variant, is_causal=causal is not None, causal_align=causal or "top-left",
                   dropout_p=dropout, seed=7)
    o, lse = flashlab.attention(q, k, v, return_lse=True, **options)
    dq, dk, dv = flashlab.attention_backward(q, k, v, o, lse, d_o, **options)
    assert o.dtype == dtype and dq.dtype == dtype
    assert np.array_equal(o, np.load(files["o"]))
    assert np.array_equal(lse.astype(np.float32), np.load(files["lse"]))  # run writes the LSE as float32
    for name, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert np.array_equal(grad, np.load(files[name])), name

    # The same problem in (B, H, S, D), and from non-contiguous arrays: the same numbers.
    to_bhsd = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    o_bhsd, lse_bhsd = flashlab.attention(*map(to_bhsd, (q, k, v)), return_lse=True, layout="bhsd", **options)
    assert o_bhsd.shape == to_bhsd(o).shape and np.array_equal(o_bhsd, to_bhsd(o)) and np.array_equal(lse_bhsd, lse)
    grads_bhsd = flashlab.attention_backward(*map(to_bhsd, (q, k, v, o)), lse, to_bhsd(d_o), layout="bhsd", **options)
    for got, want in zip(grads_bhsd, (dq, dk, dv)):
        assert np.array_equal(got, to_bhsd(want))
    strided = [np.repeat(x, 2, axis=3)[..., ::2] for x in (q, k, v)]
    assert not strided[0].flags.c_contiguous
    assert np.array_equal(flashlab.attention(*strided, **options), o)


@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_gradients_match_finite_differences(variant):
    # L = sum(O * W): dL/dO = W. Central differences in float64 on a tiny GQA problem with a bottom-right
    # mask (S_q > S_k: one query row sees no key) and dropout, whose mask the seed fixes.
    q, k, v, w = random_inputs((1, 4, 2, 3), (1, 3, 1, 3), np.float64, seed=11)
    options = dict(variant=variant, is_causal=True, causal_align="bottom-right", dropout_p=0.3, seed=5)
    o, lse = flashlab.attention(q, k, v, return_lse=True, **options)
    grads = flashlab.attention_backward(q, k, v, o, lse, w, **options)
    loss = lambda q_, k_, v_: float(np.sum(flashlab.attention(q_, k_, v_, **options) * w))
    eps = 1e-6
    for which, grad in enumerate(grads):
        numeric = np.zeros_like(grad)
        for index in np.ndindex(grad.shape):
            plus, minus = [list((q, k, v)) for _ in range(2)]
            plus[which], minus[which] = plus[which].copy(), minus[which].copy()
            plus[which][index] += eps
            minus[which][index] -= eps
            numeric[index] = (loss(*plus) - loss(*minus)) / (2 * eps)
        assert np.abs(numeric).max() > 0.1  # the check has something to compare
        np.testing.assert_allclose(grad, numeric, rtol=0, atol=1e-7, err_msg="dq dk dv"[3 * which:3 * which + 2])


def test_bad_input_is_the_cli_sentence(tmp_path):
    q, k, v, _ = random_inputs((1, 8, 2, 16), (1, 8, 2, 16), np.float32, seed=1)
    for name, array in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", array)
        np.save(tmp_path / f"{name}16.npy", array.astype(np.float16))
    files = lambda suffix="": ["--q", tmp_path / f"q{suffix}.npy", "--k", tmp_path / f"k{suffix}.npy",
                               "--v", tmp_path / f"v{suffix}.npy", "--out", tmp_path / "o.npy"]
    cases = [
        (dict(variant="cpu-fa3"), ["--variant", "cpu-fa3", *files()]),
        (dict(variant="cpu-fa2", dropout_p=1.5), ["--variant", "cpu-fa2", "--dropout", "1.5", *files()]),
        (dict(variant="cpu-fa2", is_causal=True, causal_align="diagonal"),
         ["--variant", "cpu-fa2", "--causal", "diagonal", *files()]),
    ]
    for kwargs, args in cases:
        with pytest.raises(ValueError) as error:
            flashlab.attention(q, k, v, **kwargs)
        assert str(error.value) == cli_sentence("run", *args)
    with pytest.raises(ValueError) as error:
        flashlab.attention(*(x.astype(np.float16) for x in (q, k, v)), variant="cpu-fa2")
    assert str(error.value) == cli_sentence("run", "--variant", "cpu-fa2", *files("16"))
    wide = np.zeros((1, 8, 2, 300), np.float32)
    with pytest.raises(ValueError) as error:
        flashlab.attention(wide, wide, wide)
    assert str(error.value) == cli_sentence("check", "--head-dim", "300")


BAD_INPUTS = [
    # (what, call, the sentence's telling part)
    ("v's head dim", lambda q, k, v: flashlab.attention(q, k, v[..., :8]),
     "v has shape (1, 9, 1, 8) but the problem needs (1, 9, 1, 16) in layout (batch, seq, heads, head_dim)"),
    ("v in the wrong layout", lambda q, k, v: flashlab.attention(q, k, v.transpose(0, 2, 1, 3)),
     "v has shape (1, 1, 9, 16) but the problem needs (1, 9, 1, 16) in layout (batch, seq, heads, head_dim)"),
    ("(B, S, H, D) arrays called bhsd", lambda q, k, v: flashlab.attention(q, q, v, layout="bhsd"),
     "v has shape (1, 9, 1, 16) but the problem needs (1, 8, 2, 16) in layout (batch, heads, seq, head_dim)"),
    ("3-d q", lambda q, k, v: flashlab.attention(q[0], k, v),
     "q has shape (8, 2, 16) but inputs must be 4-d, in layout (batch, seq, heads, head_dim)"),
    ("heads", lambda q, k, v: flashlab.attention(np.zeros((1, 8, 3, 16)), k.repeat(2, 2), v.repeat(2, 2)),
     "q has 3 heads and k, v have 2: the query heads must be a multiple of the key/value heads"),
    ("integer q", lambda q, k, v: flashlab.attention(q.astype(np.int32), k, v),
     "q has dtype int32: supported are float64, float32 and float16"),
    ("big-endian q", lambda q, k, v: flashlab.attention(q.astype(">f8"), k, v), "q has dtype float64 (big-endian)"),
    ("mixed dtypes", lambda q, k, v: flashlab.attention(q.astype(np.float32), k, v),
     "q is f32 but k is f64: pass them in one dtype"),
    ("a list", lambda q, k, v: flashlab.attention([[1.0]], k, v),
     "q must be a NumPy array or a DLPack tensor (PyTorch, CuPy), got list"),
    ("unknown layout", lambda q, k, v: flashlab.attention(q, k, v, layout="sbhd"), "unknown layout 'sbhd'"),
    ("a variant that is not a name", lambda q, k, v: flashlab.attention(q, k, v, variant=2),
     "variant must be a name (a str), got int"),
    ("scale 0", lambda q, k, v: flashlab.attention(q, k, v, scale=0), "scale must not be 0"),
    ("negative seed", lambda q, k, v: flashlab.attention(q, k, v, seed=-1), "seed must be an integer in [0, 2^64)"),
    ("causal_align none", lambda q, k, v: flashlab.attention(q, k, v, is_causal=True, causal_align="none"),
     "causal_align is top-left or bottom-right"),
    ("lse of another problem", lambda q, k, v: flashlab.attention_backward(q, k, v, q, np.zeros((1, 1, 9)), q),
     "lse has shape (1, 1, 9) but the problem needs (1, 2, 8), (batch, heads, seq_q)"),
    ("out of another problem", lambda q, k, v: flashlab.attention_backward(q, k, v, k, np.zeros((1, 2, 8)), q),
     "out has shape (1, 9, 1, 16) but the problem needs (1, 8, 2, 16)"),
]


@pytest.mark.parametrize("what, call, sentence", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises_value_error_with_one_sentence(what, call, sentence):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 8, 2, 16)), rng.standard_normal((1, 9, 1, 16)), rng.standard_normal((1, 9, 1, 16))
    with pytest.raises(ValueError) as error:
        call(q, k, v)
    assert sentence in str(error.value)
    assert "\n" not in str(error.value)


def fake(shape=(1, 8, 2, 16), **kwargs):
    return FakeDeviceTensor(shape, **kwargs)


BHSD = dict(shape=(1, 2, 8, 16), strides=(256, 16, 32, 1))  # a (B, H, S, D) view of (B, S, H, D) memory
DEVICE_INPUTS = [
    # (what, q, k, v, layout, the sentence's telling part): tensors that say they are on a GPU, all refused
    # before any kernel runs (cpu-fa2 cannot take GPU tensors: reaching that sentence means the checks
    # before it passed).
    ("a CPU variant", fake(), fake(), fake(), "bshd",
     "variant cpu-fa2 runs on the CPU, so its tensors must be in host memory, not on a CUDA device"),
    ("a bhsd view of bshd memory", fake(**BHSD), fake(**BHSD), fake(**BHSD), "bhsd", "variant cpu-fa2 runs on the CPU"),
    ("non-contiguous", fake(strides=(512, 64, 32, 1)), fake(), fake(), "bshd",
     "q is not contiguous (its strides are (512, 64, 32, 1) elements, a contiguous tensor's (256, 32, 16, 1))"),
    ("a contiguous bhsd tensor", fake((1, 2, 8, 16)), fake(**BHSD), fake(**BHSD), "bhsd",
     "q has strides (256, 128, 16, 1) (in elements), but the kernels read (batch, seq, heads, head_dim) memory in "
     "place, so a (batch, heads, seq, head_dim) tensor must be a transposed view of it, with strides "
     "(256, 16, 32, 1)"),
    ("integer", fake(dtype="int32"), fake(), fake(), "bshd",
     "q has dtype int32: supported are float64, float32, float16 and bfloat16"),
    ("managed memory", fake(device_type=KDL_CUDA_MANAGED), fake(), fake(), "bshd",
     "q is in CUDA managed memory: pass tensors in CUDA device memory, or NumPy arrays in host memory"),
    ("another GPU", fake(), fake(device_id=1), fake(), "bshd", "q is on CUDA device 0 but k is on CUDA device 1"),
    ("bf16 q, f32 k", fake(dtype="bfloat16"), fake(), fake(), "bshd", "q is bf16 but k is f32: pass them in one dtype"),
    ("shapes", fake(), fake(), fake((1, 8, 2, 8)), "bshd",
     "v has shape (1, 8, 2, 8) but the problem needs (1, 8, 2, 16) in layout (batch, seq, heads, head_dim)"),
]


@pytest.mark.parametrize("what, q, k, v, layout, sentence", DEVICE_INPUTS, ids=[d[0] for d in DEVICE_INPUTS])
def test_device_tensors_are_checked_before_any_kernel_and_handed_back(what, q, k, v, layout, sentence):
    with pytest.raises(ValueError) as error:
        flashlab.attention(q, k, v, variant="cpu-fa2", layout=layout)
    assert sentence in str(error.value)
    assert q.taken() == 1  # the first tensor is always read
    for t in (q, k, v):  # and every capsule taken was handed back to its producer
        assert t.returned == t.taken()


def test_result_buffers_are_for_gpu_memory_only():
    q = np.zeros((1, 8, 2, 16), np.float32)
    with pytest.raises(ValueError, match="out takes buffers for results in GPU memory"):
        flashlab.attention(q, q, q, out=(q, q))
    with pytest.raises(ValueError, match="grads_out takes buffers for results in GPU memory"):
        flashlab.attention_backward(q, q, q, q, np.zeros((1, 2, 8), np.float32), q, grads_out=(q, q, q))
    with pytest.raises(ValueError, match=r"out must be a tuple \(o, lse\) of tensors in GPU memory"):
        flashlab.attention(fake(), fake(), fake(), out=fake())


def test_host_and_device_tensors_are_not_mixed():
    q = np.zeros((1, 8, 2, 16), np.float32)
    with pytest.raises(ValueError, match="q is in host memory but k is in device memory: pass every tensor in one place"):
        flashlab.attention(q, FakeDeviceTensor(q.shape), q)


def head_dim_values(text):
    """The head dims that HeadDims::describe's text names: "1..256" or "64, 128"."""
    if ".." in text:
        low, high = map(int, text.split(".."))
        return list(range(low, high + 1))
    return [int(d) for d in text.split(",")]


def backward_cell(v):
    """The backward cell of `flashlab check --list` for a row of variants(): "yes, atomic dQ" for a backward
    without a deterministic mode, "(d = ...)" after it where the backward takes fewer head dims."""
    if not v["backward"]:
        return "no"
    cell = "yes" if v["deterministic"] else "yes, atomic dQ"
    if v["backward_head_dims"] != v["head_dims"]:
        cell += f" (d = {v['backward_head_dims']})"
    return cell


def test_variants_is_the_cli_table():
    r = cli("check", "--list")
    assert r.returncode == 0
    lines = r.stdout.splitlines()[2:]  # below the header and its rule
    table = flashlab.variants()
    assert len(lines) == len(table)
    yes = lambda b: "yes" if b else "no"
    for line, v in zip(lines, table):
        cells = [v["name"], v["device"], ",".join(v["dtypes"]), yes(v["causal"]), yes(v["dropout"]), yes(v["gqa"]),
                 backward_cell(v), v["head_dims"], yes(v["available"])]
        words = " ".join(cells).split()
        assert line.split()[:len(words)] == words
        assert line.endswith(v["summary"])
        assert v["head_dim_values"] == head_dim_values(v["head_dims"])
        assert v["backward_head_dim_values"] == head_dim_values(v["backward_head_dims"])


def test_variants_say_which_backward_is_deterministic_and_at_which_head_dims():
    rows = {v["name"]: v for v in flashlab.variants()}
    for name in CPU_VARIANTS:  # one summation order, every head dim of the forward
        assert rows[name]["deterministic"] is True
        assert rows[name]["backward_head_dims"] == rows[name]["head_dims"] == "1..256"
        assert rows[name]["backward_head_dim_values"] == rows[name]["head_dim_values"]
    # The CUDA rows are in the table only where the build has CUDA (a CPU-only build lists the CPU rows alone).
    assert ("cuda-fa2" in rows) == ("cuda-fa3-ws" in rows) == flashlab.built_with_cuda
    if flashlab.built_with_cuda:
        assert rows["cuda-fa2"]["deterministic"] is False  # dQ by atomics, no deterministic mode
        assert rows["cuda-fa2"]["backward_head_dims"] == rows["cuda-fa2"]["head_dims"]
        assert rows["cuda-fa3-ws"]["deterministic"] is True
        assert rows["cuda-fa3-ws"]["head_dims"] == "64, 128, 256"
        assert rows["cuda-fa3-ws"]["backward_head_dims"] == "64, 128, 256"
        assert rows["cuda-fa3-ws"]["backward_head_dim_values"] == [64, 128, 256]


@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_deterministic_backward_on_the_cpu_is_the_one_order_it_always_has(variant):
    q, k, v, d_o = random_inputs((2, 13, 4, 16), (2, 21, 2, 16), np.float32, seed=9)
    options = dict(variant=variant, is_causal=True, causal_align="bottom-right", dropout_p=0.2, seed=3)
    o, lse = flashlab.attention(q, k, v, return_lse=True, **options)
    grads = flashlab.attention_backward(q, k, v, o, lse, d_o, **options)
    for deterministic in (True, False):
        again = flashlab.attention_backward(q, k, v, o, lse, d_o, deterministic=deterministic, **options)
        for name, got, want in zip(("dq", "dk", "dv"), again, grads):
            assert np.array_equal(got, want), (name, deterministic)


def test_deterministic_is_refused_where_the_backward_adds_dq_with_atomics():
    q, k, v, d_o = random_inputs((1, 8, 2, 64), (1, 8, 2, 64), np.float16, seed=4)  # a problem cuda-fa2 takes
    o, lse = np.zeros_like(q), np.zeros((1, 2, 8), np.float32)
    with pytest.raises(ValueError) as error:
        flashlab.attention_backward(q, k, v, o, lse, d_o, variant="cuda-fa2", deterministic=True)
    if flashlab.built_with_cuda:
        # check_supported refuses deterministic before it asks for a GPU: this sentence with or without one.
        names = [v["name"] for v in flashlab.variants() if v["backward"] and v["deterministic"]]
        assert str(error.value) == (
            "variant cuda-fa2's backward adds dQ's partial sums with atomics in arrival order and has no "
            f"deterministic mode; drop --deterministic, or use a variant with one ({', '.join(names[:-1])} and "
            f"{names[-1]})")
    else:
        # A build without CUDA has no cuda-fa2 row: the name is refused before the options are looked at.
        assert str(error.value) == "unknown variant 'cuda-fa2': known variants are " + ", ".join(CPU_VARIANTS)
    # The device path takes the keyword too: these tensors reach the library's checks (and cpu-fa2 refuses
    # tensors in GPU memory).
    tensors = [fake(), fake(), fake(), fake(), FakeDeviceTensor((1, 2, 8)), fake()]
    with pytest.raises(ValueError, match="variant cpu-fa2 runs on the CPU"):
        flashlab.attention_backward(*tensors, variant="cpu-fa2", deterministic=True)


def test_check_returns_the_cli_table_as_rows():
    args = dict(batch=1, heads=4, heads_kv=2, seq_q=24, seq_k=40, head_dim=16, causal="bottom-right", dropout_p=0.2,
                seed=5, backward=True)
    rows = [row for row in flashlab.check(**args) if row["device"] == "cpu"]  # CUDA rows: SKIP without a GPU
    r = cli("check", "--batch", 1, "--heads", 4, "--heads-kv", 2, "--seq-q", 24, "--seq-k", 40, "--head-dim", 16,
            "--causal", "bottom-right", "--dropout", 0.2, "--seed", 5, "--backward")
    assert r.returncode == 0, r.stdout
    printed = [line.split() for line in r.stdout.splitlines() if line.startswith("cpu-")]

    def sci(x):
        return "-" if x is None else ("0" if x == 0 else f"{x:.2e}")

    assert [[row["variant"], row["device"], row["dtype"], row["output"], sci(row["max_abs_error"]),
             sci(row["rel_error"]), *row["bound"].split(), row["result"]] for row in rows] == printed
    assert len(rows) == len(CPU_VARIANTS) * 2 * 5 and all(row["result"] == "PASS" for row in rows)
    with pytest.raises(ValueError, match="variant cpu-fa2 does not compute in f16"):
        flashlab.check(variants="cpu-fa2", dtype="f16")
    skipped = flashlab.check(seq_q=8, head_dim=8, dtype="f16", variants=None)
    assert all(row["result"].startswith("SKIP: ") for row in skipped if row["device"] == "cpu")


def test_check_takes_deterministic():
    args = dict(seq_q=16, head_dim=8, variants=CPU_VARIANTS, backward=True)
    rows = flashlab.check(deterministic=True, **args)
    assert len(rows) == len(CPU_VARIANTS) * 2 * 5 and all(row["result"] == "PASS" for row in rows)
    assert rows == flashlab.check(**args)  # the CPU variants' one order: the same errors to the last bit
    if flashlab.built_with_cuda:
        # Named, cuda-fa2 is refused: on a GPU for its backward's atomics, without one for the missing GPU
        # (check asks whether the forward can run before it asks about the backward).
        available = next(v for v in flashlab.variants() if v["name"] == "cuda-fa2")["available"]
        with pytest.raises(ValueError, match="has no deterministic mode" if available else "needs a CUDA GPU"):
            flashlab.check(deterministic=True, seq_q=16, head_dim=64, dtype="f16", backward=True, variants="cuda-fa2")


def test_within_tolerance_is_the_library_rule():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((2, 5, 3, 8))
    result = flashlab.within_tolerance(ref * (1 + 5e-6), ref, dtype="f32")
    assert result["passes"] and result["rule"] == "rel <= 1e-05"
    assert not flashlab.within_tolerance(ref * (1 + 2e-5), ref, dtype="f32")["passes"]
    # FlashAttention's rule: at most 2x (forward) or 3x (gradients) a low-precision baseline's max error.
    lowp = ref + 1e-2
    assert flashlab.within_tolerance(ref + 1.9e-2, ref, dtype="bf16", lowp=lowp)["passes"]
    assert not flashlab.within_tolerance(ref + 2.1e-2, ref, dtype="bf16", lowp=lowp)["passes"]
    assert flashlab.within_tolerance(ref + 2.9e-2, ref, dtype="f16", quantity="gradient", lowp=lowp)["passes"]
    nan = ref.copy()
    nan[0, 0, 0, 0] = np.nan
    assert not flashlab.within_tolerance(nan, ref, dtype="f64")["passes"]
    with pytest.raises(ValueError, match="unknown quantity 'backward'"):
        flashlab.within_tolerance(ref, ref, dtype="f32", quantity="backward")


def test_the_module_imports_and_runs_without_pytorch():
    # PyTorch hidden from the import system (whether or not it is installed here).
    code = """
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("PyTorch is hidden in this test")
sys.meta_path.insert(0, NoTorch())
import numpy as np
import flashlab
q = np.ones((1, 4, 1, 8))
assert flashlab.attention(q, q, q).shape == (1, 4, 1, 8)
assert "torch" not in sys.modules
try:
    import flashlab.torch
except ImportError as error:
    print(error)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("flashlab.torch needs PyTorch, which this Python cannot import")


# --- flashlab.verify: someone's own attention function through FlashLab's cases and rule ------------------------

import functools  # noqa: E402

import verify_kernels  # noqa: E402

VERIFY_IDS = {"mask": "mask", "alignment": "alignment", "tail": "tail", "rescale": "rescale",
              "lse_base2": "lse-base-2", "group_sum": "group-sum", "scale": "scale"}


def kernel_with(bug):
    fwd = functools.partial(verify_kernels.forward, bug=bug)
    bwd = functools.partial(verify_kernels.backward, bug=bug)
    return fwd, bwd


@pytest.mark.parametrize("seed", [31, 32])
def test_verify_passes_a_correct_function_at_every_seed(seed):
    fwd, bwd = kernel_with(None)
    report = flashlab.verify(fwd, backward=bwd, dtypes=("f32", "f16", "bf16"), head_dims=(32, 64), seed=seed,
                             name="numpy-online-softmax")
    assert report, str(report)
    data = report.as_dict()
    assert data["seed"] == seed and data["failed"] == 0 and data["passed"] == 20
    assert {o["name"] for o in data["cases"][0]["outputs"]} == {"O", "LSE", "dQ", "dK", "dV"}
    assert report.diagnosis is None and data["first_failure"] is None
    assert "20 cases: 20 pass, 0 fail" in str(report)


@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_verify_passes_flashlabs_own_variants_through_the_public_api(variant):
    def fwd(q, k, v, **options):
        if q.dtype == np.float16:
            raise NotImplementedError(f"{variant} computes in f64 or f32")
        return flashlab.attention(q, k, v, variant=variant, return_lse=True, **options)

    def bwd(q, k, v, out, lse, grad_out, **options):
        return flashlab.attention_backward(q, k, v, out, lse, grad_out, variant=variant, **options)

    report = flashlab.verify(fwd, backward=bwd, dtypes=("f32", "f16"), head_dims=(32, 64, 128), seed=34, name=variant)
    data = report.as_dict()
    # The cases take the (dtype, head dim) pairs in turn: the f16 ones are refused, and listed with the reason.
    assert report and data["failed"] == 0 and data["passed"] >= 10, str(report)
    assert data["passed"] + len(data["refused"]) == 20
    assert all(r["dtype"] == "f16" and r["case"] and "computes in f64 or f32" in r["why"] for r in data["refused"])


@pytest.mark.parametrize("bug", verify_kernels.BUGS)
def test_verify_catches_and_names_each_planted_bug(bug):
    fwd, bwd = kernel_with(bug)
    for seed in (41, 42):
        report = flashlab.verify(fwd, backward=bwd, dtypes="f32", head_dims=(32, 64), seed=seed)
        assert not report, str(report)
        assert report.diagnosis["id"] == VERIFY_IDS[bug], str(report)
        first = report.as_dict()["first_failure"]
        assert first is not None and first["ours"] != first["reference"]
        with pytest.raises(AssertionError, match="diagnosis"):
            report.raise_on_failure()


def test_verify_layout_bhsd_and_refusals():
    fwd, _ = kernel_with(None)

    def bhsd_f32_only(q, k, v, **options):  # takes (B, H, S, D) arrays, and f32 only
        if q.dtype != np.float32:
            raise NotImplementedError(f"float32 only, not {q.dtype}")
        o, lse = fwd(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), **options)
        return o.transpose(0, 2, 1, 3), lse

    report = flashlab.verify(bhsd_f32_only, dtypes=("f32", "f16"), head_dims=(64,), layout="bhsd", seed=5)
    data = report.as_dict()
    assert report and data["passed"] == 10 and data["failed"] == 0, str(report)  # every other case is f16
    assert len(data["refused"]) == 10 and all("float32 only" in r["why"] for r in data["refused"])
    assert "refused: f16 d=64 (10 cases): float32 only, not float16" in str(report)


def test_verify_bad_arguments_are_one_sentence():
    fwd, _ = kernel_with(None)
    with pytest.raises(ValueError, match="fn must be a callable"):
        flashlab.verify(42)
    with pytest.raises(ValueError, match="backward='autograd' needs PyTorch tensors: pass device='cuda'"):
        flashlab.verify(fwd, backward="autograd")
    with pytest.raises(ValueError, match="backward must be None, a callable or 'autograd', got 'autograd2'"):
        flashlab.verify(fwd, backward="autograd2")
    with pytest.raises(ValueError, match="bench=True times fn on a CUDA GPU with CUDA events: pass device='cuda'"):
        flashlab.verify(fwd, bench=True)
    with pytest.raises(ValueError, match="bench must be True or False"):
        flashlab.verify(fwd, bench="yes")
    with pytest.raises(ValueError, match="layout is bshd or bhsd"):
        flashlab.verify(fwd, layout="sbhd")
    with pytest.raises(ValueError, match="unknown suite 'huge'"):
        flashlab.verify(fwd, suite="huge")
    with pytest.raises(ValueError, match="not f64"):
        flashlab.verify(fwd, dtypes="f64")


def test_verify_on_torch_tensors_without_pytorch_is_one_sentence(monkeypatch):
    # PyTorch made unimportable in this process (whether or not it is installed): the NumPy path runs as before,
    # and each option that needs torch says so before any case runs.
    monkeypatch.setitem(sys.modules, "torch", None)
    fwd, _ = kernel_with(None)
    assert flashlab.verify(fwd, dtypes="f32", head_dims=(32,), seed=3)
    sentence = "hands fn PyTorch tensors, but this Python cannot import torch: install PyTorch, or leave device out"
    for options in (dict(device="cuda"), dict(device="cpu", backward="autograd"), dict(device="cuda", bench=True)):
        with pytest.raises(ValueError, match=sentence):
            flashlab.verify(fwd, **options)


class _FakeTorch(types.ModuleType):
    """Just enough of `torch` for verify's device check: devices named as PyTorch names them, and `gpus` CUDA
    devices (0: this PyTorch sees none)."""

    def __init__(self, gpus):
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(is_available=lambda: gpus > 0, device_count=lambda: gpus)

    class device:  # noqa: N801 (torch's name)
        def __init__(self, name):
            kind, _, index = str(name).partition(":")
            if kind not in ("cpu", "cuda", "meta", "mps") or (index and not index.isdigit()):
                raise RuntimeError(f"Invalid device string: '{name}'")
            self.type, self.index = kind, int(index) if index else None

        def __str__(self):
            return self.type if self.index is None else f"{self.type}:{self.index}"


def test_verify_on_a_missing_device_is_one_sentence(monkeypatch):
    fwd, _ = kernel_with(None)
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(gpus=0))
    with pytest.raises(ValueError, match="device 'cuda' is missing: this PyTorch sees no CUDA device"):
        flashlab.verify(fwd, device="cuda")
    with pytest.raises(ValueError, match="device must name a PyTorch device such as 'cuda', 'cuda:1' or 'cpu', "
                                         "got 'gpu0'"):
        flashlab.verify(fwd, device="gpu0")
    with pytest.raises(ValueError, match="verify hands fn tensors on 'cuda' or 'cpu', not on 'meta'"):
        flashlab.verify(fwd, device="meta")
    with pytest.raises(ValueError, match="bench=True times fn on a CUDA GPU with CUDA events, not on the cpu"):
        flashlab.verify(fwd, device="cpu", bench=True)
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(gpus=2))
    with pytest.raises(ValueError, match="device 'cuda:2' is missing: this PyTorch sees 2 CUDA device"):
        flashlab.verify(fwd, device="cuda:2")


# --- FP8 (e4m3): what is refused before any GPU is asked for, and the rule it is held to -------------------------

FP8_ROWS = [v["name"] for v in flashlab.variants() if v["e4m3_head_dims"]]


def fp8_refusal(variant, names):
    """The registry's sentence for e4m3 on a row without an FP8 forward (check_e4m3)."""
    if not FP8_ROWS:
        return (f"variant {variant} takes {names}, not e4m3: only cuda-fa3-ws has an FP8 (e4m3) kernel, and this build "
                "has no CUDA")
    return f"variant {variant} takes {names}, not e4m3: only {' and '.join(FP8_ROWS)} has an FP8 (e4m3) kernel"


def test_fp8_rows_are_those_with_e4m3_in_their_dtypes():
    rows = flashlab.variants()
    assert FP8_ROWS == [v["name"] for v in rows if "e4m3" in v["dtypes"]]
    assert FP8_ROWS == (["cuda-fa3-ws"] if flashlab.built_with_cuda else [])
    for v in rows:
        assert v["e4m3_head_dim_values"] == (head_dim_values(v["e4m3_head_dims"]) if v["e4m3_head_dims"] else [])
        assert set(v["e4m3_head_dim_values"]) <= set(v["head_dim_values"])
    if FP8_ROWS:
        assert {128, 256} <= set(rows[[v["name"] for v in rows].index("cuda-fa3-ws")]["e4m3_head_dim_values"])


def test_fp8_on_numpy_values_is_refused_by_the_registry_where_it_cannot_run():
    q, k, v, d_o = random_inputs((1, 8, 2, 128), (1, 8, 2, 128), np.float32, seed=12)
    with pytest.raises(ValueError) as error:
        flashlab.attention(q, k, v, variant="cpu-fa2", dtype="e4m3")
    assert str(error.value) == fp8_refusal("cpu-fa2", "f64 or f32")
    assert str(error.value) == cli_sentence("check", "--variants", "cpu-fa2", "--dtype", "e4m3", "--head-dim", 128,
                                            "--seq-q", 8)
    with pytest.raises(ValueError, match="no FP8 \\(e4m3\\) backward pass|unknown variant 'cuda-fa3-ws'"):
        flashlab.attention_backward(q, k, v, q, np.zeros((1, 2, 8), np.float32), d_o, variant="cuda-fa3-ws",
                                    dtype="e4m3")
    with pytest.raises(ValueError) as error:
        flashlab.attention_backward(q, k, v, q, np.zeros((1, 2, 8), np.float32), d_o, variant="cpu-fa2", dtype="e4m3")
    assert str(error.value) == fp8_refusal("cpu-fa2", "f64 or f32")
    with pytest.raises(ValueError, match="return_quantized returns the e4m3 inputs of an FP8 forward: pass "
                                         "dtype='e4m3' too"):
        flashlab.attention(q, k, v, return_quantized=True)
    with pytest.raises(ValueError, match="dtype is f16 but q, k, v are f32: NumPy arrays compute in their own dtype"):
        flashlab.attention(q, k, v, dtype="f16")
    with pytest.raises(ValueError, match="unknown dtype 'fp4'"):
        flashlab.attention(q, k, v, dtype="fp4")
    with pytest.raises(ValueError, match="q_descale goes with e4m3 tensors in GPU memory"):
        flashlab.attention(q, k, v, dtype="e4m3", variant="cuda-fa3-ws", q_descale=np.ones((1, 2), np.float32))
    assert np.array_equal(flashlab.attention(q, k, v, dtype="f32"), flashlab.attention(q, k, v))


@pytest.mark.skipif(not FP8_ROWS, reason="no row with an FP8 forward in a build without CUDA")
def test_fp8_on_numpy_values_checks_before_it_asks_for_a_gpu():
    # cuda-fa3-ws's e4m3 checks come before its GPU check: these sentences with or without a GPU.
    rng = np.random.default_rng(13)
    d_bad = next(d for d in (32, 96, 200) if d not in flashlab.variants()[[v["name"] for v in flashlab.variants()]
                                                                         .index("cuda-fa3-ws")]["e4m3_head_dim_values"])
    q = rng.standard_normal((1, 8, 2, d_bad)).astype(np.float32)
    with pytest.raises(ValueError, match=f"variant cuda-fa3-ws does not support head_dim {d_bad} in e4m3: the FP8 "
                                         "kernel takes head dims"):
        flashlab.attention(q, q, q, variant="cuda-fa3-ws", dtype="e4m3")
    q = rng.standard_normal((1, 8, 2, 128)).astype(np.float32)
    with pytest.raises(ValueError, match="variant cuda-fa3-ws has no dropout in its FP8 \\(e4m3\\) kernel"):
        flashlab.attention(q, q, q, variant="cuda-fa3-ws", dtype="e4m3", dropout_p=0.1)
    with pytest.raises(ValueError) as error:
        flashlab.attention(q, q, q, variant="cuda-fa2", dtype="e4m3")
    assert str(error.value) == fp8_refusal("cuda-fa2", "f16 or bf16")


E4M3_BYTES = dict(dtype="uint8")  # e4m3 bytes as a producer without float8 in its DLPack exports them


def fake_fp8(shape=(1, 8, 2, 128), **kwargs):
    return FakeDeviceTensor(shape, **{"dtype": "float8_e4m3fn", **kwargs})


def descales(q_heads=2, kv_heads=2, **kwargs):
    return dict(q_descale=FakeDeviceTensor((1, q_heads), **kwargs), k_descale=FakeDeviceTensor((1, kv_heads), **kwargs),
                v_descale=FakeDeviceTensor((1, kv_heads), **kwargs))


FP8_DEVICE_INPUTS = [
    # (what, q, k, v, keyword arguments, the sentence's telling part, whether flashlab.attention refuses it before the
    # variant is looked up). Every tensor says it is on a GPU; every call is refused before any kernel runs or any
    # result is allocated.
    ("uint8 without dtype", fake(**E4M3_BYTES, shape=(1, 8, 2, 128)), fake_fp8(), fake_fp8(), {},
     "q has dtype uint8: pass dtype='e4m3' to have uint8 tensors read as e4m3 bytes", False),
    ("int32", fake(dtype="int32"), fake(), fake(), {},
     "q has dtype int32: supported are float64, float32, float16 and bfloat16, and for the FP8 forward float8_e4m3fn",
     False),
    ("float8_e5m2", fake_fp8(dtype="float8_e5m2"), fake_fp8(), fake_fp8(), {}, "q has dtype float8_e5m2: supported are",
     False),
    ("e4m3 and bf16", fake_fp8(), fake_fp8(), fake(dtype="bfloat16", shape=(1, 8, 2, 128)), {},
     "q is e4m3 but v is bf16: pass them in one dtype", False),
    ("dtype e4m3 on bf16 tensors", *(fake(dtype="bfloat16", shape=(1, 8, 2, 128)) for _ in range(3)), {"dtype": "e4m3"},
     "dtype is e4m3 but q, k, v are bf16: GPU tensors compute in their own dtype", False),
    ("descales with bf16 tensors", *(fake(dtype="bfloat16", shape=(1, 8, 2, 128)) for _ in range(3)), descales(),
     "q_descale, k_descale and v_descale are the FP8 forward's, but q, k, v are bf16", False),
    ("a CPU variant", fake_fp8(), fake_fp8(), fake_fp8(), {"variant": "cpu-fa2", **descales()},
     "variant cpu-fa2 runs on the CPU, so its tensors must be in host memory", False),
    ("non-contiguous e4m3", fake_fp8(strides=(2048, 512, 128, 1)), fake_fp8(), fake_fp8(), descales(),
     "q is not contiguous (its strides are (2048, 512, 128, 1) elements", False),
    ("descale in host memory", fake_fp8(), fake_fp8(), fake_fp8(), {"q_descale": np.ones((1, 2), np.float32)},
     "q_descale is in host memory but q is in device memory", True),
    ("return_quantized", fake_fp8(), fake_fp8(), fake_fp8(), {"return_quantized": True, **descales()},
     "return_quantized returns the e4m3 bytes that dtype='e4m3' makes from NumPy values", True),
]


@pytest.mark.parametrize("what, q, k, v, kwargs, sentence, before_variant", FP8_DEVICE_INPUTS,
                         ids=[d[0] for d in FP8_DEVICE_INPUTS])
def test_fp8_device_tensors_are_checked_before_any_kernel(what, q, k, v, kwargs, sentence, before_variant):
    kwargs = {"variant": "cuda-fa3-ws", **kwargs}
    with pytest.raises(ValueError) as error:
        flashlab.attention(q, k, v, **kwargs)
    if not FP8_ROWS and kwargs["variant"] == "cuda-fa3-ws" and not before_variant:
        # A build without CUDA has no cuda-fa3-ws row: the name is refused before the tensors are read.
        assert str(error.value).startswith("unknown variant 'cuda-fa3-ws'")
    else:
        assert sentence in str(error.value)
    assert "\n" not in str(error.value)
    for t in (q, k, v):  # every capsule taken was handed back to its producer
        assert t.returned == t.taken()


@pytest.mark.skipif(not FP8_ROWS, reason="no row with an FP8 forward in a build without CUDA")
def test_fp8_descales_are_checked_before_the_gpu_is_asked_for():
    cases = [
        ({"k_descale": FakeDeviceTensor((1, 2))},
         "variant cuda-fa3-ws's FP8 (e4m3) forward needs q_descale, k_descale and v_descale (one float32 per (batch, "
         "head): (B, H_q) for q, (B, H_kv) for k and v; 1 for bytes stored unscaled), and q_descale and v_descale "
         "are missing"),
        (descales(q_heads=2), "q_descale has shape (1, 2) but the problem needs (B, H_q) = (1, 4): one descale per "
                              "(batch, head)"),
        (descales(q_heads=4, kv_heads=4), "k_descale has shape (1, 4) but the problem needs (B, H_kv) = (1, 2)"),
        (descales(q_heads=4, dtype="float16"), "q_descale is f16 but descales are float32"),
        (descales(q_heads=4, device_id=1), "q_descale is on CUDA device 1 but q is on CUDA device 0"),
        # An axis of extent 1 takes any stride: these descales pass, and the call is refused for the missing GPU, or
        # on a GPU for q's address (8 bytes past a 16-byte boundary), after every check and before any kernel.
        (dict(descales(q_heads=4), v_descale=FakeDeviceTensor((1, 2), strides=(7, 1))), None),
        (dict(descales(q_heads=4), v_descale=FakeDeviceTensor((2, 2), strides=(1, 2))),
         "v_descale has shape (2, 2) but the problem needs (B, H_kv) = (1, 2)"),
    ]
    available = flashlab.variants()[[v["name"] for v in flashlab.variants()].index("cuda-fa3-ws")]["available"]
    for kwargs, sentence in cases:
        tensors = [fake_fp8((1, 8, 4, 128), data=0x10008), fake_fp8(), fake_fp8(), *kwargs.values()]
        with pytest.raises(ValueError) as error:
            flashlab.attention(*tensors[:3], variant="cuda-fa3-ws", **kwargs)
        if sentence is None and available:
            assert str(error.value) == ("q starts at a GPU address that is not a multiple of 16 bytes (a view at an "
                                        "offset into a larger tensor?): the kernels load 16-byte vectors, so pass a "
                                        "copy")
        elif sentence is None:  # no GPU, or not a Hopper one
            assert str(error.value) == "the tensors are on CUDA device 0 but this machine has no CUDA device" \
                if flashlab.cuda_device_count() == 0 else "variant cuda-fa3-ws needs a Hopper GPU" in str(error.value)
        else:
            assert str(error.value) == sentence if "missing" in sentence else sentence in str(error.value)
        for t in tensors:
            assert t.returned == t.taken()


@pytest.mark.skipif(not FP8_ROWS, reason="no row with an FP8 forward in a build without CUDA")
def test_fp8_backward_is_the_registry_sentence_for_gpu_tensors_too():
    bf16 = lambda shape: fake(dtype="bfloat16", shape=shape)
    with pytest.raises(ValueError) as error:
        flashlab.attention_backward(fake_fp8(), fake_fp8(), fake_fp8(), bf16((1, 8, 2, 128)),
                                    FakeDeviceTensor((1, 2, 8)), bf16((1, 8, 2, 128)), variant="cuda-fa3-ws")
    assert str(error.value) == ("variant cuda-fa3-ws has no FP8 (e4m3) backward pass (FlashAttention-3 ships no FP8 "
                                "backward either): FP8 is forward only, so run the backward in bf16")


def e4m3_grid_values(shape, rng, power):
    """Values that quantize_e4m3_per_head keeps exactly: e4m3 values times 2^power, each (batch, head) slice holding
    +-448 x 2^power as its amax, so its scale is 2^-power and its descale 2^power (both exact). On them the FP8
    forward's operands ARE the values: the rule's reference is attention on these values."""
    grid = np.array([x for b in range(256) if not np.isnan(x := e4m3_value(b))])
    x = rng.choice(grid, size=shape) * 2.0 ** power
    x[:, 0, :, 0] = 448 * 2.0 ** power
    return x


def e4m3_value(b):
    e, m, s = (b >> 3) & 0xF, b & 7, -1.0 if b & 0x80 else 1.0
    if e == 0xF and m == 7:
        return float("nan")
    return s * (m * 2.0 ** -9 if e == 0 else (8 + m) * 2.0 ** (e - 10))


def test_within_fp8_rule_passes_exact_attention_and_catches_an_error_past_its_limit():
    rng = np.random.default_rng(21)
    q = e4m3_grid_values((1, 150, 4, 32), rng, -8)
    k, v = (e4m3_grid_values((1, 140, 2, 32), rng, -8) for _ in range(2))
    options = dict(is_causal=True, causal_align="bottom-right")
    o, lse = flashlab.attention(q, k, v, variant="cpu-naive", return_lse=True, **options)  # exact, in float64
    result = flashlab.within_fp8_rule(q, k, v, o, lse, **options)
    assert result["emulation_passes"]
    assert result["o_max_abs_error"] < 1e-12 and result["lse_max_abs_error"] < 1e-12
    assert result["o_limit"] == 2 * result["emulation_o_max_abs_error"] > 0 and result["passes"]
    worse = o.copy()
    worse[0, 7, 1, 3] += 1.01 * result["o_limit"]
    assert not flashlab.within_fp8_rule(q, k, v, worse, lse, **options)["passes"]
    lse_worse = lse.copy()
    lse_worse[0, 1, 100] += 1.01 * result["lse_limit"]  # (rows below 10 see no key: their LSE is -inf)
    assert not flashlab.within_fp8_rule(q, k, v, o, lse_worse, **options)["passes"]
    # The same in (B, H, S, D).
    to_bhsd = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    again = flashlab.within_fp8_rule(*map(to_bhsd, (q, k, v, o)), lse, layout="bhsd", **options)
    assert again == result
    with pytest.raises(ValueError, match="lse has shape \\(1, 4, 149\\) but the problem needs \\(1, 4, 150\\)"):
        flashlab.within_fp8_rule(q, k, v, o, lse[..., 1:], **options)


# --- variant="auto" and flashlab.explain ---------------------------------------------------------------------------

AUTO_NAMES = [name for name, _ in flashlab.AUTO_ORDER]


def cpu_row(name="cpu-fa2", **changes):
    """A row of the variant table as variants() gives it, with changes: a table built to rule a variant out."""
    return dict(next(v for v in flashlab.variants() if v["name"] == name), **changes)


def test_every_row_of_the_table_has_a_place_in_auto_order():
    assert len(AUTO_NAMES) == len(set(AUTO_NAMES))
    assert [v["name"] for v in flashlab.variants() if v["name"] not in AUTO_NAMES] == []
    assert all(why for _, why in flashlab.AUTO_ORDER)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("problem", PROBLEMS, ids=["gqa", "bottom-right-dropout", "top-left-dropout"])
@pytest.mark.parametrize("backward", [False, True])
def test_explain_on_numpy_arrays_picks_the_first_cpu_variant_of_auto_order(dtype, problem, backward):
    shape_q, shape_kv, causal, dropout = problem
    q, k, v, _ = random_inputs(shape_q, shape_kv, dtype, seed=2)
    e = flashlab.explain(q, k, v, is_causal=causal is not None, dropout_p=dropout, backward=backward)
    cpu = [name for name in AUTO_NAMES if name in CPU_VARIANTS]
    assert e.choice == cpu[0] == "cpu-fa2" and e.refusal == ""
    assert list(e.reasons) == [n for n in AUTO_NAMES] + [v["name"] for v in flashlab.variants() if v["name"] not in
                                                          AUTO_NAMES]
    assert e.reasons["cpu-fa2"].startswith("chosen: the first in auto's order that can run this problem")
    for name in cpu[1:]:
        assert e.reasons[name].startswith(f"{name} can run this problem too, but ranks below cpu-fa2 in auto's order")
    for name in AUTO_NAMES:  # never a CUDA variant for arrays in host memory
        if name.startswith("cuda-"):
            assert "can run" not in e.reasons[name] and e.reasons[name].startswith(name + " ")
    assert e.problem == dict(dtype={np.float64: "f64", np.float32: "f32"}[dtype], head_dim=shape_q[3],
                             heads_q=shape_q[2], heads_kv=shape_kv[2], causal=causal is not None, dropout_p=dropout,
                             backward=backward, deterministic=False, where="host memory")
    lines = str(e).splitlines()
    assert lines[0].startswith("variant='auto' picks cpu-fa2 for: ") and len(lines) == 3 + len(e.reasons)


def test_explain_reads_bhsd_and_host_tensors_that_require_grad():
    class HostTensor:  # a CPU tensor of another library, as PyTorch's with requires_grad=True looks to explain
        def __init__(self, array):
            self.array, self.shape, self.dtype, self.requires_grad = array, array.shape, array.dtype, True

        def detach(self):
            return self.array

    q, k, v, _ = random_inputs((1, 4, 16, 64), (1, 2, 16, 64), np.float32, seed=3)  # (B, H, S, D)
    e = flashlab.explain(HostTensor(q), HostTensor(k), HostTensor(v), layout="bhsd", is_causal=True)
    assert e.choice == "cpu-fa2" and (e.problem["heads_q"], e.problem["heads_kv"], e.problem["head_dim"]) == (4, 2, 64)
    with pytest.raises(ValueError, match="q has shape \\(4, 16, 64\\) but inputs must be 4-d"):
        flashlab.explain(q[0], k, v)
    with pytest.raises(ValueError, match="unknown layout 'sbhd'"):
        flashlab.explain(q, k, v, layout="sbhd")


def test_explain_on_torch_tensors():
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 2, 8, 32, dtype=torch.float64, requires_grad=True)
    assert flashlab.explain(q, q, q, layout="bhsd", backward=True).choice == "cpu-fa2"
    assert flashlab.explain(q.half(), q.half(), q.half()).choice is None


# (what, the table explain sees (None: the real one), the problem, the sentence that rules cpu-fa2 or its stand-in out)
REASONS = [
    ("dtype", None, dict(dtype=np.float16), "cpu-fa2 computes in f64 or f32, not f16"),
    ("e4m3", None, dict(options=dict(dtype="e4m3")), "cpu-fa2 computes in f64 or f32, not e4m3"),
    ("head dim", None, dict(head_dim=300), "cpu-fa2 takes head dims 1..256, not 300"),
    ("causal", [cpu_row(causal=False)], dict(options=dict(is_causal=True)), "cpu-fa2 has no causal mask"),
    ("gqa", [cpu_row(gqa=False)], dict(heads_kv=1),
     "cpu-fa2 needs as many key/value heads as query heads (no grouped-query attention), and this problem has 2 and 1"),
    ("dropout", [cpu_row(dropout=False)], dict(options=dict(dropout_p=0.1)),
     "cpu-fa2 has no dropout, and dropout_p is 0.1"),
    ("no backward", [cpu_row(backward=False)], dict(options=dict(backward=True)),
     "cpu-fa2 has no backward pass (it is forward only)"),
    ("backward head dims", [cpu_row(backward_head_dim_values=[32, 64], backward_head_dims="32, 64")],
     dict(options=dict(backward=True)), "cpu-fa2's backward takes head dims 32, 64, not 16"),
    ("deterministic", [cpu_row(deterministic=False)], dict(options=dict(backward=True, deterministic=True)),
     "cpu-fa2's backward adds dQ with atomics and has no deterministic mode"),
    ("device: GPU tensors", None, dict(gpu=True),
     "cpu-fa2 runs on the CPU, and the tensors are in CUDA device memory: auto never moves them"),
    ("device: host arrays", [cpu_row(name="cpu-fa2", device="cuda")], {},
     "cpu-fa2 runs on a CUDA GPU, and the tensors are in host memory: auto keeps them there (naming the variant "
     "copies them to the GPU and back)"),
    ("no GPU", [cpu_row(device="cuda", available=False)], dict(gpu=True, gpus=0),
     "cpu-fa2 needs a CUDA GPU and this machine has none"),
    ("compute capability", [cpu_row(device="cuda", available=False, needs_compute_capability=90)],
     dict(gpu=True, gpus=1), "cpu-fa2 needs a GPU of compute capability 9.0, and this GPU (NVIDIA A100) has another"),
]


@pytest.mark.parametrize("what, table, problem, sentence", REASONS, ids=[r[0] for r in REASONS])
def test_each_reason_rules_out_the_variant_it_was_built_for(monkeypatch, what, table, problem, sentence):
    if table is not None:
        monkeypatch.setattr(flashlab, "variants", lambda: table)
    monkeypatch.setattr(flashlab, "cuda_device_count", lambda: problem.get("gpus", 0))
    monkeypatch.setattr(flashlab, "cuda_device_name", lambda: "NVIDIA A100")
    shape_q, shape_kv = (1, 8, 2, problem.get("head_dim", 16)), (1, 8, problem.get("heads_kv", 2),
                                                                 problem.get("head_dim", 16))
    if problem.get("gpu"):
        q, k, v = fake(shape_q, dtype="float32"), fake(shape_kv), fake(shape_kv)
    else:
        q, k, v, _ = random_inputs(shape_q, shape_kv, problem.get("dtype", np.float32), seed=5)
    e = flashlab.explain(q, k, v, **problem.get("options", {}))
    assert e.reasons["cpu-fa2"] == sentence
    assert e.choice != "cpu-fa2"
    if table is not None and not problem.get("gpu"):  # cpu-fa2 (or its stand-in) is the table's one row
        assert e.choice is None
        assert e.refusal == "variant='auto' finds no variant that can run this problem here: " + sentence
        # The same problem with the row as variants() has it: chosen.
        monkeypatch.undo()
        assert flashlab.explain(q, k, v, **problem.get("options", {})).choice == "cpu-fa2"


def test_auto_takes_the_next_variant_of_the_order_that_can_run_the_problem(monkeypatch):
    table = [cpu_row("cpu-naive"), cpu_row("cpu-fa1"), cpu_row("cpu-fa2", dropout=False)]
    monkeypatch.setattr(flashlab, "variants", lambda: table)
    q, k, v, d_o = random_inputs((1, 13, 4, 16), (1, 21, 2, 16), np.float64, seed=6)
    options = dict(is_causal=True, causal_align="bottom-right", dropout_p=0.2, seed=3)
    e = flashlab.explain(q, k, v, **options_for_explain(options))
    assert e.choice == "cpu-fa1" and e.reasons["cpu-fa2"] == "cpu-fa2 has no dropout, and dropout_p is 0.2"
    assert e.reasons["cpu-naive"].startswith("cpu-naive can run this problem too, but ranks below cpu-fa1")
    o, lse = flashlab.attention(q, k, v, variant="auto", return_lse=True, **options)
    want_o, want_lse = flashlab.attention(q, k, v, variant="cpu-fa1", return_lse=True, **options)
    assert np.array_equal(o, want_o) and np.array_equal(lse, want_lse)
    grads = flashlab.attention_backward(q, k, v, o, lse, d_o, variant="auto", **options)
    for got, want in zip(grads, flashlab.attention_backward(q, k, v, o, lse, d_o, variant="cpu-fa1", **options)):
        assert np.array_equal(got, want)
    table[1] = cpu_row("cpu-fa1", backward=False)  # the backward now finds cpu-naive, the forward still cpu-fa1
    assert flashlab.explain(q, k, v, backward=True, **options_for_explain(options)).choice == "cpu-naive"
    assert flashlab.explain(q, k, v, **options_for_explain(options)).choice == "cpu-fa1"
    ran = []  # the variant each call hands the library
    for call in ("forward_host", "backward_host"):
        real = getattr(flashlab._native, call)
        def spy(*args, real=real):
            ran.append(next(a for a in args if isinstance(a, str)))  # the first name of the call's arguments
            return real(*args)
        monkeypatch.setattr(flashlab._native, call, spy)
    flashlab.attention(q, k, v, variant="auto", **options)
    flashlab.attention_backward(q, k, v, o, lse, d_o, variant="auto", **options)
    assert ran == ["cpu-fa1", "cpu-naive"]


def options_for_explain(options):
    return {name: value for name, value in options.items() if name in ("is_causal", "causal_align", "dropout_p")}


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_auto_computes_what_the_variant_explain_names_computes(layout):
    q, k, v, d_o = random_inputs((2, 13, 4, 16), (2, 21, 2, 16), np.float32, seed=7)
    if layout == "bhsd":
        q, k, v, d_o = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v, d_o))
    options = dict(is_causal=True, causal_align="bottom-right", dropout_p=0.1, seed=9, layout=layout)
    named = flashlab.explain(q, k, v, is_causal=True, dropout_p=0.1, layout=layout, backward=True).choice
    o, lse = flashlab.attention(q, k, v, variant="auto", return_lse=True, **options)
    want_o, want_lse = flashlab.attention(q, k, v, variant=named, return_lse=True, **options)
    assert np.array_equal(o, want_o) and np.array_equal(lse, want_lse)
    for got, want in zip(flashlab.attention_backward(q, k, v, o, lse, d_o, variant="auto", **options),
                         flashlab.attention_backward(q, k, v, o, lse, d_o, variant=named, **options)):
        assert np.array_equal(got, want)


def test_a_problem_nothing_runs_is_one_sentence_naming_the_closest_reasons():
    q16 = np.zeros((1, 8, 2, 64), np.float16)  # a head dim cuda-fa2 takes
    with pytest.raises(ValueError) as error:
        flashlab.attention(q16, q16, q16, variant="auto")
    sentence = str(error.value)
    assert sentence == flashlab.explain(q16, q16, q16).refusal and "\n" not in sentence
    assert sentence.startswith("variant='auto' finds no variant that can run this problem here: ")
    if not flashlab.built_with_cuda:
        assert sentence.endswith(": cpu-fa2 computes in f64 or f32, not f16 (likewise cpu-fa1 and cpu-naive)")
    else:  # the closest are the f16 CUDA variants, ruled out only because the arrays are in host memory
        assert "cuda-fa2" in sentence and "the tensors are in host memory" in sentence
    wide = np.zeros((1, 8, 2, 300))
    with pytest.raises(ValueError) as error:
        flashlab.attention_backward(wide, wide, wide, wide, np.zeros((1, 2, 8)), wide, variant="auto")
    assert "cpu-fa2 takes head dims 1..256, not 300 (likewise cpu-fa1 and cpu-naive)" in str(error.value)
    # GPU tensors: refused before any capsule is taken.
    tensors = [fake(), fake(), fake()]
    with pytest.raises(ValueError) as error:
        flashlab.attention(*tensors, variant="auto")
    assert str(error.value) == flashlab.explain(*tensors).refusal and "\n" not in str(error.value)
    if not flashlab.built_with_cuda:
        assert str(error.value).endswith(": cuda-fa3-ws is not in this build (it was built without CUDA) (likewise "
                                         + ", ".join(AUTO_NAMES[1:9]) + " and cuda-fa1)")
    assert all(t.taken() == 0 for t in tensors)
