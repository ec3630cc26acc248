"""Host memory shared by the host's expert matmuls and the GPU's reads of it: copies against UVA (issue 21).

    PYTHONPATH=. python bench/probe_host_sharing.py > $OUT/host-sharing.jsonl      # the H200

Decode at batch 32 with the host computing some experts and the GPU reading the others through UVA is bound by
host memory: the two read it at about 85 GB/s together where the host alone reads 116 (docs/BENCHMARKS.md, issue
21). Would the GPU's share cost the host less as bulk copies (the copy engine, as a prefetch slot fills) than as
UVA reads (a kernel's many small reads)? In one process, each for about a second, the rates of:

- ``host``: the host's padded batched matmul of experts (Qwen3-MoE's: 64 experts of 1,536 x 2,048 gate and up
  projections, bf16, 2 rows each), as the cpu backend runs it, its weights' bytes / the time;
- ``copy``: 1 GiB pinned host-to-GPU copies on a side stream;
- ``uva``: a 1-token matmul reading a 1 GiB weight through UVA on a side stream;
- ``host+copy`` and ``host+uva``: the host's loop for as long as the GPU's queued work runs (about a second),
  each rate over that time.
Threads: torch's default (the machine's cores)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.uva import device_view  # noqa: E402

GB = 1e9
EXPERTS, ROWS, WIDTH, HIDDEN = 64, 2, 1536, 2048
COPY_BYTES = 1 << 30


def host_loop(weights: torch.Tensor, x: torch.Tensor, seconds: float, done=None) -> tuple[float, int]:
    """(seconds it ran, bytes of weights it read): the padded batched matmul until ``seconds`` have passed, or
    until ``done()`` (the GPU's queued work finished)."""
    start = time.perf_counter()
    n = 0
    while (done() is False) if done else (time.perf_counter() - start < seconds):
        torch.bmm(x, weights.transpose(1, 2))
        n += 1
    return time.perf_counter() - start, n * weights.numel() * weights.element_size()


def gpu_rate(work, calls: int, nbytes: int, stream: torch.cuda.Stream) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        for _ in range(calls):
            work()
        end.record()
    return start, end


def main() -> int:
    device = torch.device("cuda")
    weights = torch.randn(EXPERTS, WIDTH, HIDDEN, dtype=torch.bfloat16)
    x = torch.randn(EXPERTS, ROWS, HIDDEN, dtype=torch.bfloat16)
    host_loop(weights, x, 0.3)  # warm
    pinned = torch.empty(COPY_BYTES, dtype=torch.uint8).pin_memory()
    target = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    big = torch.randn(COPY_BYTES // 2 // 8192, 8192, dtype=torch.bfloat16).pin_memory()
    uva = device_view(big, device)
    token = torch.randn(1, 8192, dtype=torch.bfloat16, device=device)
    side = torch.cuda.Stream()
    works = {"copy": lambda: target.copy_(pinned, non_blocking=True), "uva": lambda: token @ uva.T}
    for work in works.values():  # warm
        gpu_rate(work, 2, COPY_BYTES, side)
    torch.cuda.synchronize()

    seconds, nbytes = host_loop(weights, x, 1.0)
    print(json.dumps({"case": "host", "host_gbps": round(nbytes / seconds / GB, 1), "threads": torch.get_num_threads()}),
          flush=True)
    for name, work in works.items():
        start, end = gpu_rate(work, 20, COPY_BYTES, side)
        torch.cuda.synchronize()
        ms = start.elapsed_time(end)
        print(json.dumps({"case": name, "gpu_gbps": round(20 * COPY_BYTES / ms / 1e6, 1)}), flush=True)
    for name, work in works.items():
        calls = 50  # about a second at the link's rate
        start, end = gpu_rate(work, calls, COPY_BYTES, side)
        seconds, nbytes = host_loop(weights, x, 0.0, done=end.query)
        torch.cuda.synchronize()
        ms = start.elapsed_time(end)
        print(json.dumps({"case": f"host+{name}", "host_gbps": round(nbytes / seconds / GB, 1),
                          "gpu_gbps": round(calls * COPY_BYTES / ms / 1e6, 1), "gpu_ms": round(ms, 1),
                          "host_s": round(seconds, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
