"""What bench_compare.py measures around one contender: step times, GPU peak, host memory, outputs.

Step time: the first call is a warm-up timed by the wall clock; a second warm-up follows when the
first took under a second. The number of timed steps falls with the step time (7 under 0.3 s, 5
under 1 s, 3 under 3 s, 2 under ``slow_s``, else 1) and never exceeds ``cap_s`` of timed work. On
the GPU each timed step is a pair of CUDA events around the call; on the CPU, the wall clock.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

MEMINFO_KEYS = ("MemAvailable", "Cached", "Mlocked", "Shmem", "Unevictable")
STATUS_KEYS = ("VmRSS", "VmPin", "VmLck")


def _read_kib(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys:
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def host_snapshot() -> dict[str, int]:
    """System-wide (/proc/meminfo) and this process's (/proc/self/status) host memory, in bytes."""
    return {**_read_kib("/proc/meminfo", MEMINFO_KEYS), **_read_kib("/proc/self/status", STATUS_KEYS)}


def host_added(before: dict[str, int], *after: dict[str, int]) -> dict[str, int | None]:
    """Host memory a contender added: the largest drop of MemAvailable over the snapshots taken
    after its setup, and the largest rise of the other counters."""
    if not before or not after:
        return {}
    out: dict[str, int | None] = {}
    for key in MEMINFO_KEYS + STATUS_KEYS:
        if key not in before:
            out[key] = None
            continue
        values = [a[key] for a in after if key in a]
        if not values:
            out[key] = None
        elif key == "MemAvailable":
            out[key] = before[key] - min(values)
        else:
            out[key] = max(values) - before[key]
    return out


def empty_host_cache() -> bool:
    """Release PyTorch's cached pinned host blocks (pin_memory()'s caching allocator), where this
    torch has a call for it; True when it did."""
    for owner, name in ((getattr(torch, "accelerator", None), "empty_host_cache"), (torch._C, "_host_emptyCache"),
                        (torch._C, "_accelerator_emptyHostCache")):
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is not None:
            try:
                fn()
                return True
            except RuntimeError:
                continue
    return False


def release(device: torch.device) -> bool:
    """Collect garbage and return cached GPU and pinned host memory; True when the host cache was emptied."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return empty_host_cache()
    return False


def gpu_allocated(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def gpu_peak(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


@dataclass
class Steps:
    """Timed steps of one contender on one workload."""

    step_ms: float  # median of times_ms
    times_ms: list[float]
    warmups: int
    first_call_s: float
    output: torch.Tensor | None = field(default=None, repr=False)  # the last call's output


def repeats_for(seconds: float, cap_s: float, slow_s: float = 8.0) -> int:
    """How many steps to time after warm-up, for a step of ``seconds``."""
    n = 7 if seconds < 0.3 else 5 if seconds < 1.0 else 3 if seconds < 3.0 else 2 if seconds < slow_s else 1
    return max(1, min(n, int(cap_s / max(seconds, 1e-6))))


def _wall(fn: Callable[[], torch.Tensor], device: torch.device) -> tuple[torch.Tensor, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - t0


def time_steps(fn: Callable[[], torch.Tensor], device: torch.device, *, slow_s: float = 8.0,
               cap_s: float = 10.0, min_repeat: int = 1, warm_again_s: float = 1.0) -> Steps:
    """Warm up and time ``fn`` (see the module docstring); ``fn`` returns the step's output.
    ``warm_again_s``: a first call under this gets a second warm-up (infinite for torch.compile,
    whose first call compiles)."""
    with torch.no_grad():
        out, first = _wall(fn, device)
        warmups, last = 1, first
        if first < warm_again_s:
            out, last = _wall(fn, device)
            warmups = 2
        n = max(min_repeat, repeats_for(last, cap_s, slow_s))
        times = []
        for _ in range(n):
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                out = fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                out, s = _wall(fn, device)
                times.append(s * 1e3)
    return Steps(statistics.median(times), [round(t, 3) for t in times], warmups, round(first, 3), out)


def compare(out: torch.Tensor | None, ref: torch.Tensor | None) -> tuple[bool | None, float | None]:
    """(torch.equal, max abs difference) of a contender's logits against the floor's."""
    if out is None or ref is None:
        return None, None
    out = out.to(ref.device)
    if out.shape != ref.shape:
        return False, None
    diff = (out.float() - ref.float()).abs().max().item() if out.numel() else 0.0
    return bool(torch.equal(out, ref)), diff


def h2d_gbps(device: torch.device, nbytes: int = 1 << 30) -> float | None:
    """Pinned host-to-GPU copy bandwidth (GB/s), median of CUDA-event timed copies; None on the CPU."""
    if device.type != "cuda":
        return None
    from runtime.calibrate import gpu_ms

    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    ms = gpu_ms(lambda: dst.copy_(src, non_blocking=True), repeat=10, warmup=2)
    return nbytes / ms / 1e6
