"""A cheap lower bound on the peak of a budget-search state, with its exact offloaded bytes.

The budget search (planner/select_budget.py) must find the first state of its ladder whose
plan fits, and the lowest peak when none does. Evaluating a state (planner/cost.py) costs
time linear in the number of offloaded layers, and a ladder has as many states as layers, so
evaluating them all is quadratic. ``TierBound`` answers, for a state ``n`` of one tier, the
exact offloaded bytes and number of offloaded layers, and a lower bound on the peak, in time
linear in the number of *pieces* of the tier's members: stretches of consecutive members whose
(bytes, layers) added repeat with a short period (a run of identical blocks is one piece of
period 1; a stack alternating dense and MoE blocks one piece of period 2). The search evaluates
only the states whose bound does not rule them out.

Why the counts are exact: ``spread(M, n)`` chooses index ``i`` iff
``floor((i+1)n/M) > floor(in/M)`` (a difference of 0 or 1), so it chooses
``floor(e*n/M) - floor(s*n/M)`` of the indices in ``[s, e)``, and of the indices
``s + r + p*q`` (``q < Q``) the difference of two sums of ``floor((a*q + b)/M)``, each
computed in O(log M) steps (``floor_sum``).

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
from planner.select import spread


MAX_PERIOD = 16  # longest repeating pattern of blocks looked for


@dataclass(frozen=True)
class Piece:
    start: int  # member indices [start, end)
    end: int
    pattern: tuple[tuple[int, int], ...]  # member start + j adds pattern[j % len(pattern)]: (bytes, layers)


def floor_sum(count: int, m: int, a: int, b: int) -> int:
    """sum(floor((a*q + b) / m) for q in range(count)), for a, b >= 0 and m > 0, in O(log) steps."""
    total = 0
    while count > 0:
        if a >= m:
            total += (count - 1) * count // 2 * (a // m)
            a %= m
        if b >= m:
            total += count * (b // m)
            b %= m
        top = a * count + b
        if top < m:
            break
        count, b, m, a = top // m, top % m, a, m
    return total


def pieces(added: list[tuple[int, int]]) -> list[Piece]:
    """Cover ``added`` with pieces, greedily the longest stretch a period up to MAX_PERIOD repeats over."""
    out, j, size = [], 0, len(added)
    while j < size:
        best_end, best_period = j + 1, 1
        for period in range(1, min(MAX_PERIOD, size - j) + 1):
            end = j + period
            while end < size and added[end] == added[end - period]:
                end += 1
            if end - j >= 2 * period and end > best_end:
                best_end, best_period = end, period
        out.append(Piece(j, best_end, tuple(added[j:j + best_period])))
        j = best_end
    return out


@dataclass(frozen=True)
class TierBound:
    members: int  # M
    base_bytes: int
    base_layers: int  # layers offloaded at every state of the tier
    pieces: tuple[Piece, ...]
    added: tuple[tuple[int, int], ...]  # per member: (bytes, layers) it adds
    work: int  # steps to count a state by pieces (floor sums weigh a few steps each)
    smallest_layer: int  # bytes of the smallest layer that may be offloaded in this tier
    total_bytes: int

    def offloaded(self, n: int) -> tuple[int, int]:
        """Exact (offloaded bytes, offloaded layers) at state n."""
        nbytes, layers = self.base_bytes, self.base_layers
        m = self.members
        if n <= self.work:
            for j in spread(m, n):
                b, k = self.added[j]
                nbytes += b
                layers += k
            return nbytes, layers
        for piece in self.pieces:
            if len(piece.pattern) == 1:
                count = piece.end * n // m - piece.start * n // m
                nbytes += piece.pattern[0][0] * count
                layers += piece.pattern[0][1] * count
                continue
            p = len(piece.pattern)
            for r, (b, k) in enumerate(piece.pattern):
                first = piece.start + r
                q = -(-(piece.end - first) // p)
                count = floor_sum(q, m, p * n, (first + 1) * n) - floor_sum(q, m, p * n, first * n)
                nbytes += b * count
                layers += k * count
        return nbytes, layers

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
    cut = pieces(added)
    kept = [c for c in base if c is not None]
    sizes = [c.nbytes for c in kept] + [full[i].nbytes for i in members]
    return TierBound(
        members=len(members), base_bytes=sum(c.nbytes for c in kept), base_layers=len(kept),
        pieces=tuple(cut), added=tuple(added), work=sum(1 if len(c.pattern) == 1 else 8 * len(c.pattern) for c in cut),
        smallest_layer=min(sizes), total_bytes=total_bytes)
