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
from functools import cached_property
from typing import NamedTuple

from planner.cost.layer import LayerWork
from planner.cost.link import ONE_LINK, Link


class Copy(NamedTuple):
    layer: int  # position of the prefetched layer
    trigger: int  # position of the layer before which the copy is issued
    previous_forward: bool


@dataclass(slots=True)
class LayerTime:
    start: float = 0.0  # ms from the forward's start, on the compute stream
    end: float = 0.0
    stall: float = 0.0  # waiting for this layer's copy
    copy_start: float | None = None  # the copy of this layer's params issued in this forward
    copy_end: float | None = None


@dataclass
class Timeline:
    step_ms: float
    stall_ms: float
    cpu_ms: float
    work: Sequence[LayerWork] = field(default=(), repr=False)  # the layers' work simulated
    shared_ms: float = 0.0  # what UVA reads lost on the compute stream to the copies sharing the link
    # per layer, as simulated: start and end on the compute stream; the stalls (layer -> ms) and the copies
    # (layer -> its copy's place in the link's queue, ``link``) where there are any; ``layers`` joins them
    starts: list[float] = field(default_factory=list, repr=False)
    ends: list[float] = field(default_factory=list, repr=False)
    stalls: dict[int, float] = field(default_factory=dict, repr=False)
    queued: dict[int, int] = field(default_factory=dict, repr=False)
    link: Link = field(default_factory=Link, repr=False)

    @cached_property
    def compute_ms(self) -> float:
        """The compute stream's busy time, UVA reads slowed by the copies they share the link with."""
        return sum(w.gpu_ms for w in self.work) + self.shared_ms

    @cached_property
    def copy_ms(self) -> float:
        return sum(w.copy_ms for w in self.work if w.copy_bytes)

    @cached_property
    def layers(self) -> list[LayerTime]:
        """Each layer's times (made when asked for: a search reads only the step)."""
        out = []
        for x, (start, end) in enumerate(zip(self.starts, self.ends)):
            record = LayerTime(start, end, self.stalls.get(x, 0.0))
            k = self.queued.get(x)
            if k is not None:
                record.copy_start, record.copy_end = self.link.starts[k], self.link.ends[k]
            out.append(record)
        return out

    @property
    def bound(self) -> str:
        busiest = max(("copy", self.copy_ms), ("compute", self.compute_ms), ("cpu", self.cpu_ms),
                      key=lambda kv: kv[1])
        return busiest[0]


def simulate(work: Sequence[LayerWork], copies: Sequence[Copy | tuple[int, int, bool]],
             share: float = ONE_LINK, cpu_start: float = 0.0) -> Timeline:
    """The timeline of one steady-state forward of layers with ``work``, prefetching ``copies`` (each a Copy, or a
    plain tuple of its fields: a search makes them by the thousand); ``share``: of its own rate, what a copy and a
    UVA read each keep while both use the link (``planner.cost.link``); ``cpu_start``: where the CPU's clock starts
    (the model's own work outside its layers, ``planner.cost.layer.model_cpu_ms``)."""
    n = len(work)
    # the copies in the order they are issued: by trigger, and a trigger's in the order they are used (the runtime
    # issues them so), each as one number: trigger * 2n + the layer it fills (plus n for the next forward's)
    width = 2 * n
    issue = sorted(trigger * width + (layer + n if previous_forward else layer)
                   for layer, trigger, previous_forward in copies if 0 <= trigger < n)
    issue.append(n * width)  # past the last trigger
    j = 0  # the next copy to issue: issue[j]
    limit = width  # the copies issued before layer x are those below (x + 1) * width
    # layers that wait for a copy this forward issues (a copy issued in the previous forward is there already)
    waits = {layer for layer, previous in {layer: previous for layer, _, previous in copies}.items() if not previous}
    done: set[int] = set()  # layers whose copy this forward issues for this forward
    queued: dict[int, int] = {}  # layer -> its copy's place in the link's queue (its times: link.starts, link.ends)
    stalls: dict[int, float] = {}
    starts, ends = [0.0] * n, [0.0] * n
    link = Link(share)
    copy_starts, copy_ends = link.starts, link.ends  # moved in place by the link's reads
    free = 0.0  # ``link.free``, kept here between the link's reads (``Link.queue`` written out: the same sums)
    cpu, gpu, host = cpu_start, 0.0, 0.0
    stall_total = shared_total = 0.0
    # the hot loop: max(a, b) is written ``b if b > a else a`` (the same value, without a call)
    for x, wx in enumerate(work):
        here = cpu if cpu > gpu else gpu  # the event recorded on the compute stream just before layer x
        while issue[j] < limit:  # the copies triggered before layer x
            used = issue[j] - limit + width
            if used < n:
                done.add(used)
            else:
                used -= n
            begin = here if here > free else free
            free = begin + work[used].copy_ms
            copy_starts.append(begin)
            copy_ends.append(free)
            queued[used] = len(copy_ends) - 1
            j += 1
        limit += width
        start = here
        if x in waits:
            ready = copy_ends[queued[x]] if x in done else 0.0  # the schedule issues every copy before its layer runs
            if ready > start:
                stalls[x] = ready - start
                stall_total += ready - start
                start = ready
        if wx.host_ms:  # the host's thread: from when the stream reaches the experts, joined at the layer's end
            cpu += wx.cpu_ms
            reach = max(start + wx.gpu_ms - wx.beside_ms, cpu)
            host = max(reach, host) + wx.host_ms
            shared = 0.0
            gpu = max(reach + wx.joined_ms, host)
        elif wx.synced_gpu_ms is None:
            cpu += wx.cpu_ms
            if wx.uva_link_ms and free > start + wx.uva_at_ms:
                link.free = free
                shared = link.read(start + wx.uva_at_ms, wx.uva_link_ms)
                free = link.free
            else:
                shared = 0.0
            gpu = start + wx.gpu_ms + shared
            if cpu > gpu:
                gpu = cpu
        else:  # the CPU reads a result back mid-layer: it waits for the first part to finish
            cpu += wx.cpu_ms - wx.synced_cpu_ms
            link.free = free
            shared = link.read(start, wx.uva_link_ms - wx.synced_uva_link_ms)
            gpu = max(start + wx.gpu_ms - wx.synced_gpu_ms + shared, cpu)
            cpu = gpu + wx.synced_cpu_ms
            later = link.read(gpu, wx.synced_uva_link_ms)
            free = link.free
            gpu = max(gpu + wx.synced_gpu_ms + later, cpu)
            shared += later
        shared_total += shared
        starts[x], ends[x] = start, gpu
    link.free = free
    step = max(gpu, free, cpu)
    return Timeline(step_ms=step, stall_ms=stall_total, cpu_ms=cpu, work=work, shared_ms=shared_total, starts=starts,
                    ends=ends, stalls=stalls, queued=queued, link=link)

