"""The host link and the matmuls calibrate measures first: pinned copies (``h2d_gbps``), a copy and a UVA read at
once (``link_shared_gbps``), and ``x @ W.T`` with the weight resident or read through UVA by token count
(``uva_gbps``, ``uva_call_ms``, ``uva_passes``, ``gpu_mem_gbps``, ``matmul_tflops``)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from runtime.calibrate.timers import gpu_ms
from runtime.uva import device_view
from schemas.hardware_profile import NARROW_UVA, UvaPoint

TOKENS = (1, 16, 64, 256, 1024, 2048, 4096)


def link(device: torch.device) -> dict[str, float]:
    n = 256 * 2**20
    host = torch.empty(n, dtype=torch.uint8).pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    ms = gpu_ms(lambda: dev.copy_(host, non_blocking=True))
    return {"h2d_gbps": n / ms / 1e6}


def _two_streams_ms(first: Callable[[], object], second: Callable[[], object], repeat: int = 5) -> float:
    """Median milliseconds from launching ``first`` and ``second`` together, each on its own stream, until
    both are done (events on the current stream: the streams wait for its start and it waits for both)."""
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    times = []
    for i in range(repeat + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        here = torch.cuda.current_stream()
        start.record(here)
        for stream, fn in zip(streams, (first, second)):
            stream.wait_event(start)
            with torch.cuda.stream(stream):
                fn()
        for stream in streams:
            here.wait_stream(stream)
        end.record(here)
        end.synchronize()
        if i:  # the first run warms up
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def shared_link(device: torch.device) -> dict[str, object]:
    """A pinned copy and a UVA read of equal bytes at once: their bytes together / the time both take (and,
    in ``raw_link``, each alone and both, ms)."""
    n = 2**30
    host = torch.empty(n, dtype=torch.uint8).pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    w_host = torch.empty(n // 2 // 8192, 8192, dtype=torch.bfloat16).pin_memory()
    w_uva = device_view(w_host, device)
    x = torch.randn(1, 8192, dtype=torch.bfloat16, device=device)

    def copy() -> None:
        dev.copy_(host, non_blocking=True)

    def read() -> None:
        x @ w_uva.T

    both = _two_streams_ms(copy, read)
    raw = {"bytes": n, "copy_ms": gpu_ms(copy, repeat=5), "read_ms": gpu_ms(read, repeat=5), "both_ms": both}
    return {"link_shared_gbps": 2 * n / both / 1e6, "raw_link": raw}


def uva_line(big_bytes: int, big_ms: float, small_bytes: int, small_ms: float) -> tuple[float, float]:
    """(GB/s, fixed ms) of a UVA read taking ``fixed + bytes / rate``, through two measured reads (the big one's
    rate alone when the small one is not slower per byte: no fixed cost to find)."""
    if big_ms <= small_ms or big_bytes <= small_bytes:
        return big_bytes / big_ms / 1e6, 0.0
    gbps = (big_bytes - small_bytes) / (big_ms - small_ms) / 1e6
    fixed = small_ms - small_bytes / gbps / 1e6
    return (gbps, fixed) if fixed > 0.0 else (big_bytes / big_ms / 1e6, 0.0)


def passes_by_rows(ms: dict[int, float], nbytes: int, fixed: float, gbps: float,
                   rising: bool = False) -> list[UvaPoint]:
    """A weight's reads over the link by the rows of the matmul that took ``ms[rows]`` ms reading it through UVA:
    (time - ``fixed``) at ``gbps`` / its bytes, at least 1; ``rising``: never fewer than at fewer rows (a dip is
    the timing's noise)."""
    reads = [max(1.0, (ms[t] - fixed) * gbps * 1e6 / nbytes) for t in sorted(ms)]
    if rising:
        reads = [max(reads[:k + 1]) for k in range(len(reads))]
    return [UvaPoint(tokens=t, passes=round(r, 3)) for t, r in zip(sorted(ms), reads)]


def matmuls(device: torch.device) -> dict[str, object]:
    dim = 8192
    w_host = torch.randn(dim, dim, dtype=torch.bfloat16).pin_memory()
    w_uva = device_view(w_host, device)
    w_gpu = w_host.to(device)
    nbytes = w_host.numel() * w_host.element_size()
    uva_ms, resident_ms = {}, {}
    for t in TOKENS:
        x = torch.randn(t, dim, dtype=torch.bfloat16, device=device)
        uva_ms[t] = gpu_ms(lambda x=x: x @ w_uva.T, repeat=5)
        # queued: a 60 us GEMV timed as issued carries the launch's gap (gpu_mem_gbps 1,967-2,226 GB/s on fresh
        # machines against 2,820, 2026-12-02)
        resident_ms[t] = gpu_ms(lambda x=x: x @ w_gpu.T, queued=True)
    s_host = torch.randn(*NARROW_UVA, dtype=torch.bfloat16).pin_memory()
    s_uva = device_view(s_host, device)
    # the narrow weight at each of the wide one's rows: the GPU's matmul tiles a narrow matrix's rows finer and so
    # re-reads it more often (the H200, 2,048 rows: 15.5 reads where the wide weight's curve says 7.9; attention
    # alone on UVA at a 2,048-token prefill of the Llama-3-8B shape ran 1.15-1.18x its prediction, 2026-12-02)
    narrow_ms = {}
    for t in TOKENS:
        x = torch.randn(t, NARROW_UVA[1], dtype=torch.bfloat16, device=device)
        narrow_ms[t] = gpu_ms(lambda x=x: x @ s_uva.T, repeat=5 if t > 1 else 3)
    small_bytes = s_host.numel() * s_host.element_size()
    uva_gbps, fixed = uva_line(nbytes, uva_ms[1], small_bytes, narrow_ms[1])
    points = passes_by_rows(uva_ms, nbytes, fixed, uva_gbps)
    narrow = passes_by_rows(narrow_ms, small_bytes, fixed, uva_gbps, rising=True)
    big = TOKENS[-1]
    return {"uva_gbps": uva_gbps, "uva_call_ms": fixed, "uva_passes": points, "uva_passes_narrow": narrow,
            "gpu_mem_gbps": nbytes / resident_ms[1] / 1e6, "matmul_tflops": 2 * big * dim * dim / resident_ms[big] / 1e9,
            "raw_uva_ms": dict(uva_ms, narrow=narrow_ms),
            "raw_gpu_ms": resident_ms}
