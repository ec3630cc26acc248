"""Host time of one ``cudaMemcpyAsync`` (host to GPU) by size, from registered and from torch-pinned memory.

    PYTHONPATH=. python bench/probe_memcpy_cpu.py

Why: an offloaded Llama block measured 0.6-1.5 ms more CPU per forward than a hook-free block (docs/
BENCHMARKS.md, "Eager hot path"), while its hooks make about a dozen runtime calls. Each call here starts on
an idle GPU (synchronize first) and the host clock stops when the call returns; the median of 20.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from runtime import cudart  # noqa: E402
from runtime.pinned import HostArena  # noqa: E402

MB = 1 << 20


def host_us(src: int, dst: int, n: int, stream: torch.cuda.Stream) -> float:
    times = []
    for _ in range(25):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        cudart.memcpy_h2d_async(dst, src, n, stream.cuda_stream)
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times[5:])


def main() -> None:
    stream = torch.cuda.Stream()
    biggest = 448 * MB
    arena = HostArena(biggest, pin=True)
    pinned = torch.empty(biggest, dtype=torch.uint8).pin_memory()
    dst = torch.empty(biggest, dtype=torch.uint8, device="cuda")
    print(f"registered arena: {arena.registered}")
    print(f"{'bytes':>12} {'registered us':>14} {'torch-pinned us':>16}")
    for size in (64 * 1024, 1 * MB, 8 * MB, 32 * MB, 112 * MB, 448 * MB):
        a = host_us(arena.storage.data_ptr(), dst.data_ptr(), size, stream)
        b = host_us(pinned.data_ptr(), dst.data_ptr(), size, stream)
        print(f"{size:>12} {a:>14.1f} {b:>16.1f}")
    ev = torch.cuda.Event()
    t = []
    for _ in range(200):
        t0 = time.perf_counter()
        ev.record(stream)
        torch.cuda.current_stream().wait_event(ev)
        t.append((time.perf_counter() - t0) * 1e6)
    print(f"event record + wait: {statistics.median(t):.1f} us")
    arena.close()


if __name__ == "__main__":
    main()
