"""`import flashlab` on the CPU (CTest label cpu): every CPU variant from NumPy computes what `flashlab run`
computes on the same inputs, gradients agree with finite differences, bad input raises ValueError with
the library's sentence (the CLI's own where both take the input), flashlab.check() and variants() are the
CLI's tables, and the module imports where PyTorch is absent. FLASHLAB_BIN names the `flashlab` binary
of the same build (CTest sets it)."""
import os
import subprocess
import sys

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
    with pytest.raises(ValueError, match="needs PyTorch tensors"):
        flashlab.verify(fwd, backward="autograd")
    with pytest.raises(ValueError, match="layout is bshd or bhsd"):
        flashlab.verify(fwd, layout="sbhd")
    with pytest.raises(ValueError, match="unknown suite 'huge'"):
        flashlab.verify(fwd, suite="huge")
    with pytest.raises(ValueError, match="not f64"):
        flashlab.verify(fwd, dtypes="f64")
