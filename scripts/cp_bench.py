#!/usr/bin/env python3
"""PyTorch's context parallelism (ring attention over SDPA) timed on the shapes of `flashlab ring`, the peer
its tables are read against (scripts/ring_tables.py). One host, P GPUs, one process each:

    torchrun --nproc_per_node 4 scripts/cp_bench.py --seq 262144 1048576 --backend cudnn flash \\
        --rotate alltoall allgather --one-gpu --json cp-p4.json

Problem: B = 1, H = 16, d = 128, bf16, causal (is_causal=True, top-left; for N x N the same mask as flashlab's
bottom-right), layout (B, H, N, d). Each rank holds N / P tokens of Q, K, V: PyTorch's causal load balancer
(head-tail) cuts the sequence into 2P chunks and gives rank r chunks r and 2P-1-r, the split flashlab calls
zigzag. The inputs are random, so each rank makes its own share in place (any random share is a share of some
load-balanced sequence); a whole sequence per rank, as context_parallel's buffers would need, does not fit at
N = 4M. PyTorch's own sharding still runs, on a vector of token positions, and the split it makes is printed.
Inside context_parallel, F.scaled_dot_product_attention on the local shares is PyTorch's ring attention: P
steps of SDPA (the --backend kernel) merged through the logsumexp, K and V passed on by --rotate:
  alltoall   the ring: each step a rank sends the K,V share it holds to rank+1 (all_to_all_single)
  allgather  one all-gather of every rank's K,V at the first step (PyTorch's default)
The backward sends dK, dV (fp32) round the ring in both. "What it sends" prints the bytes. Checked once on
PyTorch 2.11 (2 GPUs, N = 8192): output and dQ, dK, dV match plain SDPA on the whole sequence to bf16 rounding.

Times: wall clock around a whole pass, each run started after torch.cuda.synchronize + dist.barrier and ended
by torch.cuda.synchronize; per run the slowest rank (all_reduce MAX); the median over --iters after --warmup.
forward: under torch.no_grad. fwd+bwd: forward with autograd, then backward from a random dO.
FLOPs as flashlab counts them (core/flops.hpp): forward 4 B H N^2 d, halved for causal; backward 2.5 x that.
--one-gpu: rank 0 alone runs plain SDPA (same backend) on the whole sequence while the others wait;
efficiency = one_gpu_ms / (P x cp_ms). A combination that fails (a backend refuses, OOM) prints one line and
the next one runs; the exit code is 0 when at least one combination was timed.
"""
import argparse
import datetime
import gc
import importlib
import json
import os
import statistics
import sys
import time

# NVLink multicast off before NCCL or symmetric memory starts: the multi-GPU hosts require it.
for _var in ("NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1"):
    os.environ.setdefault(*_var.split("="))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

B, H, D = 1, 16, 128
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
ROTATE_ENUM = {"alltoall": "ALL_TO_ALL", "allgather": "ALL_GATHER"}
MIB = float(2**20)


def forward_flops(n):
    return 4.0 * B * H * n * n * D / 2  # causal: half the scores


def tflops(flops, ms):
    return flops / (ms * 1e9) if ms and ms > 0 else None


def first_module(*names):
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def load_cp():
    """PyTorch's context-parallel module (experimental/_context_parallel/ in 2.11; older versions have only
    experimental/_attention.py, which newer ones keep as a re-export) and its load-balancer module, if any."""
    cp = first_module("torch.distributed.tensor.experimental._context_parallel._attention",
                      "torch.distributed.tensor.experimental._attention")
    if cp is None or not hasattr(cp, "context_parallel"):
        raise SystemExit("cp_bench: this PyTorch has no context parallelism (torch.distributed.tensor.experimental)")
    return cp, first_module("torch.distributed.tensor.experimental._context_parallel._load_balancer",
                            "torch.distributed.tensor.experimental._load_balancer")


def set_rotate(cp, name):
    """Chooses how K and V travel; returns the call that did it, checked against PyTorch's own option."""
    if hasattr(cp, "set_rotate_method"):
        cp.set_rotate_method(name)
        how = f"set_rotate_method({name!r})"
    else:
        cp._cp_options.rotate_method = getattr(cp._RotateMethod, ROTATE_ENUM[name])
        how = "_cp_options.rotate_method"
    got = cp._cp_options.rotate_method.name
    if got != ROTATE_ENUM[name]:
        raise RuntimeError(f"asked for {name}, PyTorch's option says {got}")
    return f"{how} -> _RotateMethod.{got}"


def balancer_name(cp, lb, n, p):
    try:
        if lb is not None and hasattr(lb, "_create_default_load_balancer"):
            made = lb._create_default_load_balancer(n, p, "cpu")
            return type(made).__name__ if made is not None else "none"
    except Exception as e:  # informational only: the split printed below is what PyTorch did
        return f"unknown ({type(e).__name__})"
    return "_generate_round_robin_indices" if hasattr(cp, "_generate_round_robin_indices") else "unknown"


def what_it_sends(n, p, f32_grads):
    """Bytes a rank moves per step for each rotate method, from the shapes (PyTorch's ring code, read)."""
    share = 2 * B * H * (n // p) * D * 2  # its K and V, bf16
    dshare = 2 * B * H * (n // p) * D * (4 if f32_grads else 2)  # its dK, dV accumulators
    backward = (f"backward: K,V travel again, and the dK,dV accumulators ({'fp32' if f32_grads else 'bf16'}) go round "
                "the ring P times, one all_to_all_single each")
    return {
        "tokens_per_rank": n // p, "chunk_tokens": n // (2 * p), "kv_share_bytes": share,
        "alltoall": {"bytes_per_step": share, "forward_steps": p - 1, "backward_dkv_bytes_per_step": dshare,
                     "backward_dkv_steps": p,
                     "description": "the ring: at each of P-1 steps a rank sends the K,V share it holds to rank+1 "
                                    "(one all_to_all_single, permute_tensor) while it computes; " + backward},
        "allgather": {"bytes_per_step": (p - 1) * share, "forward_steps": 1 if p > 1 else 0,
                      "gathered_bytes": p * share, "backward_dkv_bytes_per_step": dshare, "backward_dkv_steps": p,
                      "description": "one all-gather at the first step: a rank receives the other P-1 shares at once "
                                     "and holds all of K,V (gathered_bytes) through the pass; later steps slice it; "
                                     + backward},
    }


def timed(fn, warmup, iters, barrier):
    """This rank's wall time (ms) of each timed run of fn, every run started together after barrier()."""
    ms = []
    for i in range(warmup + iters):
        torch.cuda.synchronize()
        if barrier:
            barrier()
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
    return ms


def time_passes(tensors, backend, args, barrier):
    """{"forward": [ms], "fwdbwd": [ms]} of F.scaled_dot_product_attention on (q, k, v), causal."""
    q, k, v, dout = tensors
    out = {}

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward_backward():
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)

    with sdpa_kernel(BACKENDS[backend]):
        out["forward"] = timed(forward, args.warmup, args.iters, barrier)
        if args.passes == "fwdbwd":
            out["fwdbwd"] = timed(forward_backward, args.warmup, args.iters, barrier)
    return out


def random_qkv(tokens, grad):
    """Q, K, V (leaves that take gradients when grad) and dO, random normal, bf16, (B, H, tokens, d)."""
    make = lambda g: torch.randn(B, H, tokens, D, device="cuda", dtype=torch.bfloat16, requires_grad=g)  # noqa: E731
    return make(grad), make(grad), make(grad), (make(False) if grad else None)


def short(e):
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def free():
    gc.collect()
    torch.cuda.empty_cache()


def one_gpu(n, backend, args):
    """Plain SDPA on the whole sequence on this GPU: {"forward_ms", "fwdbwd_ms"} or {"skipped"/"error"}."""
    if n > args.one_gpu_max_seq:
        return {"skipped": f"N = {n} is over --one-gpu-max-seq {args.one_gpu_max_seq}"}
    try:
        ms = time_passes(random_qkv(n, args.passes == "fwdbwd"), backend, args, None)
        return {f"{k}_ms": statistics.median(v) for k, v in ms.items()}
    except Exception as e:
        return {"error": short(e)}
    finally:
        free()


def agree(error, gloo):
    """The first rank's error, or None if every rank succeeded: all ranks then take the same path."""
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error, group=gloo)
    return next((f"rank {r}: {e}" for r, e in enumerate(errors) if e), None)


def describe_split(cp, lb, positions, n, p, gloo, say):
    """Where PyTorch's sharding put each rank's tokens (from the positions it sharded), and what travels."""
    pos = positions.reshape(-1).cpu()
    cuts = (torch.nonzero(pos[1:] - pos[:-1] != 1).flatten() + 1).tolist()
    bounds = [0] + cuts + [pos.numel()]
    mine = [(int(pos[a]), int(pos[b - 1]) + 1) for a, b in zip(bounds[:-1], bounds[1:])]
    runs = [None] * p
    dist.all_gather_object(runs, mine, group=gloo)
    chunk = n // (2 * p)
    # head-tail: rank i holds chunks i and 2P-1-i (one run when they touch, as at P = 1)
    expected = [[(i * chunk, (i + 1) * chunk), ((2 * p - 1 - i) * chunk, (2 * p - i) * chunk)] for i in range(p)]
    expected = [[(a, d)] if b == c else [(a, b), (c, d)] for (a, b), (c, d) in expected]
    head_tail = runs == expected
    sends = what_it_sends(n, p, cp._cp_options.convert_to_f32)
    name = balancer_name(cp, lb, n, p)
    say(f"\nN = {n} over P = {p}: {n // p} tokens a rank; PyTorch's split ({name}"
        f"{', head-tail: rank r holds chunks r and 2P-1-r' if head_tail else ', not head-tail'}):")
    for i, rr in enumerate(runs):
        say(f"  rank {i}: " + " + ".join(f"[{a}, {b})" for a, b in rr)
            + (f"  (chunks {i} and {2 * p - 1 - i} of {2 * p})" if head_tail else ""))
    say(f"what it sends (a rank's K,V share: 2 x {H} heads x {n // p} tokens x {D} x 2 B = "
        f"{sends['kv_share_bytes'] / MIB:.1f} MiB):")
    for m in ("alltoall", "allgather"):
        s = sends[m]
        say(f"  {m:9}: {s['bytes_per_step'] / MIB:.1f} MiB a step, {s['forward_steps']} forward step(s) with "
            f"traffic; backward dK,dV {s['backward_dkv_bytes_per_step'] / MIB:.1f} MiB a step x "
            f"{s['backward_dkv_steps']}. {s['description']}")
    return {"seq": n, "load_balancer": name, "head_tail": head_tail, "split": [[list(r) for r in rr] for rr in runs],
            "what_it_sends": sends}


def fmt(x, digits):
    return "-" if x is None else f"{x:.{digits}f}"


def time_cp(cp, tensors, n, backend, rotate, one, args, ctx):
    """One (N, backend, rotate) row, run inside context_parallel on every rank."""
    error, ms, how = None, None, ""
    try:
        how = set_rotate(cp, rotate)
        ms = time_passes(tensors, backend, args, ctx["barrier"])
    except Exception as e:
        error = short(e)
    error = agree(error, ctx["gloo"])
    free()
    row = {"seq": n, "backend": backend, "rotate": rotate, "rotate_set_by": how}
    if error:
        ctx["say"](f"  N = {n} {backend} {rotate}: failed: {error}")
        return {**row, "status": "failed", "error": error}
    row["status"] = "ok"
    fwd = forward_flops(n)
    for pass_, times in ms.items():
        slowest = torch.tensor(times, dtype=torch.float64, device="cuda")
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        row[f"{pass_}_ms"] = statistics.median(slowest.tolist())
        row[f"{pass_}_tflops"] = tflops(fwd * (3.5 if pass_ == "fwdbwd" else 1.0), row[f"{pass_}_ms"])
        base = one.get(backend, {}).get(f"{pass_}_ms")
        row[f"one_gpu_{pass_}_ms"] = base
        row[f"efficiency_{pass_}"] = base / (ctx["p"] * row[f"{pass_}_ms"]) if base else None
    line = f"  N = {n} {backend:5} {rotate:9}"
    for pass_, label in (("forward", "forward"), ("fwdbwd", "fwd+bwd")):
        if f"{pass_}_ms" in row:
            line += (f" | {label} {row[f'{pass_}_ms']:10.2f} ms {fmt(row[f'{pass_}_tflops'], 1):>6} TFLOP/s "
                     f"eff {fmt(row[f'efficiency_{pass_}'], 3):>5}")
    ctx["say"](line + f"  ({how})")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, nargs="+", default=[262144], help="sequence lengths N (divisible by 2P)")
    ap.add_argument("--backend", nargs="+", choices=sorted(BACKENDS), default=["cudnn"])
    ap.add_argument("--rotate", nargs="+", choices=sorted(ROTATE_ENUM), default=["alltoall"])
    ap.add_argument("--passes", choices=["fwd", "fwdbwd"], default="fwdbwd", help="fwdbwd times the forward too")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--one-gpu", action="store_true", help="also plain SDPA on the whole sequence on GPU 0")
    ap.add_argument("--one-gpu-max-seq", type=int, default=1048576, help="skip the one-GPU run above this N")
    ap.add_argument("--json", help="rank 0 writes the results here")
    args = ap.parse_args()
    if "LOCAL_RANK" not in os.environ:
        raise SystemExit("cp_bench: start it with torchrun --nproc_per_node P scripts/cp_bench.py ...")
    if args.warmup < 0 or args.iters < 1:
        raise SystemExit("cp_bench: --warmup must be >= 0 and --iters >= 1")

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank),
                            timeout=datetime.timedelta(minutes=20))
    rank, p = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=3))  # waits while GPU 0 runs alone
    mesh = init_device_mesh("cuda", (p,))
    cp, lb = load_cp()
    cp._cp_options.enable_load_balance = True
    say = print if rank == 0 else (lambda *a, **k: None)
    ctx = {"p": p, "gloo": gloo, "say": say, "barrier": lambda: dist.barrier(device_ids=[local_rank])}
    torch.manual_seed(1000 + rank)

    cudnn = torch.backends.cudnn.version() or 0
    report = {
        "tool": "cp_bench", "device": torch.cuda.get_device_name(local_rank), "gpus": p,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": f"{cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}",
        "command": f"torchrun --nproc_per_node {p} " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "settings": {"ranks": p, "batch": B, "heads": H, "head_dim": D, "dtype": "bf16", "causal": "top-left",
                     "passes": args.passes, "warmup": args.warmup, "iters": args.iters, "seqs": args.seq,
                     "backends": args.backend, "rotates": args.rotate, "cp_module": cp.__name__,
                     "load_balance": cp._cp_options.enable_load_balance,
                     "convert_to_f32": cp._cp_options.convert_to_f32},
        "notes": "ms: median over the timed runs of the slowest rank's pass (host clock, each run after a barrier). "
                 "forward under no_grad; fwdbwd = forward with autograd + backward. TFLOP/s: forward 4BHN^2d/2, "
                 "fwdbwd 3.5x that. efficiency: one_gpu ms / (ranks x ms). command: the launcher part is rebuilt.",
        "shapes": [], "one_gpu": [], "rows": [],
    }
    say(f"cp_bench: PyTorch {torch.__version__} context parallelism ({cp.__name__}), {p} x {report['device']}, "
        f"cuDNN {report['cudnn']}; B={B} H={H} d={D} bf16 causal; load balance on; median of {args.iters} after "
        f"{args.warmup} warm-up, slowest rank")

    def write():
        if rank == 0 and args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=2)
                f.write("\n")

    for n in args.seq:
        if n % (2 * p):
            say(f"\nN = {n}: skipped: the load balancer cuts N into 2P = {2 * p} equal chunks")
            continue
        one = {}
        if args.one_gpu:  # first, outside context_parallel, which replaces F.scaled_dot_product_attention
            for backend in args.backend:
                if rank == 0:
                    one[backend] = one_gpu(n, backend, args)
                    report["one_gpu"].append({"seq": n, "backend": backend, **one[backend]})
                    say(f"\nN = {n}: one GPU, {backend}: "
                        + ", ".join(f"{k} {v if isinstance(v, str) else round(v, 2)}" for k, v in one[backend].items()))
                dist.barrier(group=gloo)
        error, tensors = None, None
        try:
            tensors = random_qkv(n // p, args.passes == "fwdbwd")
        except Exception as e:
            error = short(e)
        error = agree(error, gloo)
        if error:
            say(f"\nN = {n}: failed to make the shares: {error}")
            tensors = None
            free()
            continue
        positions = torch.arange(n, device="cuda").reshape(1, n).clone()  # not a view: context_parallel resizes it
        try:
            with cp.context_parallel(mesh, buffers=[positions], buffer_seq_dims=[1], no_restore_buffers={positions}):
                report["shapes"].append(describe_split(cp, lb, positions, n, p, gloo, say))
                for backend in args.backend:
                    for rotate in args.rotate:
                        report["rows"].append(time_cp(cp, tensors, n, backend, rotate, one, args, ctx))
        except Exception as e:  # entering context_parallel: every row of this N is lost
            say(f"\nN = {n}: context_parallel failed: {short(e)}")
        del tensors, positions
        free()
        write()

    ok = any(r["status"] == "ok" for r in report["rows"])
    if args.json:
        write()
        say(f"\nwrote {args.json}")
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
