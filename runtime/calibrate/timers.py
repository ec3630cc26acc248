"""The clocks of calibrate: CUDA events around GPU work (as issued, or queued behind a GPU sleep so that only
the GPU's time counts), the wall clock around CPU issue, and CUDA graph replay."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from runtime.timing import wall_ms

QUEUE_CYCLES = 50_000_000  # GPU clock cycles (about 25 ms) a queued timing holds the stream for before ``fn``


def gpu_ms(fn: Callable[[], object], repeat: int = 10, warmup: int = 2, queued: bool = False) -> float:
    """Median milliseconds of ``fn()`` on the current stream, measured with CUDA events after
    ``warmup`` untimed runs (the events order it after them, so no host sync is needed). ``queued``: the
    stream first sleeps while the CPU issues all of ``fn``, so its kernels run back to back and the CPU's
    issue time is not in the figure (a decoder block issues about as long as its GPU work takes: timed as it
    is issued, its elementwise work came out twice the forward's, 2026-12-02)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if queued:
            torch.cuda._sleep(QUEUE_CYCLES)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _wall_ms(fn: Callable[[], object], repeat: int = 15, warmup: int = 3) -> float:
    """CPU-bound wall time: the median of ``repeat`` runs (as the benchmarks report), each waited for on the
    GPU, with the garbage collector held off."""
    return wall_ms(fn, repeat, warmup, sync=torch.cuda.synchronize, hold_gc=True)


def captured(fn: Callable[[], object], warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, object]:
    """``fn`` captured as a CUDA graph after ``warmup`` runs on a side stream: the graph, and what the captured
    call returned (the tensors each replay writes again)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def graph_ms(fn: Callable[[], object], repeat: int = 10) -> float:
    """Median milliseconds of a CUDA graph replay of ``fn`` (captured after two runs on a side stream)."""
    graph, _ = captured(fn)
    return gpu_ms(graph.replay, repeat=repeat, warmup=2)
