"""The budget strategy's search: the fewest evenly spread stack layers whose plan fits the budget.

The search climbs a ladder of tiers. Without ``offload.prefer`` there is one tier: all
eligible params of a layer move together, and step ``n`` offloads the first ``n`` candidates
of a fixed priority order (the last layer, then the others spread evenly: ``last_first``).
With ``prefer``, tier ``t`` offloads the params of the ``t``-th kind: every layer keeps the
params of the earlier tiers offloaded (those tiers are exhausted) and the first ``n`` of the
layers holding the tier's kind, in the same priority order, offload that kind too. States are
tried in ladder order (tier, then n) and the first that fits wins. Every state offloads all
that the states before it offload, and the priority order never depends on the budget, so a
larger budget never moves a param from the GPU to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.buffer_pool import signature
from planner.strategy.footprint import Candidate, Cost, evaluate
from planner.strategy.peak_bound import tier_bound
from functools import cached_property

from planner.strategy.spread_order import last_first
from schemas.spec import Tensor


@dataclass(frozen=True)
class Tier:
    """One rung set of the ladder.

    ``base[i]``/``full[i]``: what stack layer ``i`` (of those with eligible params) offloads
    before this tier / with this tier's params added (None: nothing). ``members``: the
    layers that hold params of this tier, in execution order.
    """

    kinds: tuple[str, ...]  # the kinds this tier moves; () = every eligible param at once (no prefer)
    base: tuple[Candidate | None, ...]
    full: tuple[Candidate | None, ...]
    members: tuple[int, ...]

    @cached_property
    def priority(self) -> tuple[int, ...]:
        """Member indices in the order they are taken (planner/strategy/spread_order.py)."""
        return tuple(last_first(len(self.members)))

    def chosen(self, n: int) -> list[int]:
        """The layers (indices into base/full) that offload this tier's params at step n, in execution order."""
        return [self.members[j] for j in sorted(self.priority[:n])]

    def pick(self, n: int) -> list[Candidate]:
        """The offloaded layers at step n, in execution order."""
        if not any(self.base):
            return [self.full[i] for i in self.chosen(n)]  # type: ignore[misc]
        on = set(self.chosen(n))
        out = []
        for i, (base, full) in enumerate(zip(self.base, self.full)):
            c = full if i in on else base
            if c is not None:
                out.append(c)
        return out

    def base_bytes(self) -> int:
        return sum(c.nbytes for c in self.base if c is not None)

    def member_bytes(self) -> list[int]:
        return [self.full[i].nbytes - (self.base[i].nbytes if self.base[i] else 0)  # type: ignore[union-attr]
                for i in self.members]


def single_tier(candidates: Sequence[Candidate]) -> Tier:
    """The ladder without prefer: each candidate's eligible params move together."""
    return Tier((), (None,) * len(candidates), tuple(candidates), tuple(range(len(candidates))))


def prefer_tiers(layers: Sequence[tuple[int, Sequence[Tensor], Sequence[str]]],
                 prefer: Sequence[str]) -> list[Tier]:
    """The ladder with prefer: one tier per preferred kind present, in order, then one for the other kinds.

    ``layers``: (position, eligible tensors, their kinds) for each block-stack layer with eligible params.
    """
    rest = len(prefer)

    def rank(kind: str) -> int:
        return prefer.index(kind) if kind in prefer else rest

    ranks = [[rank(k) for k in kinds] for _, _, kinds in layers]
    present = sorted({r for rs in ranks for r in rs})
    interned: dict = {}  # one signature object per distinct param set: the pool builder groups by identity

    def candidate(position: int, tensors: Sequence[Tensor], rs: list[int], upto: int) -> Candidate | None:
        chosen = [t for t, r in zip(tensors, rs) if r <= upto]
        if not chosen:
            return None
        sig = signature(chosen)
        return Candidate(position, tuple(t.name for t in chosen), sum(t.nbytes for t in chosen),
                         interned.setdefault(sig, sig))

    tiers = []
    for i, r in enumerate(present):
        below = present[i - 1] if i else -1
        base = tuple(candidate(p, ts, rs, below) for (p, ts, _), rs in zip(layers, ranks))
        full = tuple(candidate(p, ts, rs, r) for (p, ts, _), rs in zip(layers, ranks))
        members = tuple(j for j, rs in enumerate(ranks) if r in rs)
        kinds = (prefer[r],) if r < rest else tuple(sorted({k for _, _, ks in layers for k in ks if rank(k) == rest}))
        tiers.append(Tier(kinds, base, full, members))
    return tiers


@dataclass(frozen=True)
class Search:
    fit: Cost | None  # the plan with the fewest offloaded layers that fits, or None
    lowest: Cost  # the lowest peak seen (over every state when nothing fits) within the cpu budget
    state: tuple[int, int] | None = None  # (tier, n) of the fit
    lowest_state: tuple[int, int] | None = None  # (tier, n) of ``lowest``


def previous_state(tiers: Sequence[Tier], tier: int, n: int) -> tuple[int, int] | None:
    """The state just below (tier, n) on the ladder (None below the bottom)."""
    if n > 1 or (n == 1 and tier == 0):
        return tier, n - 1
    if tier == 0:
        return None
    return tier - 1, len(tiers[tier - 1].members)


def search(
    tiers: Sequence[Tier],
    *,
    total_bytes: int,
    num_layers: int,
    backend: str,
    step: int,
    gpu_budget: int,
    cpu_budget: int | None,
    start: tuple[int, int] = (0, 0),
) -> Search:
    """The first state (t, n) in ladder order (n = 0 only on the first tier) whose plan fits.

    A plan fits when its peak is within ``gpu_budget`` and its pinned bytes within ``cpu_budget``.
    When nothing fits, ``lowest`` is the plan with the lowest peak within the cpu budget, the first
    one found when the states are tried in ladder order, except that the states whose resident
    bytes alone exceed the budget whatever layers are picked come last.

    ``start``: no state before it in ladder order is tried.

    Only the states that ``peak_bound`` cannot rule out are evaluated (planner/strategy/peak_bound.py).
    """
    common = dict(total_bytes=total_bytes, num_layers=num_layers, backend=backend, step=step)
    bounds = [tier_bound(t.base, t.full, t.members, total_bytes=total_bytes) for t in tiers]
    exact: dict[tuple[int, int], Cost] = {}

    def cost(t: int, n: int) -> Cost:
        if (t, n) not in exact:
            picked = tiers[t].pick(n)
            exact[t, n] = evaluate(picked, range(len(picked)), **common)
        return exact[t, n]

    states = []  # (peak bound, order, t, n) of every state within the cpu budget
    for t, (tier, bound) in enumerate(zip(tiers, bounds)):
        first = _fewest_possible(tier.member_bytes(), total_bytes - tier.base_bytes(), gpu_budget)
        for n in range(0 if t == 0 else 1, len(tier.members) + 1):
            if (t, n) < start:
                continue
            offloaded, layers = bound.offloaded(n)
            if cpu_budget is not None and offloaded > cpu_budget:
                continue
            peak = bound.peak_bound(n, offloaded, layers, backend, step)
            if n >= first and peak <= gpu_budget and cost(t, n).peak_gpu_bytes <= gpu_budget:
                return Search(exact[t, n], exact[t, n], (t, n))
            states.append((peak, (n < first, t, n), t, n))
    states.sort()
    lowest: Cost | None = None
    lowest_order: tuple = ()
    lowest_state = None
    for peak, order, t, n in states:  # nothing fits: the lowest peak, for the error message
        if lowest is not None and (peak, order) > (lowest.peak_gpu_bytes, lowest_order):
            break
        found = cost(t, n)
        if lowest is None or (found.peak_gpu_bytes, order) < (lowest.peak_gpu_bytes, lowest_order):
            lowest, lowest_order, lowest_state = found, order, (t, n)
    if lowest is None:  # every state from ``start`` on pins too much
        return Search(None, cost(*start), None, start)
    return Search(None, lowest, None, lowest_state)


def _fewest_possible(member_bytes: Sequence[int], resident: int, gpu_budget: int) -> int:
    """A lower bound on n: even the n largest members leave more than the budget resident below it."""
    for n, nbytes in enumerate(sorted(member_bytes, reverse=True)):
        if resident <= gpu_budget:
            return n
        resident -= nbytes
    return len(member_bytes)
