"""One forward of a plan, simulated on three clocks: the CPU, the compute stream, the copy stream.

The forward is the event graph that the runtime builds (docs/DESIGN.md, "Prefetch
schedule"): layer x's kernels start once the CPU has issued them and the previous layer
is done; a prefetched layer also waits for its copy-done event; the copies triggered before
layer x wait for an event recorded on the compute stream just before x and for the copy
stream to be free; the forward ends when the compute stream has joined the copy stream and
the CPU has issued everything; a layer that reads a result back mid-layer (an eager MoE block's
routing) makes the CPU wait for the GPU there; a layer whose experts the host computes (the cpu backend) runs
them on a fourth clock, the host's own thread, which starts when the stream reaches them and which the stream
waits for at the layer's end. Walking the layers in order and taking the latest of each
node's inputs computes that graph's critical path in one pass: the step time. The slack
shows up as stalls (compute waiting for a copy) and idle link time.

The copy stream and the UVA reads of the compute stream share the one host link
(``planner.cost.link``): a layer's UVA reads, taken at the start of the layer (of its part after a
mid-layer wait), slow down with the copies in flight then, and those copies with them.

Slots whose copy the plan issues in the previous forward (``previous_forward``) start the
forward filled, as the runtime leaves them; their copies for the next forward run in this
one and are part of its step, since the forward ends with the join.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.cost.layer import LayerWork
from planner.cost.link import ONE_LINK, Link


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
    compute_ms: float  # the compute stream's busy time, UVA reads slowed by the copies they share the link with
    copy_ms: float
    stall_ms: float
    cpu_ms: float
    layers: list[LayerTime] = field(default_factory=list)

    @property
    def bound(self) -> str:
        busiest = max(("copy", self.copy_ms), ("compute", self.compute_ms), ("cpu", self.cpu_ms),
                      key=lambda kv: kv[1])
        return busiest[0]


def simulate(work: Sequence[LayerWork], copies: Sequence[Copy], share: float = ONE_LINK) -> Timeline:
    """The timeline of one steady-state forward of layers with ``work``, prefetching ``copies``; ``share``:
    of its own rate, what a copy and a UVA read each keep while both use the link (``planner.cost.link``)."""
    n = len(work)
    by_trigger: dict[int, list[Copy]] = {}
    for c in copies:
        by_trigger.setdefault(c.trigger, []).append(c)
    for group in by_trigger.values():  # the runtime issues a trigger's copies in the order they are used
        group.sort(key=lambda c: c.layer + (n if c.previous_forward else 0))
    waits_for = {c.layer: c for c in copies}
    done: set[int] = set()  # layers whose copy this forward issues for this forward
    times = [LayerTime() for _ in range(n)]
    link = Link(share)
    cpu = gpu = host = 0.0
    stall_total = shared_total = 0.0
    for x in range(n):
        here = max(gpu, cpu)  # the event recorded on the compute stream just before layer x
        for c in by_trigger.get(x, ()):
            link.copy(here, work[c.layer].copy_ms, times[c.layer])
            if not c.previous_forward:
                done.add(c.layer)
        start = here
        if x in waits_for and not waits_for[x].previous_forward:
            ready = times[x].copy_end if x in done else 0.0  # the schedule issues every copy before its layer runs
            if ready > start:
                times[x].stall = ready - start
                stall_total += ready - start
                start = ready
        wx = work[x]
        if wx.host_ms:  # the host's thread: from when the stream reaches the experts, joined at the layer's end
            cpu += wx.cpu_ms
            reach = max(start + wx.gpu_ms - wx.beside_ms, cpu)
            host = max(reach, host) + wx.host_ms
            shared = 0.0
            gpu = max(reach + wx.joined_ms, host)
        elif wx.synced_gpu_ms is None:
            cpu += wx.cpu_ms
            shared = link.read(start, wx.uva_link_ms) if wx.uva_link_ms else 0.0
            gpu = max(start + wx.gpu_ms + shared, cpu)
        else:  # the CPU reads a result back mid-layer: it waits for the first part to finish
            cpu += wx.cpu_ms - wx.synced_cpu_ms
            shared = link.read(start, wx.uva_link_ms - wx.synced_uva_link_ms)
            gpu = max(start + wx.gpu_ms - wx.synced_gpu_ms + shared, cpu)
            cpu = gpu + wx.synced_cpu_ms
            later = link.read(gpu, wx.synced_uva_link_ms)
            gpu = max(gpu + wx.synced_gpu_ms + later, cpu)
            shared += later
        shared_total += shared
        times[x].start, times[x].end = start, gpu
    step = max(gpu, link.free, cpu)
    return Timeline(step_ms=step, compute_ms=sum(w.gpu_ms for w in work) + shared_total,
                    copy_ms=sum(w.copy_ms for w in work if w.copy_bytes), stall_ms=stall_total,
                    cpu_ms=cpu, layers=times)
