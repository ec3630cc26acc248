"""Per-forward copy statistics, measured with CUDA events, and each forward's peak GPU memory (recorded
only when stats are on).

Each copy and each wait carries the name of the layer it is for, so ``summary()`` can
say per layer what the copy and the stall took (``schemas.measured`` is the format). On
the CPU there are no CUDA events: copies are recorded with their layer and bytes and
``None`` for the events, and their times come out as ``None`` (not measured).

``PeakWatch`` resets the device's peak-memory statistic as each eager forward of the model starts and reads
``torch.cuda.max_memory_allocated`` as it ends: the forward's peak, weights, buffers, KV cache and
activations together, which ``planner explain --measured`` compares with the plan's parts. Resetting is
process-wide: while stats are on, ``max_memory_allocated`` outside counts from the last forward's start.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from torch import nn

from schemas.measured import MeasuredForward, MeasuredLayer


def _ms(a, b) -> float | None:
    return None if a is None or b is None else a.elapsed_time(b)


def _total(times: list[float | None]) -> float | None:
    timed = [t for t in times if t is not None]
    return round(sum(timed), 4) if timed else None


@dataclass
class ForwardStats:
    bytes: int = 0
    copies: list = field(default_factory=list)  # (layer name, start event, end event, bytes) on the copy stream
    stalls: list = field(default_factory=list)  # (layer name, before wait, after wait) on the compute stream
    late_copies: int = 0  # layers that found another layer's weights in their slot and copied then

    def summary(self) -> dict:
        copies = [(name, _ms(a, b), n) for name, a, b, n in self.copies]
        stalls = [(name, _ms(a, b)) for name, a, b in self.stalls]
        rows: dict[str, dict] = {}
        for name, ms, n in copies:
            row = rows.setdefault(name, {"name": name, "bytes": 0, "copy": [], "stall": []})
            row["bytes"] += n
            row["copy"].append(ms)
        for name, ms in stalls:
            rows.setdefault(name, {"name": name, "bytes": 0, "copy": [], "stall": []})["stall"].append(ms)
        layers = [MeasuredLayer(name=r["name"], bytes=r["bytes"], copy_ms=_total(r["copy"]),
                                stall_ms=_total(r["stall"])) for r in rows.values()]
        copy_ms = _total([ms for _, ms, _ in copies])
        timed_bytes = sum(n for _, ms, n in copies if ms is not None)
        return MeasuredForward(
            bytes_copied=self.bytes,
            copy_ms=copy_ms,
            stall_ms=_total([ms for _, ms in stalls]),
            copy_gbps=round(timed_bytes / copy_ms / 1e6, 2) if copy_ms else None,
            late_copies=self.late_copies,
            layers=layers,
        ).model_dump()


class PeakWatch:
    """The peak GPU memory of each of the model's last 100 eager forwards (CUDA only; not while dynamo traces
    or a CUDA graph captures, where no Python runs per forward)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peaks: deque[int] = deque(maxlen=100)

    def install(self, model: nn.Module, hooks: list) -> None:
        if self.device.type != "cuda":
            return
        hooks.append(model.register_forward_pre_hook(self._start))
        hooks.append(model.register_forward_hook(self._end))

    def _quiet(self) -> bool:
        return torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing()

    def _start(self, _module: nn.Module, _args: tuple) -> None:
        if not self._quiet():
            torch.cuda.reset_peak_memory_stats(self.device)

    def _end(self, _module: nn.Module, _args: tuple, _output) -> None:
        if not self._quiet():
            self.peaks.append(torch.cuda.max_memory_allocated(self.device))


def with_peaks(forwards: list[dict], peaks: list[int]) -> list[dict]:
    """The forwards' summaries with ``max_memory_allocated`` from ``peaks`` (one a forward, the latest last):
    aligned at the end; a backend that records no copies gets one row a forward."""
    if not peaks:
        return forwards
    if not forwards:
        return [MeasuredForward(bytes_copied=0, max_memory_allocated=p).model_dump() for p in peaks]
    n = min(len(forwards), len(peaks))
    out = list(forwards)
    for i in range(1, n + 1):
        out[-i] = {**out[-i], "max_memory_allocated": peaks[-i]}
    return out
