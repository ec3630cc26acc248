"""A split layer's host part kept from holding the GPU up: when the host is late, the GPU reads its experts instead.

The cpu backend's plan splits a layer's routed experts between the link (UVA) and the host CPU so that both sides
finish together, at the host's speed that ``planner calibrate`` measured. A host can be slower in a forward than
calibrate saw (on the H200 on 2026-12-03 one machine's host part took 2-3x as long as another's, and a hybrid plan
then ran 1.33x the step of reading every expert through UVA: docs/BENCHMARKS.md). Its experts are in pinned host
memory, so the GPU can read them through UVA as well (the route a call above ``cpu_max_tokens`` takes).

``HostGuard`` watches one split layer. In a call it measures (``Marks``: CUDA events on the stream, read a call
later without a synchronize) how long the stream ran the layer's GPU parts (``gpu_ms``: the UVA part reading its
experts) and how long it then waited for the host's rows (``wait_ms``). Reading the host's experts through UVA would
add about ``gpu_ms * host / link`` (the host's experts over the link's, at the rate the link just gave; the GPU
parts also compute the experts held in GPU memory, so the estimate is high, and the guard errs toward the host). A
call is
*late* when the wait exceeds that by ``MARGIN``. After ``STRIKES`` late calls in a row the layer's host experts go
through UVA for ``HOLD`` calls, then the host is tried again; each time it is late again the hold doubles, up to
``MAX_HOLD``, and a call on time puts it back to ``HOLD``. While the host keeps up one call in ``SAMPLE`` is
measured (three event records a measured call). Both routes give the experts' rows within the backend's exactness
tolerance (the GPU's are the resident model's kernels'), so a reroute changes rounding only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

import torch

log = logging.getLogger("runtime")

STRIKES = 3  # late measured calls in a row before the host's experts go through UVA
HOLD = 16  # calls through UVA after a first reroute
MAX_HOLD = 1024  # the longest hold (it doubles while the host stays late)
SAMPLE = 4  # while the host keeps up, one call in this many is measured
MARGIN = 0.1  # late: the wait exceeds the UVA reads' estimate by this share


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


@dataclass(eq=False)
class HostGuard:
    """One split layer's watch (module docstring). Used by the issuing thread only."""

    name: str
    host: int  # experts the host computes
    link: int  # experts the GPU reads through UVA in the layer's GPU parts
    marks: Marks
    strikes: int = 0
    hold: int = 0  # calls left through UVA
    next_hold: int = HOLD
    until_sample: int = 0  # calls before the next measured one
    pending: bool = False  # a measured call's marks not read yet
    measuring: bool = False  # this call is measured
    rerouted: int = 0  # calls sent through UVA so far
    reroutes: int = 0  # times the guard rerouted

    def host_turn(self) -> bool:
        """Whether this call computes the host's experts on the host (else through UVA). Reads the last measured
        call's marks where the stream has passed them."""
        if self.pending and self.marks.ready():
            self.pending = False
            self._judge(self.marks.ms("s", "a"), self.marks.ms("a", "b"))
        if self.hold:
            self.hold -= 1
            self.rerouted += 1
            return False
        self.measuring = not self.pending and self.until_sample == 0
        if self.measuring:
            self.until_sample = SAMPLE - 1 if self.strikes == 0 and self.next_hold == HOLD else 0
        elif self.until_sample:
            self.until_sample -= 1
        return True

    def late(self, gpu_ms: float, wait_ms: float) -> bool:
        """Whether the stream waited for the host longer than reading its experts through UVA would take."""
        return wait_ms > gpu_ms * self.host / self.link * (1 + MARGIN)

    def _judge(self, gpu_ms: float, wait_ms: float) -> None:
        if not self.late(gpu_ms, wait_ms):
            self.strikes, self.next_hold = 0, HOLD
            return
        self.strikes += 1
        if self.strikes < STRIKES:
            return
        self.strikes, self.hold = 0, self.next_hold
        (log.warning if self.reroutes == 0 else log.info)(
            "%s: the host's %d experts kept the GPU waiting %.2f ms a call, where reading them through UVA would take "
            "about %.2f: they go through UVA for the next %d calls (the host is slower than the plan's profile; see "
            "runtime/host_guard.py)", self.name, self.host, wait_ms, gpu_ms * self.host / self.link, self.hold)
        self.reroutes += 1
        self.next_hold = min(2 * self.next_hold, MAX_HOLD)

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
