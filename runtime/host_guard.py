"""A split layer's host part kept to what the host can do in a forward: the GPU reads the rest through UVA.

The cpu backend's plan splits a layer's routed experts between the link (UVA) and the host CPU so that both sides
finish together, at the host's speed that ``planner calibrate`` measured. A host can be slower in a forward than
calibrate saw (on the H200 on 2026-12-03 one machine's host part took 2-3x as long as another's, and a hybrid plan
then ran 1.33x the step of reading every expert through UVA: docs/BENCHMARKS.md). The host's experts are in pinned
host memory, so the GPU can read any of them through UVA as well (the route a call above ``cpu_max_tokens`` takes).

``HostGuard`` keeps one split layer's *level*: how many of its experts in host memory the host computes. Those
experts are one array (runtime/cpu_experts.py ``_Placement``): the plan's uva experts, then its cpu experts; at level
L the host computes the last L and GPU kernels read the others through UVA in the layer's one GPU pass. It starts at
the plan's split (its cpu experts). In a measured call it reads (``Marks``: CUDA events on the stream, read a call
later without a synchronize) how long the stream ran the layer's GPU parts (``gpu_ms``) and how long it then waited
for the host's rows (``wait_ms``), and the host's thread reports how long its part took (``host_done``). The host's
time is the stream's view of it when the stream waited (``gpu_ms + wait_ms``: that includes the hand-off, which is
kept) and otherwise the thread's own figure plus the last hand-off seen. Per expert, the link's time is ``gpu_ms``
over the experts the GPU read and the host's is its time over ``level``; the level at which both sides finish
together is ``balanced``. When the two sides' times differ by more than ``DEADBAND`` of the longer and the balanced
level is an expert or more away, in two measured calls in a row, the level moves halfway to the nearer of their two
balanced levels (at least one expert). So one slow call moves nothing; a host slower than the plan's profile hands
experts to the link, and one faster takes experts from it, up to every one but one (``top``: the GPU's side stays
measured). A host so slow that its balanced level is below one expert, or whose part took longer than the GPU
would take to read every one of the layer's host-memory experts (at a few rows a call the host's fixed costs, the
hand-off among them, outweigh the experts it saves the link: a decode at batch 1), sends all its experts through UVA
for ``HOLD`` calls, doubling while it stays that slow (up to ``MAX_HOLD``), and is then tried again with one expert.
While the level holds, one call in ``SAMPLE`` is measured (three event records); while a move is asked for or made,
every other call is (the call right after a move is not: its host part meets new shapes, as a layer's first call
meets its first buffers). Both routes give an expert's rows within the backend's exactness tolerance (the GPU's are
the resident model's kernels'), so a move changes rounding only. The plan and its prediction do not change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

import torch

from schemas.measured import MeasuredHostLevel
from schemas.plan_experts import bypassed_host

log = logging.getLogger("runtime")

HOLD = 16  # calls with every host expert through UVA after the host's level first falls below one expert
MAX_HOLD = 1024  # the longest hold (it doubles while the host stays that slow)
SAMPLE = 4  # while the level holds, one call in this many is measured
DEADBAND = 0.05  # the level holds while the two sides' times differ by at most this share of the longer
GAIN = 0.5  # the share of the way to the balanced level a move takes
WAITED = 0.02  # the stream waited for the host when its wait exceeds this share of its GPU parts' time
SKIP = 1  # calls not measured after a move (the first at a new level meets new shapes on the host)


class Marks(Protocol):
    """Three marks on the stream a call: ``s`` before the GPU parts, ``a`` after them, ``b`` after the wait."""

    def record(self, name: str, stream: object) -> None: ...

    def ready(self) -> bool: ...

    def ms(self, first: str, second: str) -> float: ...


@dataclass(eq=False)
class CudaMarks:
    """``Marks`` as CUDA events with timing, reused from call to call."""

    events: dict[str, torch.cuda.Event] = field(
        default_factory=lambda: {name: torch.cuda.Event(enable_timing=True) for name in "sab"})

    def record(self, name: str, stream: object) -> None:
        self.events[name].record(stream)

    def ready(self) -> bool:
        return self.events["b"].query()

    def ms(self, first: str, second: str) -> float:
        return self.events[first].elapsed_time(self.events[second])


def balanced(host: int, link: int, level: int, gpu_ms: float, host_ms: float) -> float:
    """The host's experts (of ``host``) at which both sides of a layer finish together, from a call where the host
    computed ``level`` of them in ``host_ms`` and the GPU read the layer's ``link`` UVA experts and the other host
    experts in ``gpu_ms``."""
    per_link = gpu_ms / (link + host - level)
    per_host = host_ms / level
    return (link + host) * per_link / (per_link + per_host)


@dataclass(eq=False)
class HostGuard:
    """One split layer's level (module docstring). Used by the issuing thread, but ``host_done`` (the host's)."""

    name: str
    host: int  # the plan's host experts (its cpu experts)
    link: int  # the plan's uva experts: the rest of the layer's experts in host memory
    marks: Marks
    level: int = field(init=False)  # host experts the host computes now (the plan's at first)
    hold: int = 0  # calls left with every host expert through UVA
    next_hold: int = HOLD
    until_sample: int = 1  # calls before the next measured one (a layer's first call makes its buffers: not measured)
    vote: float | None = None  # the balanced level a measured call asked to move to, awaiting a second one
    pending: bool = False  # a measured call's marks not read yet
    measuring: bool = False  # this call is measured
    measured_level: int = 0  # the level of the measured call
    host_ms: float | None = None  # the measured call's host part, written by the host's thread
    handoff_ms: float = 0.0  # from the host's part ending to the stream seeing its rows, at the last wait measured
    moved_calls: int = 0  # calls whose host computed fewer experts than the plan's
    all_uva_calls: int = 0  # of them, calls with every host expert through UVA
    more_calls: int = 0  # calls whose host computed more experts than the plan's
    moves: int = 0  # times the level moved
    judged: tuple[float, float] = (0.0, 0.0)  # the last judged call's GPU parts and host part, ms (the host's as judged)

    def __post_init__(self) -> None:
        self.level = self.host

    @property
    def top(self) -> int:
        """The highest level: every host-memory expert of the layer on the host but one (the GPU's side is then still
        measured)."""
        return self.host + self.link - 1

    def host_turn(self) -> int:
        """How many of the layer's host-memory experts the host computes in this call (0: every one through UVA).
        Reads the last measured call's marks where the stream has passed them."""
        if self.pending and self.marks.ready():
            self.pending = False
            if self.host_ms is not None:  # None: the host's part failed; its error is raised elsewhere
                self._judge(self.marks.ms("s", "a"), self.marks.ms("a", "b"), self.host_ms)
        if self.hold:
            self.hold -= 1
            self.moved_calls += 1
            self.all_uva_calls += 1
            return 0
        self.measuring = not self.pending and self.until_sample == 0
        if self.measuring:
            self.measured_level, self.host_ms = self.level, None
            self.until_sample = SAMPLE - 1
        elif self.until_sample:
            self.until_sample -= 1
        self.moved_calls += self.level < self.host
        self.more_calls += self.level > self.host
        return self.level

    def host_done(self, ms: float) -> None:
        """The host's thread: the measured call's host part took ``ms``."""
        self.host_ms = ms

    def _judge(self, gpu_ms: float, wait_ms: float, host_ms: float) -> None:
        level = self.measured_level
        if wait_ms > WAITED * gpu_ms:  # the stream waited: its view, and how long the rows took to reach it
            self.handoff_ms = max(0.0, gpu_ms + wait_ms - host_ms)
            host_ms = gpu_ms + wait_ms
        else:  # the host's own figure, and the hand-off the last wait showed
            host_ms += self.handoff_ms
        self.judged = (gpu_ms, host_ms)
        every_ms = gpu_ms / (self.link + self.host - level) * (self.link + self.host)  # the GPU reading them all
        # a host part that outlasts the GPU reading every one of them (its fixed costs at few rows): none on the host
        target = 0.0 if bypassed_host(host_ms, every_ms) else min(float(self.top), balanced(self.host, self.link, level, gpu_ms,
                                                                                host_ms))
        if target >= 1:
            self.next_hold = HOLD
            if abs(host_ms - gpu_ms) <= DEADBAND * max(host_ms, gpu_ms) or abs(target - level) < 1:
                self.vote = None  # balanced as it is
                return
        if self.vote is None or (self.vote < level) != (target < level):  # a first call asking for this move
            self.vote, self.until_sample = target, SKIP
            return
        target = min(self.vote, target, key=lambda t: abs(t - level))  # the smaller move the two calls ask for
        self.vote, self.until_sample = None, SKIP  # the call at the new level is not measured, the next one is
        if target < 1:  # slower than the link even for one expert: all through UVA for a while
            self.hold, self.level = self.next_hold, 1
            self.next_hold = min(2 * self.next_hold, MAX_HOLD)
            self._moved(level, 0, gpu_ms, host_ms)
            return
        step = GAIN * (target - level)
        new = level + (max(1, round(step)) if step > 0 else min(-1, round(step)))
        self.level = max(1, min(self.top, new))
        self._moved(level, self.level, gpu_ms, host_ms)

    def _moved(self, old: int, new: int, gpu_ms: float, host_ms: float) -> None:
        self.moves += 1
        below = new < self.host
        # a warning the first time the host falls below the plan (no call below it yet); other moves at INFO
        (log.warning if below and self.moved_calls == 0 else log.info)(
            "%s: the host took %.2f ms for %d experts (the plan's: %d) where the GPU read %d through UVA in %.2f: the "
            "host now computes %d%s (the host is %s than the plan's profile; see runtime/host_guard.py)", self.name,
            host_ms, old, self.host, self.link + self.host - old, gpu_ms, new,
            f", all through UVA for the next {self.hold} calls" if new == 0 else "", "slower" if below else "faster")

    def before_parts(self, stream: object) -> None:
        if self.measuring:
            self.marks.record("s", stream)

    def after_parts(self, stream: object) -> None:
        if self.measuring:
            self.marks.record("a", stream)

    def after_wait(self, stream: object) -> None:
        if self.measuring:
            self.marks.record("b", stream)
            self.measuring, self.pending = False, True

    def summary(self) -> dict[str, int | float]:
        """For ``Handle.stats()``: the plan's host experts, the host's now, and the calls below and above the plan; the
        last judged call's GPU parts and host part (hand-off included) and the last hand-off seen, in ms (0 before
        any; the cost model's host part leaves the hand-off out)."""
        gpu_ms, host_ms = self.judged
        return MeasuredHostLevel(  # the stats file's record of it (schemas/measured.py)
            planned=self.host, now=0 if self.hold else self.level, moved_calls=self.moved_calls,
            all_uva_calls=self.all_uva_calls, more_calls=self.more_calls, gpu_ms=round(gpu_ms, 3),
            host_ms=round(host_ms, 3), handoff_ms=round(self.handoff_ms, 3)).model_dump()
