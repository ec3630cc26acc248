"""strategy auto, the path: every plan one order of moves (planner/strategy/auto_order.py) may give, in path order.

A plan of an order is a *step* (moves taken, buffer slots, spanning layer). For each prefix of the order
the path holds each slot count from 1 to the order's most (``prefetch_step`` when given), never as many
as the prefix prefetches layers but for 1 (that pool would hold every prefetched layer: no memory saved);
and where a prefix past the last prefetch move reads a layer no other layer is like through UVA, the
same with that layer prefetched *spanning* the slots (schemas/schedule.py: its buffers lie over the
slots' bytes, so it costs only what it holds beyond them). Within a prefix the steps go by peak, the
highest first. Last, when every eligible param may be read in place (backend auto, no kind held to
prefetch), every eligible param on UVA: the most any plan moves, with no pool.

One slot less frees a slot's bytes (a shorter prefix fits: more params stay resident) at a possible
stall; one more lets copies start earlier. ``fit.choose`` walks the path: the first step that fits and
that no later step beats (predicted faster at no higher peak). So the slot count, the spanning layer and
the prefix are chosen together by predicted time, and a larger budget never takes a later step: no
param moves from the GPU to the host, and the predicted step never grows.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate, chain, compress
from weakref import WeakKeyDictionary
from functools import cached_property
from typing import NamedTuple

from planner.cost.layer import LayerWork
from planner.cost.placement import PlacementCost
from planner.strategy.auto_order import span_placement
from planner.strategy.fit import Chosen, NoFit, Reckoning, Speed, Walk
from planner.strategy.order import NOT_MOVED, Order, Split, after_move, placement
from planner.strategy.peaks import Signatures, exact_pool_of, lower_peaks_by_slots, pools_by_slots
from schemas.buffer_pool import Signature
from schemas.spec import Layer


class Step(NamedTuple):  # a tuple: a search hashes many of them
    taken: int  # moves of the order taken (of the all-UVA order for ``all_uva``)
    slots: int
    span: int | None = None  # the position of the layer prefetched spanning the slots
    all_uva: bool = False  # every eligible param read in place through UVA


class AutoPath:
    """The steps of ``order`` (``uva``: the all-UVA order, or None when some kind must be prefetched), their
    reckoning (planner/strategy/peaks.py) and their speed (``cost``)."""

    def __init__(self, layers: Sequence[Layer], order: Order, total_bytes: int, cost: PlacementCost,
                 slots: int | None, uva: Order | None):
        self.layers, self.order, self.total, self.cost, self.uva = layers, order, total_bytes, cost, uva
        counts = [slots] if slots is not None else list(range(1, max(1, order.slots) + 1))
        self.counts = counts
        self._pinned = list(accumulate((m.nbytes for m in order.moves), initial=0))  # per prefix: the bytes it moves
        self._exact: dict[Step, int] = {}
        self._signatures = Signatures()
        self._span_pools: dict[tuple[int, int, int], int] = {}  # (slots, spanning layer, its bytes moved) -> pool
        self._ms: dict[Step, float] = {}
        self._least: dict[Step, float] = {}  # the step with every copy free (``least_ms``)
        self._floor: dict[int, float] = {}
        self._after = _split_after(order)  # per move: its layer's placement once it is taken
        side = _all_uva(uva, cost)
        self._uva_after, self._uva_works, self._uva_pinned, self._uva_floor = side
        self._uva_copying = [(p, bool(copied)) for p, (_, copied) in self._uva_after]
        self._moved: list[list[tuple[int, LayerWork]]] | None = None  # ``_moved_works``
        self._uva_moved: list[list[tuple[int, LayerWork]]] | None = None
        self._resident: tuple[float | None] | None = None  # ``resident_floor``, once made
        # a prefix has a step of each slot count from 1 (or the one given) to the most, fewer than it prefetches
        # layers but for the first (that pool would hold every prefetched layer: no memory saved); prefetched layers
        # never decrease along the order, so the prefixes with a step of ``s`` slots are those from ``self._from[s]``
        self._from = _first_with_slots(order, counts)
        # past the last prefetch move: the prefixes that may prefetch a layer spanning the slots, and its bytes
        last = max((i + 1 for i, m in enumerate(order.moves) if m.backend == "prefetch"), default=0)
        self._spans: dict[int, int] = {}  # taken -> the spanning layer's position
        self._span_bytes: dict[int, int] = {}  # taken -> bytes the spanning layer would prefetch
        if last:  # span_candidate of every prefix from ``last`` on, in one pass (each layer's moved bytes only grow)
            moved: dict[int, int] = {}
            best = None
            for taken, m in enumerate(order.moves, start=1):
                if m.unique:
                    moved[m.position] = moved.get(m.position, 0) + m.nbytes
                    if best is None or (moved[m.position], -m.position) > (moved[best], -best):
                        best = m.position
                if taken >= last and best is not None:
                    self._spans[taken] = best
                    self._span_bytes[taken] = moved[best]
        self.all_uva_step = Step(len(uva.moves), counts[0], all_uva=True) if uva is not None and uva.moves else None
        self._steps: list[Step] | None = None

    # what only some paths need is made on first use: the bounds (a path whose steps no search asks about needs
    # none), and what an exact peak or a predicted step reads
    @cached_property
    def _pools(self) -> dict[int, list[int]]:
        """Per slot count, per prefix: an upper bound on its pool (``peaks``)."""
        return pools_by_slots(self.order, self.counts)[1]

    @cached_property
    def _lower(self) -> dict[int, list[int]]:
        """Per slot count, per prefix: a lower bound on its peak (``lower_peaks``)."""
        return lower_peaks_by_slots(self.order, self.total, self.counts)

    @cached_property
    def _least_lower(self) -> dict[int, list[int]]:
        """Per slot count, minus the lowest lower bound on the peak of its steps without a span up to each (from
        ``self._from``): nondecreasing (``first_with``)."""
        return {s: [-lower for lower in accumulate(self._lower[s][self._from[s]:], min)] for s in self.counts}

    @cached_property
    def _works(self) -> list[tuple[int, tuple[LayerWork, ...]]]:
        """Per move: its layer's position and work per workload item once it is taken."""
        return [(p, self.cost.layer_works(p, split)) for p, split in self._after]

    @cached_property
    def _sigs(self) -> list[tuple[int, Signature]]:
        """Per move: its layer's pool signature once it is taken."""
        return [(p, self._signatures.of(self.layers[p], copied)) for p, (_, copied) in self._after]

    @cached_property
    def _copying(self) -> list[tuple[int, bool]]:
        """Per move: does its layer copy params once it is taken?"""
        return [(p, bool(copied)) for p, (_, copied) in self._after]

    @property
    def steps(self) -> list[Step]:
        """The path's steps in path order (made on first use: a search may need only their bounds)."""
        if self._steps is None:
            self._steps = self._made_steps()
        return self._steps

    def _here(self, taken: int) -> list[int]:
        """The slot counts of the steps of prefix ``taken``, the most (the highest peak) first."""
        return [s for s in reversed(self.counts) if self._from[s] <= taken]

    def _made_steps(self) -> list[Step]:
        n = len(self.order.moves)
        steps = []
        for taken in range(n + 1):
            here = self._here(taken)
            options = [Step(taken, s) for s in here]
            span = self._spans.get(taken)
            if span is not None:
                options = sorted(options + [Step(taken, s, span) for s in here],
                                 key=lambda st: -self._upper_of(st))  # by peak (a spanning step's is exact)
            steps += options
        if self.all_uva_step is not None:
            steps.append(self.all_uva_step)
        return steps

    # the reckoning and the speed are made on each use: a path holding its own bound methods would be a reference
    # cycle, and its thousands of steps would wait for the cycle collector (planner/build.py's plan pauses it)
    @property
    def reckoning(self) -> Reckoning[Step]:
        return Reckoning(peak=self.peak, pinned=self.pinned, upper=self._upper_of, lower=self._lower_of)

    @property
    def speed(self) -> Speed[Step]:
        return Speed(step_ms=self.step_ms, floor=self.floor, moves=_same_moves)

    def choose(self, gpu_budget: int | None, cpu_budget: int | None) -> Chosen[Step] | NoFit[Step]:
        """``fit.choose`` on this path."""
        return Walk(self.steps, self.reckoning, cpu_budget, self.speed).choose(gpu_budget)

    def placed(self, st: Step) -> dict[int, dict[str, str]]:
        if st.all_uva:
            assert self.uva is not None
            return placement(self.uva, st.taken)
        return span_placement(self.order, st.taken, st.span)

    def pinned(self, st: Step) -> int:
        if st.all_uva:
            return self._uva_pinned
        return self._pinned[st.taken]

    def peak(self, st: Step) -> tuple[int, int]:
        pinned = self.pinned(st)
        if st not in self._exact:
            if st.all_uva:
                self._exact[st] = 0
            elif st.span is None and self._lower[st.slots][st.taken] == self._upper_of(st):
                self._exact[st] = self._pools[st.slots][st.taken]  # the bounds meet
            elif st.span is not None:
                # past the last prefetch move only UVA moves follow: the pool differs only by the spanning layer's
                # params, which its bytes moved tell apart
                key = (st.slots, st.span, self._span_bytes[st.taken])
                if key not in self._span_pools:
                    sigs = dict(self._sigs[:st.taken])
                    sigs[st.span] = self._signatures.of(self.layers[st.span], self._span_split(st)[1])
                    self._span_pools[key] = exact_pool_of(sigs, st.slots, (st.span,))
                self._exact[st] = self._span_pools[key]
            else:
                self._exact[st] = exact_pool_of(dict(self._sigs[:st.taken]), st.slots)
        return self.total - pinned + self._exact[st], pinned

    def _upper_of(self, st: Step) -> int:
        if st.all_uva or st.span is not None:
            return self.peak(st)[0]
        return self.total - self._pinned[st.taken] + self._pools[st.slots][st.taken]

    def _lower_of(self, st: Step) -> int:
        if st.all_uva:
            return self.peak(st)[0]
        lower = self._lower[st.slots][st.taken]
        if st.span is None:
            return lower
        # the arena holds the slots (at least their bound) and, over them, the spanning layer's buffers
        resident = self.total - self.pinned(st)
        return resident + max(lower - resident, self._span_bytes[st.taken])

    def step_ms(self, st: Step) -> float:
        found = self._ms.get(st)
        if found is None:
            # each layer's last move taken: does it copy params? (the spanning layer copies its unique moves)
            copying = dict((self._uva_copying if st.all_uva else self._copying)[:st.taken])
            if st.span is not None:
                copying[st.span] = bool(self._span_split(st)[1])
            prefetched = sorted(compress(copying, copying.values()))
            span = () if st.span is None else (st.span,)
            found = self._ms[st] = self.cost.forward_step_ms(self._forwards(st), prefetched, st.slots, span)
        return found

    def least_ms(self, st: Step) -> float:
        """At most ``step_ms(st)``: it, once simulated, else the step with every copy free
        (``PlacementCost.without_copies_ms``)."""
        found = self._ms.get(st)
        return found if found is not None else self._least_of(st)

    def resident_floor(self) -> float | None:
        """Under the predicted step of every step of the path: the step with nothing offloaded, where the cost can
        tell it is (``PlacementCost.resident_floor``); else None."""
        if self._resident is None:
            self._resident = (self.cost.resident_floor(chain(self._after, self._uva_after)),)
        return self._resident[0]

    def _least_of(self, st: Step) -> float:
        found = self._least.get(st)
        if found is None:
            found = self._least[st] = self.cost.without_copies_ms(self._forwards(st))
        return found

    def _forwards(self, st: Step) -> list[list[LayerWork]]:
        """Per workload item, the forward of ``st``'s placement (``PlacementCost.forward``)."""
        moved = self._moved_works(st.all_uva)
        if st.span is None:
            return [self.cost.forward(k, item[:st.taken]) for k, item in enumerate(moved)]
        works = self.cost.layer_works(st.span, self._span_split(st))
        return [self.cost.forward(k, item[:st.taken] + [(st.span, works[k])]) for k, item in enumerate(moved)]

    def _moved_works(self, all_uva: bool) -> list[list[tuple[int, LayerWork]]]:
        """Per workload item, per move of the order (of the all-UVA order): its layer's position and work once it is
        taken (``PlacementCost.forward``'s pairs), made once."""
        if all_uva:
            if self._uva_moved is None:
                self._uva_moved = [[(p, w[k]) for p, w in self._uva_works] for k in range(len(self.cost.tokens))]
            return self._uva_moved
        if self._moved is None:
            self._moved = [[(p, w[k]) for p, w in self._works] for k in range(len(self.cost.tokens))]
        return self._moved

    def _span_split(self, st: Step) -> Split:
        """The spanning layer's placement in ``st``: its unique moves prefetched (spanning the slots) instead of read
        through UVA."""
        moved = frozenset(p for m in self.order.moves[:st.taken] if m.position == st.span and m.unique
                          for p in m.params)
        uva, copied = next(split for p, split in reversed(self._after[:st.taken]) if p == st.span)
        return uva - moved, copied | moved

    def floor(self, st: Step) -> float:
        """Under the predicted step of this step and of every later one: the order's moves up to here with the
        layers no other layer is like left resident (each later step reads them through UVA or copies them:
        no less work), and the all-UVA step's own bound."""
        if st.all_uva:
            return self._uva_floor  # type: ignore[return-value]
        if st.taken not in self._floor:
            placed: dict[int, dict[str, str]] = {}
            for move in self.order.moves[:st.taken]:
                if not move.unique:
                    placed.setdefault(move.position, {}).update(dict.fromkeys(move.params, move.backend))
            self._floor[st.taken] = self.cost.lower_ms(placed)
        found = self._floor[st.taken]
        return found if self._uva_floor is None else min(found, self._uva_floor)

    def lowest_peak(self, cpu_budget: int | None) -> int:
        """``fit.first_fit(self.steps, self.reckoning, 0, cpu_budget).peak``: the lowest exact peak of the steps
        within ``cpu_budget`` (a prefix of the path; the first step's peak when none is). No peak is below 0, so a
        step fitting no bytes is one of the lowest. Reckoned exactly only for the steps whose lower bound is below
        the lowest found, in the order of their bounds, starting from the least bound."""
        n = len(self.order.moves)
        end = n + 1 if cpu_budget is None else bisect_right(self._pinned, cpu_budget)  # the prefixes within
        if end == 0:
            return self.peak(self.steps[0])[0]
        uva = self.all_uva_step
        uva = uva if end > n and uva is not None and (cpu_budget is None or self._uva_pinned <= cpu_budget) else None
        if uva is not None and self.peak(uva)[0] <= self.total - self._pinned[end - 1]:
            return self.peak(uva)[0]  # no other step within holds fewer bytes than the last one's resident ones
        others = [(self._lower_of(st), st) for st in self._span_steps(end)]
        if uva is not None:
            others.append((self._lower_of(uva), uva))
        plain = {s: self._lower[s][self._from[s]:end] for s in self.counts if self._from[s] < end}
        least = min([(min(lows), s) for s, lows in plain.items()] + [(bound, -1) for bound, _ in others])
        if least[1] >= 0:
            s = least[1]
            best = self.peak(Step(self._from[s] + plain[s].index(least[0]), s))[0]
        else:
            best = self.peak(next(st for bound, st in others if bound == least[0]))[0]
        below = [(lows[i], self._from[s] + i, s) for s, lows in plain.items() for i in compress(range(len(lows)), map(
            best.__gt__, lows))]  # could be lower
        for low, taken, s in sorted(below):
            if low >= best:
                break
            best = min(best, self.peak(Step(taken, s))[0])
        for low, st in sorted(others, key=lambda pair: pair[0]):
            if low >= best:
                break
            best = min(best, self.peak(st)[0])
        return best

    def _span_steps(self, end: int) -> list[Step]:
        """The steps with a spanning layer of the prefixes before ``end``."""
        return [Step(taken, s, span) for taken, span in self._spans.items() if taken < end for s in self._here(taken)]

    def fits(self, st: Step, budget: int) -> bool:
        """Does ``st`` peak within ``budget``? (its bounds first, the exact pool only between them)"""
        if self._lower_of(st) > budget:
            return False
        return self._upper_of(st) <= budget or self.peak(st)[0] <= budget

    def first_with(self, slots: int, budget: int, cpu_budget: int | None) -> Step | None:
        """The first step without a spanning layer that uses ``slots`` and fits ``budget`` and ``cpu_budget``
        (the steps before the first whose peak's lower bound is within ``budget`` are passed over at once)."""
        start = bisect_left(self._least_lower[slots], -budget)  # the steps before it cannot fit
        for taken in range(self._from[slots] + start, len(self.order.moves) + 1):
            st = Step(taken, slots)
            if self.within(st, budget, cpu_budget):
                return st
        return None

    def within(self, st: Step, budget: int, cpu_budget: int | None) -> bool:
        """Does ``st`` pin at most ``cpu_budget`` (None: any) and peak within ``budget``?"""
        return (cpu_budget is None or self.pinned(st) <= cpu_budget) and self.fits(st, budget)


def _same_moves(st: Step) -> tuple[bool, int]:
    """Equal for steps moving the same params (``fit.Speed.moves``)."""
    return st.all_uva, st.taken


class _AllUva(NamedTuple):
    """What the paths of one all-UVA order share (made once per order and cost, ``_all_uva``): per move its layer's
    placement and work (``_split_after``), the bytes pinned, and the floor under its step (``AutoPath.floor``)."""

    after: list
    works: list
    pinned: int
    floor: float | None


_SHARED: WeakKeyDictionary = WeakKeyDictionary()  # cost -> id(all-UVA order) -> (the order, its _AllUva)


def _all_uva(uva: Order | None, cost: PlacementCost) -> _AllUva:
    if uva is None:
        return _AllUva([], [], 0, None)
    mine = _SHARED.setdefault(cost, {})
    found = mine.get(id(uva))
    if found is None or found[0] is not uva:
        after = _split_after(uva)
        floor = cost.lower_ms(placement(uva, len(uva.moves))) if uva.moves else None
        found = mine[id(uva)] = (uva, _AllUva(after, [(p, cost.layer_works(p, split)) for p, split in after],
                                              sum(m.nbytes for m in uva.moves), floor))
    return found[1]


def _first_with_slots(order: Order, counts: Sequence[int]) -> dict[int, int]:
    """Per slot count of ``counts``, the first prefix of ``order`` with a step of that many slots: the first
    count at once, another once more layers are prefetched than it (``len(order.moves) + 1``: never)."""
    out = {counts[0]: 0}
    waiting = sorted(s for s in counts[1:])
    seen: set[int] = set()
    for i, m in enumerate(order.moves):
        if not waiting:
            break
        if m.backend == "prefetch" and m.position not in seen:
            seen.add(m.position)
            while waiting and len(seen) > waiting[0]:
                out[waiting.pop(0)] = i + 1
    out.update(dict.fromkeys(waiting, len(order.moves) + 1))
    return out


def _split_after(order: Order) -> list[tuple[int, Split]]:
    """Per move of ``order``: its layer's position and that layer's placement once the moves up to it are taken
    (``order.after_move``)."""
    current: dict[int, Split] = {}
    # (placement before, params, backend) -> after, by the objects' identity (the moves of one description share
    # their params tuple): equal keys of other objects make equal placements, only once more
    made: dict[tuple[int, int, str], tuple[Split, Split, tuple[str, ...]]] = {}
    out = []
    for m in order.moves:
        before = current.get(m.position, NOT_MOVED)
        key = (id(before), id(m.params), m.backend)
        found = made.get(key)
        if found is None:
            found = made[key] = (after_move(before, m), before, m.params)  # holds the keys' objects alive
        current[m.position] = found[0]
        out.append((m.position, found[0]))
    return out
