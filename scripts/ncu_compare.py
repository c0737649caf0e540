"""Kernels side by side from Nsight Compute's raw page (ncu --import REP --page raw --csv): the figures that say where
two kernels doing the same work differ. Cycles and instructions are clock-free; the pipes' shares are of the elapsed
cycles' peak.

    python3 scripts/ncu_compare.py ncu-raw.csv
"""
import csv
import sys

TO_MS = {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}
ROWS = [  # (label, metric, scale (or "ms": the unit row says), format)
    ("grid x block", None, None, None),
    ("registers / thread", "launch__registers_per_thread", 1, "{:.0f}"),
    ("SM clock, GHz", "gpc__cycles_elapsed.avg.per_second", 1, "{:.2f}"),
    ("duration, ms", "gpu__time_duration.sum", "ms", "{:.3f}"),
    ("elapsed cycles, M", "gpc__cycles_elapsed.max", 1e-6, "{:.2f}"),
    ("instructions, G", "smsp__inst_executed.sum", 1e-9, "{:.3f}"),
    ("issue slots busy, %", "smsp__issue_active.avg.pct_of_peak_sustained_active", 1, "{:.1f}"),
    ("tensor pipe, %", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed", 1, "{:.1f}"),
    ("ALU pipe, %", "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_elapsed", 1, "{:.1f}"),
    ("FMA pipe, %", "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_elapsed", 1, "{:.1f}"),
    ("XU pipe (exp2), %", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_elapsed", 1, "{:.1f}"),
    ("uniform pipe, %", "sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_elapsed", 1, "{:.1f}"),
    ("LSU pipe, %", "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_elapsed", 1, "{:.1f}"),
    ("L2 throughput, %", "lts__throughput.avg.pct_of_peak_sustained_elapsed", 1, "{:.1f}"),
    ("DRAM, GB/s", "dram__bytes.sum.per_second", 1, "{:.0f}"),
    ("stall: dispatch / issue", "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio", 1, "{:.2f}"),
    ("stall: math throttle / issue", "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio", 1, "{:.2f}"),
    ("stall: barrier / issue", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", 1, "{:.2f}"),
    ("stall: long scoreboard / issue", "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", 1, "{:.2f}"),
    ("stall: wait / issue", "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", 1, "{:.2f}"),
]


def number(text):
    return float(text.replace(",", ""))


def main(path):
    rows = list(csv.reader(open(path)))
    header, units, kernels = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    names = [k[col["Kernel Name"]] for k in kernels]
    short = ["ours" if "fa3_ws_backward" in n else "cuDNN" if "bprop" in n else n[:12] for n in names]
    for i, n in enumerate(names):
        print(f"kernel {i + 1}: {n[:110]}")
    print(f"{'':32s}" + "".join(f"{str(i + 1) + ' ' + s:>14s}" for i, s in enumerate(short)))
    for label, metric, scale, fmt in ROWS:
        if metric is None:
            dims = lambda text: "x".join(d for d in text.strip("()").replace(" ", "").split(",") if d != "1") or "1"
            cells = [f'{dims(k[col["Grid Size"]])} x {dims(k[col["Block Size"]])}' for k in kernels]
        elif metric not in col:
            continue
        else:
            factor = TO_MS[units[col[metric]]] if scale == "ms" else scale
            cells = [fmt.format(number(k[col[metric]]) * factor) for k in kernels]
        print(f"{label:32s}" + "".join(f"{c:>14s}" for c in cells))


if __name__ == "__main__":
    main(sys.argv[1])
