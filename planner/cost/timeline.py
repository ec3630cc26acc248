"""One forward of a plan, simulated on three clocks: the CPU, the compute stream, the copy stream.

The forward is the event graph that the runtime builds (docs/DESIGN.md, "Prefetch
schedule"): layer x's kernels start once the CPU has issued them and the previous layer
is done; a prefetched layer also waits for its copy-done event; the copies triggered before
layer x wait for an event recorded on the compute stream just before x and for the copy
stream to be free; the forward ends when the compute stream has joined the copy stream and
the CPU has issued everything; a layer that reads a result back mid-layer (an eager MoE block's
routing) makes the CPU wait for the GPU there. Walking the layers in order and taking the latest of each
node's inputs computes that graph's critical path in one pass: the step time. The slack
shows up as stalls (compute waiting for a copy) and idle link time.

Slots whose copy the plan issues in the previous forward (``previous_forward``) start the
forward filled, as the runtime leaves them; their copies for the next forward run in this
one and are part of its step, since the forward ends with the join.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.cost.layer import LayerWork


@dataclass(frozen=True)
class Copy:
    layer: int  # position of the prefetched layer
    trigger: int  # position of the layer before which the copy is issued
    previous_forward: bool


@dataclass
class LayerTime:
    start: float = 0.0  # ms from the forward's start, on the compute stream
    end: float = 0.0
    stall: float = 0.0  # waiting for this layer's copy
    copy_start: float | None = None  # the copy of this layer's params issued in this forward
    copy_end: float | None = None


@dataclass
class Timeline:
    step_ms: float
    compute_ms: float
    copy_ms: float
    stall_ms: float
    cpu_ms: float
    layers: list[LayerTime] = field(default_factory=list)

    @property
    def bound(self) -> str:
        busiest = max(("copy", self.copy_ms), ("compute", self.compute_ms), ("cpu", self.cpu_ms),
                      key=lambda kv: kv[1])
        return busiest[0]


def simulate(work: Sequence[LayerWork], copies: Sequence[Copy]) -> Timeline:
    """The timeline of one steady-state forward of layers with ``work``, prefetching ``copies``."""
    n = len(work)
    by_trigger: dict[int, list[Copy]] = {}
    for c in copies:
        by_trigger.setdefault(c.trigger, []).append(c)
    for group in by_trigger.values():  # the runtime issues a trigger's copies in the order they are used
        group.sort(key=lambda c: c.layer + (n if c.previous_forward else 0))
    waits_for = {c.layer: c for c in copies}
    done: dict[int, float] = {}  # this forward's copy-done time of each prefetched layer
    times = [LayerTime() for _ in range(n)]
    cpu = gpu = link = 0.0
    stall_total = 0.0
    for x in range(n):
        here = max(gpu, cpu)  # the event recorded on the compute stream just before layer x
        for c in by_trigger.get(x, ()):
            start = max(link, here)
            link = start + work[c.layer].copy_ms
            times[c.layer].copy_start, times[c.layer].copy_end = start, link
            if not c.previous_forward:
                done[c.layer] = link
        start = here
        if x in waits_for and not waits_for[x].previous_forward:
            ready = done.get(x, 0.0)  # the schedule issues every copy before its layer runs
            if ready > start:
                times[x].stall = ready - start
                stall_total += ready - start
                start = ready
        wx = work[x]
        if wx.synced_gpu_ms is None:
            cpu += wx.cpu_ms
            gpu = max(start + wx.gpu_ms, cpu)
        else:  # the CPU reads a result back mid-layer: it waits for the first part to finish
            cpu += wx.cpu_ms - wx.synced_cpu_ms
            gpu = max(start + wx.gpu_ms - wx.synced_gpu_ms, cpu)
            cpu = gpu + wx.synced_cpu_ms
            gpu = max(gpu + wx.synced_gpu_ms, cpu)
        times[x].start, times[x].end = start, gpu
    step = max(gpu, link, cpu)
    return Timeline(step_ms=step, compute_ms=sum(w.gpu_ms for w in work),
                    copy_ms=sum(w.copy_ms for w in work if w.copy_bytes), stall_ms=stall_total,
                    cpu_ms=cpu, layers=times)
