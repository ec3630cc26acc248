"""A cheap lower bound on the peak of a budget-search state, with its exact offloaded bytes.

The budget search (planner/select_budget.py) must find the first state of its ladder whose
plan fits, and the lowest peak when none does. Evaluating a state (planner/cost.py) costs
time linear in the number of offloaded layers, and a ladder has as many states as layers, so
evaluating them all is quadratic. ``TierBound`` answers, for a state ``n`` of one tier, the
exact offloaded bytes and number of offloaded layers, and a lower bound on the peak, in time
linear in the number of *runs* of the tier's members (maximal stretches of consecutive
members that add the same bytes and the same number of layers): one run for a stack of
identical blocks. The search evaluates only the states whose bound does not rule them out.

Why the counts are exact: ``spread(M, n)`` chooses index ``i`` iff
``floor((i+1)n/M) > floor(in/M)`` (a difference of 0 or 1), so it chooses
``floor(e*n/M) - floor(s*n/M)`` of the indices in ``[s, e)``.

Why the bound holds, for the prefetch backend: the pool has ``k = min(P, used + 1)`` slots for
``P`` offloaded layers, ``used`` the prefetch step (given, or the longest run of consecutive
offloaded layers, at least 1), and every slot holds at least one layer's buffers, so the pool
is at least ``k`` times the smallest layer that may be offloaded in this tier. The longest run
is at least that of the layers the tier always offloads (its base) and, when the tier's
members sit at consecutive positions, at least the longest run of ``spread(M, n)``, which is
``ceil(n / (M - n))`` for ``0 < n < M`` (tests/test_search_equivalence.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.select import longest_run, spread


@dataclass(frozen=True)
class Run:
    start: int  # member indices [start, end)
    end: int
    nbytes: int  # bytes each member of the run adds when chosen
    layers: int  # offloaded layers each adds (1 when its layer offloads nothing before the tier, else 0)


@dataclass(frozen=True)
class TierBound:
    members: int  # M
    base_bytes: int
    base_layers: int  # layers offloaded at every state of the tier
    runs: tuple[Run, ...]
    added: tuple[tuple[int, int], ...]  # per member: (bytes, layers) it adds; for states with n < len(runs)
    base_run: int  # longest run of consecutive positions among the base layers
    members_adjacent: bool  # the members sit at consecutive positions
    smallest_layer: int  # bytes of the smallest layer that may be offloaded in this tier
    total_bytes: int

    def offloaded(self, n: int) -> tuple[int, int]:
        """Exact (offloaded bytes, offloaded layers) at state n."""
        nbytes, layers = self.base_bytes, self.base_layers
        m = self.members
        if n < len(self.runs):
            for j in spread(m, n):
                b, k = self.added[j]
                nbytes += b
                layers += k
            return nbytes, layers
        for r in self.runs:
            count = r.end * n // m - r.start * n // m
            nbytes += r.nbytes * count
            layers += r.layers * count
        return nbytes, layers

    def min_run(self, n: int) -> int:
        """A lower bound on the longest run of consecutive offloaded positions at state n."""
        chosen = 0
        if n == self.members:
            chosen = n if self.members_adjacent else 1
        elif n:
            chosen = -(-n // (self.members - n)) if self.members_adjacent else 1
        return max(self.base_run, chosen)

    def peak_bound(self, n: int, offloaded: int, layers: int, backend: str, step: int | None) -> int:
        """A lower bound on the peak at state n (exact for uva), given ``offloaded(n)``."""
        resident = self.total_bytes - offloaded
        if backend != "prefetch" or not layers:
            return resident
        used = step if step is not None else max(1, self.min_run(n))
        return resident + min(layers, used + 1) * self.smallest_layer


def tier_bound(base, full, members, *, total_bytes: int, num_layers: int) -> TierBound:
    """The bound for one tier: ``base``/``full`` per layer (Candidate or None), ``members`` indices."""
    added = []
    for i in members:
        before = base[i]
        added.append((full[i].nbytes - (before.nbytes if before else 0), 0 if before else 1))
    runs: list[Run] = []
    for j, (b, k) in enumerate(added):
        if runs and (runs[-1].nbytes, runs[-1].layers) == (b, k):
            runs[-1] = Run(runs[-1].start, j + 1, b, k)
        else:
            runs.append(Run(j, j + 1, b, k))
    kept = [c for c in base if c is not None]
    positions = [full[i].position for i in members]
    sizes = [c.nbytes for c in kept] + [full[i].nbytes for i in members]
    return TierBound(
        members=len(members), base_bytes=sum(c.nbytes for c in kept), base_layers=len(kept),
        runs=tuple(runs), added=tuple(added),
        base_run=longest_run([c.position for c in kept], num_layers),
        members_adjacent=all(b == a + 1 for a, b in zip(positions, positions[1:])),
        smallest_layer=min(sizes), total_bytes=total_bytes)
