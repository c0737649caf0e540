"""PyTorch's scaled_dot_product_attention timed on the problems `flashlab verify --bench` timed a plugin on, so that
the CLI, which cannot link PyTorch, can put SDPA's row in its table. The CLI runs this file by path in a child process
(`python3 .../python/flashlab/_sdpa_timer.py`, or the interpreter --python names), so it imports nothing of
FlashLab's (not even the package: its __init__ needs the compiled module), only PyTorch.

    _sdpa_timer.py [--request FILE]      the request as JSON on stdin, or in FILE; the reply as JSON on stdout

The request:
    {"device": "cuda" | "cpu", "warmup": 1, "runs": 3, "slow_run_ms": 1000,
     "problems": [{"dtype": "f32" | "f16" | "bf16", "batch": B, "heads_q": H, "heads_kv": H_kv, "seq_q": N,
                   "seq_k": N_k, "head_dim": d, "causal": "none" | "top-left" | "bottom-right", "scale": s,
                   "backward": true | false}, ...]}
warmup, runs and slow_run_ms may be left out (then flashlab.verify's bench protocol: 3 warm-up calls, the median of
10). The reply, one JSON object:
    {"ok": true, "torch": torch.__version__, "device": the GPU's name or "the host CPU",
     "clock": "CUDA events" | "a host clock", "threads": torch.get_num_threads() (on the CPU only),
     "results": [{"forward_ms": ms | null, "forward_backend": "flash" | "cudnn" | ... | null,
                  "forward_backward_ms": ms | null, "forward_backward_backend": ..., "note": text | null}, ...]}
                                                                                one result per problem, in order
    {"ok": false, "error": "cannot import torch (ModuleNotFoundError: No module named 'torch')"}
A result's time is null where SDPA did not run that problem, with the first line of why in "note"; a backend is
null where PyTorch does not say which it picks. "error" is a clause whose subject is the interpreter: the CLI prints
"`python3` " before it.

How it times, as flashlab.verify's bench does (python/flashlab/_verify_torch.py): Q, K, V and dO drawn with randn in
(B, S, H, D) memory, SDPA given (B, H, S, D) views of it; each call alone between two CUDA events on the current
stream (on the CPU, a host clock); the median of `runs` calls after `warmup` (one timed call when the last warm-up
took over slow_run_ms, as the CLI does); the forward under torch.no_grad, forward + backward as one
torch.autograd.grad of SDPA's output for dO. The exit status is 0 whenever a reply was printed, ok or not.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

DTYPES = ("f32", "f16", "bf16")
CAUSAL = ("none", "top-left", "bottom-right")
SIZES = ("batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim")
# flashlab.verify's bench protocol (_verify_torch.py: WARMUP, RUNS), for a request that names none.
WARMUP, RUNS = 3, 10
# PyTorch's names of SDPA's backends, as the table shows them.
BACKEND_LABELS = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient", "CUDNN_ATTENTION": "cudnn",
                  "MATH": "math", "OVERRIDEABLE": "overrideable"}


class RequestError(ValueError):
    """A request this timer cannot read: the sentence says what is wrong."""


def read_request(text):
    """The request's JSON text checked and completed with the defaults; RequestError says what is wrong."""
    try:
        request = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(f"could not read the request: it is not JSON ({error})") from None
    if not isinstance(request, dict):
        raise RequestError("could not read the request: it is not a JSON object")
    device = request.get("device", "cuda")
    if device not in ("cuda", "cpu"):
        raise RequestError(f"could not read the request: device is {device!r}, and the timer takes 'cuda' or 'cpu'")
    settings = {"device": device}
    for key, default, least in (("warmup", WARMUP, 0), ("runs", RUNS, 1), ("slow_run_ms", math.inf, 0)):
        value = request.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= least or \
                (key != "slow_run_ms" and not float(value).is_integer()):
            raise RequestError(f"could not read the request: {key} is {value!r}, and it takes a "
                               f"{'number' if key == 'slow_run_ms' else 'whole number'} of at least {least}")
        settings[key] = value if key == "slow_run_ms" else int(value)
    problems = request.get("problems")
    if not isinstance(problems, list):
        raise RequestError("could not read the request: it has no list of problems")
    settings["problems"] = [read_problem(p, n) for n, p in enumerate(problems)]
    return settings


def read_problem(problem, n):
    def wrong(what):
        return RequestError(f"could not read the request: problem {n} {what}")
    if not isinstance(problem, dict):
        raise wrong("is not a JSON object")
    for key in SIZES:
        value = problem.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise wrong(f"has {key} {value!r}, and sizes are whole numbers of at least 1")
    if problem["heads_q"] % problem["heads_kv"]:
        raise wrong(f"has heads_q {problem['heads_q']}, not a multiple of heads_kv {problem['heads_kv']}")
    if problem.get("dtype") not in DTYPES:
        raise wrong(f"has dtype {problem.get('dtype')!r}, and SDPA is timed in {', '.join(DTYPES)}")
    if problem.get("causal", "none") not in CAUSAL:
        raise wrong(f"has causal {problem.get('causal')!r}, and the timer takes {', '.join(CAUSAL)}")
    scale = problem.get("scale", 1 / math.sqrt(problem["head_dim"]))
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise wrong(f"has scale {scale!r}, which is not a finite number")
    backward = problem.get("backward", False)
    if not isinstance(backward, bool):
        raise wrong(f"has backward {backward!r}, which is not true or false")
    return dict({key: problem[key] for key in SIZES}, dtype=problem["dtype"], causal=problem.get("causal", "none"),
                scale=float(scale), backward=backward)


def import_torch(device):
    """(torch, None), or (None, the sentence why SDPA cannot be timed on `device` by this interpreter)."""
    try:
        import torch
        import torch.nn.functional  # noqa: F401 (scaled_dot_product_attention)
    except Exception as error:  # noqa: BLE001 (a broken install raises more than ImportError)
        return None, (f"cannot import torch ({type(error).__name__}: {first_line(error)}); "
                      "--python names an interpreter that has PyTorch")
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return None, f"has torch {torch.__version__}, which has no scaled_dot_product_attention (PyTorch 2.0 added it)"
    if device == "cuda" and not torch.cuda.is_available():
        return None, (f"has torch {torch.__version__}, which sees no CUDA device (torch.cuda.is_available() is "
                      "False), so SDPA cannot run beside a plugin on CUDA memory")
    return torch, None


def first_line(error):
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


class Clock:
    """One call's milliseconds: between two CUDA events on the current stream, or by a host clock on the CPU."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device == "cuda"

    def ms(self, call):
        if not self.cuda:
            start = time.perf_counter()
            call()
            return (time.perf_counter() - start) * 1e3
        start, stop = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        call()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    def median_ms(self, call, settings):
        warm_up = [self.ms(call) for _ in range(settings["warmup"])]
        runs = 1 if warm_up and warm_up[-1] > settings["slow_run_ms"] else settings["runs"]
        return statistics.median(self.ms(call) for _ in range(runs))


def backend_picked(torch, q, k, v, causal, scale):
    """The name of the backend SDPA's dispatcher picks for these inputs ("flash", "cudnn", ...), or None where this
    PyTorch does not say (torch._fused_sdp_choice is PyTorch's own dispatcher, not a public API)."""
    try:
        try:
            from torch.nn.attention import SDPBackend
        except ImportError:
            from torch.backends.cuda import SDPBackend
        names = {int(member): name for name, member in SDPBackend.__members__.items()}
        choice = int(torch._fused_sdp_choice(q, k, v, None, 0.0, causal, scale=scale))
        return BACKEND_LABELS.get(names.get(choice), None)
    except Exception:  # noqa: BLE001 (optional: a PyTorch without this dispatcher simply does not say)
        return None


def time_problem(torch, clock, settings, p):
    """One result of the reply for problem p."""
    import torch.nn.functional as F
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    result = {"forward_ms": None, "forward_backend": None, "forward_backward_ms": None,
              "forward_backward_backend": None, "note": None}
    if p["causal"] == "bottom-right" and p["seq_q"] != p["seq_k"]:
        result["note"] = "SDPA's is_causal aligns the mask top-left, and this problem's is bottom-right with S_q != S_k"
        return result
    causal = p["causal"] != "none"
    options = dict(is_causal=causal, scale=p["scale"])
    if p["heads_q"] != p["heads_kv"]:
        options["enable_gqa"] = True  # PyTorch 2.5 and later; an older one says so in the note
    device = settings["device"]
    try:
        def bshd(seq, heads):
            return torch.randn(p["batch"], seq, heads, p["head_dim"], device=device, dtype=dtype)
        q, d_o = bshd(p["seq_q"], p["heads_q"]), bshd(p["seq_q"], p["heads_q"])
        k, v = bshd(p["seq_k"], p["heads_kv"]), bshd(p["seq_k"], p["heads_kv"])
        q, k, v, d_o = (x.transpose(1, 2) for x in (q, k, v, d_o))  # (B, H, S, D) views, read in place
        result["forward_backend"] = backend_picked(torch, q, k, v, causal, p["scale"])
        with torch.no_grad():
            result["forward_ms"] = clock.median_ms(lambda: F.scaled_dot_product_attention(q, k, v, **options), settings)
        if p["backward"]:
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            result["forward_backward_backend"] = backend_picked(torch, *leaves, causal, p["scale"])
            result["forward_backward_ms"] = clock.median_ms(
                lambda: torch.autograd.grad(F.scaled_dot_product_attention(*leaves, **options), leaves, d_o), settings)
    except Exception as error:  # noqa: BLE001 (a problem SDPA cannot run is that row's note, not the end)
        result["note"] = f"{type(error).__name__}: {first_line(error)}"
        if device == "cuda":
            torch.cuda.empty_cache()  # after an out-of-memory error, the next problem starts clean
    return result


def reply_for(text):
    """The reply (a dict) to the request's text."""
    try:
        settings = read_request(text)
    except RequestError as error:
        return {"ok": False, "error": str(error)}
    torch, why_not = import_torch(settings["device"])
    if why_not:
        return {"ok": False, "error": why_not}
    import warnings
    clock = Clock(torch, settings["device"])
    cuda = settings["device"] == "cuda"
    reply = {"ok": True, "torch": torch.__version__,
             "device": torch.cuda.get_device_name(0) if cuda else "the host CPU",
             "clock": "CUDA events" if cuda else "a host clock", "results": []}
    if not cuda:
        reply["threads"] = torch.get_num_threads()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SDPA warns about each backend it passes over; the choice is in the reply
        for p in settings["problems"]:
            reply["results"].append(time_problem(torch, clock, settings, p))
    return reply


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--request", default="-", help="the request's JSON file (default: stdin)")
    args = parser.parse_args(argv)
    try:
        if args.request == "-":
            text = sys.stdin.read()
        else:
            with open(args.request, encoding="utf-8") as f:
                text = f.read()
    except OSError as error:
        reply = {"ok": False, "error": f"could not read the request {args.request} ({error.strerror})"}
    else:
        reply = reply_for(text)
    json.dump(reply, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    # Run by path, Python puts this file's folder first on sys.path, where `import torch` would find FlashLab's own
    # torch.py (flashlab.torch) instead of PyTorch.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.exit(main())
