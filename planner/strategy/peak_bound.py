"""A cheap lower bound on the peak of a budget-search state, with its exact offloaded bytes.

The budget search (planner/strategy/budget.py) must find the first state of its ladder whose
plan fits, and the lowest peak when none does. Evaluating a state (planner/strategy/footprint.py) costs
time linear in the number of offloaded layers, and a ladder has as many states as layers, so
evaluating them all is quadratic. ``TierBound`` answers, for a state ``n`` of one tier, the
exact offloaded bytes and number of offloaded layers (prefix sums over the tier's fixed
priority order, planner/strategy/spread_order.py), and a lower bound on the peak, in constant time.
The search evaluates only the states whose bound does not rule them out.

Why the bound holds, for the prefetch backend: the pool has ``k = min(P, step)`` slots for
``P`` offloaded layers (the prefetch step is the number of slots), and every slot holds at
least the buffers of the largest layer it serves, so the pool is at least ``k`` times the
smallest layer that may be offloaded in this tier, and at least the offloaded bytes over the
most layers one slot serves (``ceil(P/k)``): a slot's largest layer is at least the mean of
its layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.schedule import num_slots
from planner.strategy.spread_order import last_first


@dataclass(frozen=True)
class TierBound:
    members: int  # M
    base_bytes: int
    base_layers: int  # layers offloaded at every state of the tier
    prefix: tuple[tuple[int, int], ...]  # after the first n members in priority order: (bytes, layers) added
    smallest_layer: int  # bytes of the smallest layer that may be offloaded in this tier
    total_bytes: int

    def offloaded(self, n: int) -> tuple[int, int]:
        """Exact (offloaded bytes, offloaded layers) at state n."""
        nbytes, layers = self.prefix[n]
        return self.base_bytes + nbytes, self.base_layers + layers

    def peak_bound(self, n: int, offloaded: int, layers: int, backend: str, step: int) -> int:
        """A lower bound on the peak at state n (exact for uva), given ``offloaded(n)``; ``step`` slots."""
        resident = self.total_bytes - offloaded
        if backend != "prefetch" or not layers:
            return resident
        slots = num_slots(layers, step)
        per_slot = -(-layers // slots)  # the most layers one slot serves
        return resident + max(slots * self.smallest_layer, -(-offloaded // per_slot))


def tier_bound(base, full, members, *, total_bytes: int) -> TierBound:
    """The bound for one tier: ``base``/``full`` per layer (Candidate or None), ``members`` indices."""
    added = []
    for i in members:
        before = base[i]
        added.append((full[i].nbytes - (before.nbytes if before else 0), 0 if before else 1))
    prefix = [(0, 0)]
    for j in last_first(len(added)):
        b, k = added[j]
        prefix.append((prefix[-1][0] + b, prefix[-1][1] + k))
    kept = [c for c in base if c is not None]
    sizes = [c.nbytes for c in kept] + [full[i].nbytes for i in members]
    return TierBound(
        members=len(members), base_bytes=sum(c.nbytes for c in kept), base_layers=len(kept),
        prefix=tuple(prefix), smallest_layer=min(sizes), total_bytes=total_bytes)
