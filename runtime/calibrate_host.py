"""The host CPU's figures for the cpu backend (``planner calibrate``; schemas/hardware.py ``host_*``).

The kernel measured is the one the backend runs: ``runtime.expert_math.host_rows`` (the padded pass) over
Qwen3-MoE-shaped experts (hidden 2048, width 768, bf16; 32 of them, 302 MB, so a pass takes milliseconds), every
expert seeing the same number of rows:

- ``host_expert_gbps``: GB/s of expert weights the kernel reads, at 1, 2, 4 and 8 rows an expert;
- ``host_tflops``: the arithmetic rate at 256 rows an expert (compute-bound);
- ``host_call_us``: a call over tiny experts (the sort, the copies, the Python) plus, on a GPU machine, the round
  trip of the routing to the host and the rows back;
- ``host_link_share``: the rate at 2 rows an expert while a GPU kernel reads 2 GiB of pinned host memory through
  UVA, as a share of the rate alone.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from runtime.expert_math import Layout, host_rows, rows_dtype
from runtime.uva import device_view
from schemas.hardware_profile import RatePoint

HIDDEN, WIDTH, EXPERTS, TOP_K = 2048, 768, 32, 8


class _Experts(nn.Module):
    """What ``host_rows`` reads of an experts module (transformers' default gate: silu(gate) * up)."""

    def __init__(self) -> None:
        super().__init__()
        self.act_fn = nn.SiLU()

    def _apply_gate(self, a: torch.Tensor) -> torch.Tensor:
        gate, up = a.chunk(2, dim=-1)
        return self.act_fn(gate) * up


def _wall_ms(fn: Callable[[], object], repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _call(experts: int, hidden: int, width: int, rows: int, seed: int = 0) -> Callable[[], object]:
    """One host call over ``experts`` experts, each seeing ``rows`` rows."""
    g = torch.Generator().manual_seed(seed)
    weights = {"gate_up_proj": (torch.randn(experts, 2 * width, hidden, generator=g) / 40).to(torch.bfloat16),
               "down_proj": (torch.randn(experts, width, hidden, generator=g) / 40).to(torch.bfloat16)}  # the host's
    tokens = max(1, rows * experts // TOP_K)
    index = (torch.arange(tokens * TOP_K) % experts).view(tokens, TOP_K)
    routing = torch.full((tokens, TOP_K), 1 / TOP_K, dtype=torch.bfloat16)
    hidden_states = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    table = torch.arange(experts)
    module, layout = _Experts(), Layout("gate_up_proj", True, False, False, True, False)

    def run() -> None:
        out = torch.zeros(tokens * TOP_K, hidden, dtype=rows_dtype(hidden_states, routing))
        host_rows(module, layout, weights, table, hidden_states, index, routing, out)

    return run


def _round_trip_us(device: torch.device) -> float:
    """The routing of 32 tokens to the host and their rows back, with the wait between (GPU machines)."""
    if device.type != "cuda":
        return 0.0
    dev = torch.randn(32 * TOP_K, HIDDEN, dtype=torch.bfloat16, device=device)
    host = torch.empty(32, HIDDEN, dtype=torch.bfloat16, pin_memory=True)
    back = torch.empty_like(dev, device="cpu").pin_memory()

    def trip() -> None:
        host.copy_(dev[:32], non_blocking=True)
        torch.cuda.current_stream(device).synchronize()
        dev.copy_(back, non_blocking=True)

    return _wall_ms(trip, repeat=20) * 1e3


def _with_uva(device: torch.device, fn: Callable[[], object]) -> float | None:
    """``fn``'s wall ms while GPU kernels read 2 GiB of pinned host memory through UVA (None without CUDA)."""
    if device.type != "cuda":
        return None
    host = torch.full((2**30 // 8192, 8192), 0.001, dtype=torch.bfloat16).pin_memory()
    view = device_view(host, device)
    x = torch.randn(1, 8192, dtype=torch.bfloat16, device=device)
    torch.cuda.synchronize(device)
    done = torch.cuda.Event()
    for _ in range(4):
        x @ view.T
    done.record()
    times = []
    while not done.query():
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize(device)
    return statistics.median(times) if times else None


def host_experts(device: torch.device) -> dict[str, object]:
    """The ``host_*`` figures of a hardware profile, measured here with the threads the backend's host thread uses
    on a GPU machine (every CPU of the process's affinity but the one left to the thread issuing the forward)."""
    from runtime.cpu_experts import host_threads

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, host_threads() - 1) if device.type == "cuda" else threads)
    try:
        return _figures(device)
    finally:
        torch.set_num_threads(threads)


def _figures(device: torch.device) -> dict[str, object]:
    per_expert = 3 * WIDTH * HIDDEN * 2
    fixed_ms = _wall_ms(_call(8, 64, 32, 1), repeat=9)
    points, calls = [], {}
    for rows in (1, 2, 4, 8):
        calls[rows] = _call(EXPERTS, HIDDEN, WIDTH, rows, seed=rows)
        ms = max(_wall_ms(calls[rows]) - fixed_ms, 1e-3)
        points.append(RatePoint(tokens=rows, gbps=round(EXPERTS * per_expert / ms / 1e6, 3)))
    rows = 256
    flops = 2.0 * rows * EXPERTS * 3 * WIDTH * HIDDEN
    tflops = flops / max(_wall_ms(_call(EXPERTS, HIDDEN, WIDTH, rows), repeat=3) - fixed_ms, 1e-3) / 1e9
    figures: dict[str, object] = {"host_expert_gbps": points, "host_tflops": tflops,
                                  "host_call_us": fixed_ms * 1e3 + _round_trip_us(device)}
    busy = _with_uva(device, calls[2])
    if busy is not None:
        alone = _wall_ms(calls[2])
        figures["host_link_share"] = min(1.0, max(0.05, (alone - fixed_ms) / max(busy - fixed_ms, 1e-3)))
    return figures
