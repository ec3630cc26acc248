"""The host link as one resource: the copy stream's prefetch copies and the UVA reads of the compute
stream draw on the same bandwidth.

Measured on the H200 (docs/DESIGN.md, "Cost model"): a 4 GiB pinned copy alone 55.4 GB/s, a matmul
reading 4 GiB through UVA alone 51.3 GB/s, both at once on two streams 161 ms for the 8 GiB: the time
of both is the sum of each alone. That is a work-conserving link; which share each stream gets while
both run was not measured, and the model gives them equal shares (processor sharing): while both are
busy each moves at ``share`` of its own rate, then the one left runs at its full rate.

``share`` comes from the profile's ``link_shared_gbps`` (a copy and a UVA read of equal bytes at once,
measured by ``planner calibrate``): 0.5 is one link taken in turns, 1 two independent links. A profile
without it is taken as one link (0.5).
"""

from __future__ import annotations

from schemas.hardware import HardwareProfile

ONE_LINK = 0.5  # each of two streams gets half the link while both run
_LEAST_SHARE = 0.05


def link_share(hw: HardwareProfile) -> float:
    """The share of its own rate a copy and a UVA read each keep while both use the link.

    With equal bytes B of each, alone they take ``c = B/h2d`` and ``u = B/uva``; at once, both at
    ``share`` until the shorter is done, then the longer alone: ``min(c, u)/share + |c - u|``, which the
    calibration measured as ``2B/link_shared_gbps``."""
    if hw.link_shared_gbps is None:
        return ONE_LINK
    copy, read = 1.0 / hw.h2d_gbps, 1.0 / hw.uva_gbps
    shared = 2.0 / hw.link_shared_gbps - abs(copy - read)
    if shared <= 0.0:
        return 1.0
    return min(1.0, max(_LEAST_SHARE, min(copy, read) / shared))


class Link:
    """The copy stream's queue on the host link. ``queue`` queues a copy (``simulate`` writes it out in its loop:
    the same sums); ``read`` lets UVA reads of the compute stream share the link with the copies in flight,
    delaying both.

    The copies are kept as numbers, by their place in the queue: ``starts[k]`` and ``ends[k]`` are the k-th
    copy's times, moved by the reads that overlap it."""

    def __init__(self, share: float = ONE_LINK) -> None:
        self.share = share
        self.free = 0.0  # when the copy stream has done every copy queued so far
        self.starts: list[float] = []
        self.ends: list[float] = []
        # the queue places of copies that may still be in flight: ``_open`` and every place from ``_unread`` on (the
        # copies queued since the last read)
        self._open: list[int] = []
        self._unread = 0

    def queue(self, issued: float, ms: float) -> int:
        """Queue a copy of ``ms`` issued at ``issued``: its place in the queue."""
        start = issued if issued > self.free else self.free
        self.free = start + ms
        self.starts.append(start)
        self.ends.append(self.free)
        return len(self.ends) - 1

    def read(self, at: float, ms: float) -> float:
        """UVA reads needing ``ms`` of the link alone, from ``at``: the delay they take, the same delay the
        copies in flight take (both run at ``share`` while they overlap). The copies' times are moved."""
        waiting = self.free - at
        if ms <= 0.0 or waiting <= 0.0 or self.share >= 1.0:
            return 0.0
        both = min(ms, waiting)  # link time of each stream spent while both run
        delay = both * (1.0 / self.share - 1.0)

        def moved(t: float) -> float:
            if t <= at:
                return t
            return at + (t - at) / self.share if t - at <= both else t + delay

        starts, ends = self.starts, self.ends
        self._open = [k for k in self._open if ends[k] > at]
        self._open += [k for k in range(self._unread, len(ends)) if ends[k] > at]
        self._unread = len(ends)
        for k in self._open:
            starts[k], ends[k] = moved(starts[k]), moved(ends[k])
        self.free = moved(self.free)
        return delay
