"""GPU time of a PyTorch call, two ways, for the scripts that set ours beside PyTorch's (torch_overhead.py,
sdpa_gqa_bench.py, torch_kernel_times.py, torch_backward_race.py).

gpu_ms replays the call from a CUDA graph, so the GPU runs its kernels back to back whatever the host costs: the
kernels' time. median_ms times single eager calls with CUDA events, host gaps between their kernels included: what
one call costs a caller that waits for it.
"""
import torch


def captured(call, warmup=3):
    """call() captured in a CUDA graph, after `warmup` calls on a side stream (as PyTorch asks before a capture) and
    one replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_ms(graph, iters):
    """CUDA events around `iters` back-to-back replays of `graph`: ms a replay."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def gpu_ms(call, iters, warmup=3):
    """GPU time of one call() in ms: call() captured in a CUDA graph (captured), then `iters` replays timed."""
    return replay_ms(captured(call, warmup), iters)


def median_ms(call, iters, warmup=3):
    """The median over `iters` eager calls of call(), each between CUDA events, after `warmup` untimed ones, in ms."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
