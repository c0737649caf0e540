"""python/flashlab/_sdpa_timer.py, the child process `flashlab verify --bench` times PyTorch's SDPA in (CTest label
cpu), without PyTorch: the request's checks (defaults filled in, each bad field named), and, run by path as the CLI
runs it, the one JSON reply it prints where torch does not import or sees no CUDA device (planted `torch` packages
first on PYTHONPATH, so the result is the same where PyTorch is installed). It needs neither FlashLab's module nor
PyTorch."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

TIMER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "flashlab", "_sdpa_timer.py")


def load_timer():
    spec = importlib.util.spec_from_file_location("sdpa_timer_under_test", TIMER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


timer = load_timer()

PROBLEM = {"dtype": "bf16", "batch": 4, "heads_q": 16, "heads_kv": 16, "seq_q": 1024, "seq_k": 1024, "head_dim": 128,
           "causal": "top-left", "scale": 0.088, "backward": True}


def request(**changes):
    r = {"device": "cuda", "warmup": 1, "runs": 3, "slow_run_ms": 1000, "problems": [dict(PROBLEM)]}
    r.update(changes)
    return json.dumps(r)


def run_timer(text, torch_package=None, tmp_path=None, args=()):
    """The timer run by path, as the CLI runs it, from another folder, with `torch_package` ({file: source}) first
    on PYTHONPATH. Returns (exit status, the reply parsed, stderr)."""
    env = dict(os.environ)
    if torch_package is not None:
        for name, source in torch_package.items():
            path = tmp_path / "planted" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path / "planted"), env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, TIMER, *args], input=text, capture_output=True, text=True, env=env,
                       cwd=tmp_path or os.getcwd())
    lines = r.stdout.strip().splitlines()
    return r.returncode, json.loads(lines[-1]) if lines else None, r.stderr


def test_a_request_is_read_with_its_defaults():
    settings = timer.read_request(json.dumps({"problems": [{k: v for k, v in PROBLEM.items()
                                                            if k not in ("causal", "scale", "backward")}]}))
    assert settings["device"] == "cuda"
    assert (settings["warmup"], settings["runs"]) == (timer.WARMUP, timer.RUNS)
    p = settings["problems"][0]
    assert p["causal"] == "none" and p["backward"] is False
    assert p["scale"] == pytest.approx(1 / 128 ** 0.5)
    given = timer.read_request(request(device="cpu"))
    assert given["device"] == "cpu" and given["runs"] == 3 and given["slow_run_ms"] == 1000
    assert given["problems"][0] == PROBLEM


@pytest.mark.parametrize("text, says", [
    ("not json", "it is not JSON"),
    ("[1, 2]", "it is not a JSON object"),
    (request(device="tpu"), "device is 'tpu'"),
    (request(runs=0), "runs is 0"),
    (request(warmup=1.5), "warmup is 1.5"),
    (request(warmup=True), "warmup is True"),
    (request(problems=None), "it has no list of problems"),
    (request(problems=[7]), "problem 0 is not a JSON object"),
    (request(problems=[dict(PROBLEM, seq_q=0)]), "problem 0 has seq_q 0"),
    (request(problems=[dict(PROBLEM, head_dim="128")]), "problem 0 has head_dim '128'"),
    (request(problems=[dict(PROBLEM, heads_kv=3)]), "heads_q 16, not a multiple of heads_kv 3"),
    (request(problems=[dict(PROBLEM, dtype="f64")]), "problem 0 has dtype 'f64'"),
    (request(problems=[dict(PROBLEM, causal="yes")]), "problem 0 has causal 'yes'"),
    (request(problems=[dict(PROBLEM, scale=float("nan"))]), "problem 0 has scale nan"),
    (request(problems=[dict(PROBLEM, backward=1)]), "problem 0 has backward 1"),
])
def test_a_bad_request_is_one_sentence_naming_what_is_wrong(text, says):
    with pytest.raises(timer.RequestError) as error:
        timer.read_request(text)
    message = str(error.value)
    assert message.startswith("could not read the request: ") and says in message and "\n" not in message
    assert timer.reply_for(text) == {"ok": False, "error": message}


def test_run_by_path_where_torch_does_not_import_it_prints_the_reply_the_cli_reads(tmp_path):
    # Run by path, the timer's own folder holds flashlab's torch.py: the planted package must be what it imports.
    status, reply, stderr = run_timer(request(), {"torch/__init__.py": "raise ImportError('planted')\n"}, tmp_path)
    assert status == 0, stderr
    assert reply == {"ok": False, "error": "cannot import torch (ImportError: planted); --python names an interpreter "
                                           "that has PyTorch"}


def test_run_by_path_where_torch_sees_no_cuda_device(tmp_path):
    fake_torch = {
        "torch/__init__.py": "__version__ = '0.0-planted'\nfrom . import cuda, nn\n",
        "torch/cuda.py": "def is_available():\n    return False\n",
        "torch/nn/__init__.py": "from . import functional\n",
        "torch/nn/functional.py": "def scaled_dot_product_attention(*args, **kwargs):\n    raise AssertionError\n",
    }
    status, reply, stderr = run_timer(request(), fake_torch, tmp_path)
    assert status == 0, stderr
    assert reply["ok"] is False
    assert reply["error"].startswith("has torch 0.0-planted, which sees no CUDA device")
    # A bad request is answered before torch is imported at all.
    status, reply, _ = run_timer(request(runs=-1), fake_torch, tmp_path)
    assert status == 0 and reply["ok"] is False and "runs is -1" in reply["error"]


def test_the_request_from_a_file_and_bad_arguments(tmp_path):
    status, reply, _ = run_timer("", None, tmp_path, args=("--request", str(tmp_path / "missing.json")))
    assert status == 0
    assert reply["ok"] is False and "could not read the request" in reply["error"] and "missing.json" in reply["error"]
    (tmp_path / "bad.json").write_text("{")
    status, reply, _ = run_timer("", None, tmp_path, args=("--request", str(tmp_path / "bad.json")))
    assert status == 0 and "it is not JSON" in reply["error"]
    status, reply, stderr = run_timer("", None, tmp_path, args=("--no-such-option",))
    assert status == 2 and reply is None and "unrecognized arguments" in stderr
