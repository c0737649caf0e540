#!/usr/bin/env python3
"""The ncu side of scripts/record_dram_counters.sh: runs `flashlab bench --one-pass` under Nsight Compute for
each (variant, head dim, causal) with every N of its list in one process, gives each N its kernels (the
passes run in N's order, each launching the same number of kernels), and writes <gpu>-dram-counters.json.
With --plan l2-transition it measures instead where cuda-fa1's Q and O (B * H * 2 * N * d * 4 bytes, swept
again and again by its blocks) cross the L2's size, N and H in small steps, with the L2's own sector counters
beside the DRAM's, into <gpu>-dram-counters_l2-transition.json.
Standard library only (the GPU machine has no extra packages). `--parse-only REPORT_CSV BENCH_JSON` prints
what one ncu report gives, for checking the parsing without a GPU."""
import argparse
import csv
import datetime
import io
import json
import os
import subprocess
import sys
import tempfile
import time

NCU_OPTIONS = ["--clock-control", "none", "--cache-control", "all", "--profile-from-start", "off"]
DRAM_METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum"]
# What the launch looked like (grid, occupancy): the test holds cuda/tilings.hpp to it. Dropped if this ncu
# does not know one of them, rather than losing the DRAM counters.
LAUNCH_METRICS = [
    "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
    "launch__occupancy_limit_blocks", "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps",
    "device__attribute_multiprocessor_count", "device__attribute_l2_cache_size",
]
OCCUPANCY_LIMITS = {"blocks": "launch__occupancy_limit_blocks", "registers": "launch__occupancy_limit_registers",
                    "shared_mem": "launch__occupancy_limit_shared_mem", "warps": "launch__occupancy_limit_warps"}

K = 1024
LONG = [1 * K, 2 * K, 4 * K, 8 * K, 16 * K, 32 * K, 64 * K, 128 * K]
FP32 = [1 * K, 2 * K, 4 * K, 8 * K, 16 * K]  # S and P of cuda-naive at 32k would need 256 GiB; cuda-fa1 takes seconds
# (variant, dtype, lengths), in the order they run: the done criteria's cuda-fa2 first.
PLAN = [("cuda-fa2", "bf16", LONG), ("cuda-naive", "f32", FP32), ("cuda-fa1", "f32", FP32),
        ("cuda-fa3-ws", "bf16", LONG)]
HEAD_DIMS = [64, 128]
CAUSAL = ["none", "top-left"]
BATCH, HEADS = 1, 16
# The L2's side of the story (--plan l2-transition): lookups by the SMs of a partition's own side, and requests
# that come over the fabric from the other partition. Kept per kernel under "l2_sectors" when ncu knows them.
L2_METRICS = [
    "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum",
    "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum", "lts__t_sectors_srcunit_tex_op_write.sum",
    "lts__t_sectors_srcunit_ltcfabric.sum", "lts__t_sectors_srcunit_ltcfabric_lookup_hit.sum",
    "lts__t_sectors_srcunit_ltcfabric_lookup_miss.sum",
]
# (batch, heads, head dim, causal, lengths): cuda-fa1's Q and O from 16 to 64 MiB, by N and by H; the same 32 MiB
# with 8 to 64 blocks; d = 128.
TRANSITION = (
    [(1, h, 64, "none", [4096]) for h in (8, 10, 12, 13, 14, 15, 16, 17, 18, 20, 24, 32)] +
    [(1, 16, 64, c, [2048, 2560, 3072, 3328, 3584, 3840, 4096, 4352, 4608, 5120, 6144, 8192]) for c in CAUSAL] +
    [(1, 8, 64, "none", [8192]), (1, 32, 64, "none", [2048]), (1, 64, 64, "none", [1024]),
     (2, 8, 64, "none", [4096]), (4, 4, 64, "none", [4096]), (1, 16, 128, "none", [1536, 2048, 2560])])


def number(text):
    return float(text.replace(",", "")) if text not in ("", "n/a") else None


def parse_raw_csv(text):
    """The kernels of an `ncu --import R --csv --page raw --print-units base` listing, in launch order."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((n for n, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        raise ValueError("no ncu raw table (a header row starting with \"ID\") in the report listing")
    header = rows[start]
    kernels = []
    for r in rows[start + 1:]:
        if len(r) != len(header) or not r[0].strip().isdigit():
            continue  # the units row, blank lines
        cell = dict(zip(header, r))
        limits = {k: number(cell.get(m, "")) for k, m in OCCUPANCY_LIMITS.items()}
        known = [v for v in limits.values() if v is not None]
        kernels.append({
            "id": int(cell["ID"]),
            "name": cell.get("Kernel Name", ""),
            "grid_size": int(number(cell.get("launch__grid_size", "0")) or 0),
            "block_size": int(number(cell.get("launch__block_size", "0")) or 0),
            "registers_per_thread": int(number(cell.get("launch__registers_per_thread", "0")) or 0),
            "blocks_per_sm": int(min(known)) if known else None,
            "occupancy_limits": limits,
            "dram_read_bytes": int(number(cell["dram__bytes_read.sum"])),  # KeyError: not a DRAM listing
            "dram_write_bytes": int(number(cell["dram__bytes_write.sum"])),
            "sm_count": number(cell.get("device__attribute_multiprocessor_count", "")),
            "l2_bytes": number(cell.get("device__attribute_l2_cache_size", "")),
        })
        l2 = {m[:-len(".sum")]: int(number(cell[m])) for m in L2_METRICS if number(cell.get(m, "")) is not None}
        if l2:
            kernels[-1]["l2_sectors"] = l2
    kernels.sort(key=lambda k: k["id"])
    return kernels


def attribute(bench_rows, kernels, variant, dtype, head_dim, causal):
    """One run per bench row that ran; its kernels are the next ones in launch order."""
    ran = [r for r in bench_rows if r["status"] == "ok"]
    runs, skipped = [], [{"variant": variant, "head_dim": head_dim, "causal": causal, "seq": r["seq_q"],
                          "reason": r.get("reason", r["status"])} for r in bench_rows if r["status"] != "ok"]
    if not ran:
        return runs, skipped
    if len(kernels) % len(ran):
        raise ValueError(f"{variant} d={head_dim} causal={causal}: {len(kernels)} kernels for {len(ran)} passes")
    per_pass = len(kernels) // len(ran)
    for n, r in enumerate(ran):
        mine = kernels[n * per_pass:(n + 1) * per_pass]
        for k in mine:
            k.pop("id")
        runs.append({"variant": variant, "dtype": dtype, "batch": r["batch"], "heads": r["heads_q"],
                     "seq": r["seq_q"], "head_dim": r["head_dim"], "causal": causal,
                     "dram_read_bytes": sum(k["dram_read_bytes"] for k in mine),
                     "dram_write_bytes": sum(k["dram_write_bytes"] for k in mine),
                     "kernels": mine})
    return runs, skipped


def key(run):
    return (run["variant"], run["batch"], run["heads"], run["head_dim"], run["causal"], run["seq"])


def sort_key(run):
    return (run["variant"], run["head_dim"], run["causal"], run["batch"], run["heads"], run["seq"])


def gpu_id(device):
    """"NVIDIA H100 80GB HBM3" -> "h100": the id the traffic model's GPU table uses."""
    words = device.split()
    return (words[1] if len(words) > 1 and words[0] == "NVIDIA" else words[0]).lower()


def measure(args, variant, dtype, head_dim, causal, seqs, workdir, batch=BATCH, heads=HEADS):
    report = os.path.join(workdir, "r")
    bench_json = os.path.join(workdir, "bench.json")
    for path in (report + ".ncu-rep", bench_json):
        if os.path.exists(path):
            os.remove(path)
    metrics = DRAM_METRICS + (LAUNCH_METRICS if args.launch_metrics else []) + (L2_METRICS if args.l2_metrics else [])
    cmd = ([args.ncu] + NCU_OPTIONS + ["--metrics", ",".join(metrics), "--export", report, "--force-overwrite"] +
           [args.flashlab, "bench", "--device", "cuda", "--variants", variant, "--dtype", dtype, "--batch", str(batch),
            "--heads", str(heads), "--head-dim", str(head_dim), "--causal", causal,
            "--seq", ",".join(map(str, seqs)), "--one-pass", "--json", bench_json])
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(os.path.join(args.out, "record-ncu.log"), "a") as log:
        log.write("\n$ " + " ".join(cmd) + "\n" + done.stdout)
    if done.returncode != 0 and (args.launch_metrics or args.l2_metrics) and "metric" in done.stdout.lower():
        print("ncu refused a launch or L2 metric: measuring the DRAM counters alone from here on")
        args.launch_metrics = args.l2_metrics = False
        return measure(args, variant, dtype, head_dim, causal, seqs, workdir, batch, heads)
    if done.returncode != 0 or not os.path.exists(bench_json):
        raise RuntimeError(f"ncu or flashlab bench failed (exit {done.returncode}); see record-ncu.log")
    listing = subprocess.run([args.ncu, "--import", report + ".ncu-rep", "--csv", "--page", "raw", "--print-units", "base"],
                             capture_output=True, text=True, check=True).stdout
    bench_rows = json.load(open(bench_json))["rows"]
    return attribute(bench_rows, parse_raw_csv(listing), variant, dtype, head_dim, causal)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--flashlab", default="build-device/bin/flashlab")
    ap.add_argument("--ncu", default="ncu", help="the Nsight Compute command")
    ap.add_argument("--device", help="the GPU's name, as nvidia-smi gives it")
    ap.add_argument("--out", default="bench/results", help="folder for <gpu>-dram-counters.json")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds: start no run after it")
    ap.add_argument("--variants", nargs="*", help="only these variants")
    ap.add_argument("--command", default="", help="the command line to record")
    ap.add_argument("--plan", choices=["variants", "l2-transition"], default="variants",
                    help="the four variants' runs (default), or cuda-fa1 where its Q and O cross the L2's size")
    ap.add_argument("--parse-only", nargs=2, metavar=("REPORT_CSV", "BENCH_JSON"))
    args = ap.parse_args()
    args.launch_metrics = True
    args.l2_metrics = args.plan == "l2-transition"
    if args.parse_only:
        runs, skipped = attribute(json.load(open(args.parse_only[1]))["rows"],
                                  parse_raw_csv(open(args.parse_only[0]).read()), "cuda-fa2", "bf16", 64, "none")
        json.dump({"runs": runs, "not_recorded": skipped}, sys.stdout, indent=1)
        return 0

    os.makedirs(args.out, exist_ok=True)
    name = f"{gpu_id(args.device)}-dram-counters{'_l2-transition' if args.plan == 'l2-transition' else ''}.json"
    path = os.path.join(args.out, name)
    kept = {}
    for earlier in (path, os.path.join("bench", "results", name)):
        if os.path.exists(earlier):
            old = json.load(open(earlier))
            if old.get("device") == args.device:
                kept = {key(r): r for r in old.get("runs", [])}
                print(f"keeping {len(kept)} runs already recorded in {earlier}")
            break
    ncu_version = subprocess.run([args.ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    result = {
        "device": args.device,
        "gpu": gpu_id(args.device),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": args.command,
        "ncu": ncu_version,
        "ncu_options": " ".join(NCU_OPTIONS),
        "bench": "flashlab bench --device cuda --one-pass: one forward pass per N, nothing else inside the "
                 "profiler range",
        "notes": "dram__bytes_read.sum and dram__bytes_write.sum summed over the kernels of one forward pass; each "
                 "kernel measured from a flushed L2 (--cache-control all), so lines a kernel leaves dirty in L2 are "
                 "written back outside its window. blocks_per_sm is the smallest of ncu's occupancy limits.",
        "runs": list(kept.values()),
        "not_recorded": [],
    }
    if args.plan == "l2-transition":
        configs = [("cuda-fa1", "f32", b, h, d, c, seqs) for b, h, d, c, seqs in TRANSITION]
    else:
        configs = [(v, dtype, BATCH, HEADS, d, c, seqs) for v, dtype, seqs in PLAN
                   if not args.variants or v in args.variants for d in HEAD_DIMS for c in CAUSAL]
    with tempfile.TemporaryDirectory() as workdir:
        for variant, dtype, batch, heads, head_dim, causal, seqs in configs:
            todo = [n for n in seqs if (variant, batch, heads, head_dim, causal, n) not in kept]
            if not todo:
                continue
            label = f"{variant} B={batch} H={heads} d={head_dim} causal={causal} N={','.join(map(str, todo))}"
            if time.time() > args.deadline:
                result["not_recorded"] += [{"variant": variant, "batch": batch, "heads": heads, "head_dim": head_dim,
                                            "causal": causal, "seq": n, "reason": "out of time"} for n in todo]
                print(f"out of time: {label} not run")
                continue
            t0 = time.time()
            try:
                runs, skipped = measure(args, variant, dtype, head_dim, causal, todo, workdir, batch, heads)
            except (RuntimeError, ValueError, subprocess.CalledProcessError) as e:
                result["not_recorded"] += [{"variant": variant, "batch": batch, "heads": heads, "head_dim": head_dim,
                                            "causal": causal, "seq": n, "reason": str(e)} for n in todo]
                print(f"failed: {label}: {e}")
                continue
            result["runs"] += runs
            result["not_recorded"] += skipped
            print(f"{label}: {len(runs)} runs in {time.time() - t0:.0f} s")
            for r in runs:
                print(f"  N={r['seq']:>6}: DRAM read {r['dram_read_bytes'] / 1e6:10.1f} MB, "
                      f"written {r['dram_write_bytes'] / 1e6:9.1f} MB, {len(r['kernels'])} kernel(s)")
            # Written after every configuration: a call cut short keeps what it measured.
            result["runs"].sort(key=sort_key)
            with open(path, "w") as f:
                json.dump(result, f, indent=1)
    result["runs"].sort(key=sort_key)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}: {len(result['runs'])} runs, {len(result['not_recorded'])} not recorded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
