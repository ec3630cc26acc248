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

from collections.abc import Sequence
from dataclasses import dataclass

from planner.cost.placement import PlacementCost
from planner.strategy.auto_order import span_candidate, span_placement
from planner.strategy.fit import Chosen, NoFit, Reckoning, Speed, Walk
from planner.strategy.order import Order, placement, prefetched_layers
from planner.strategy.peaks import exact_pool, lower_peaks, peaks
from schemas.spec import Layer


@dataclass(frozen=True)
class Step:
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
        n = len(order.moves)
        prefetched = prefetched_layers(order)
        counts = [slots] if slots is not None else list(range(1, max(1, order.slots) + 1))
        self.counts = counts
        self._upper = {s: peaks(order, total_bytes, s) for s in counts}
        self._lower = {s: lower_peaks(order, total_bytes, s) for s in counts}
        self._exact: dict[Step, int] = {}
        self._ms: dict[Step, float] = {}
        self._floor: dict[int, float] = {}
        self._span_bytes: dict[int, int] = {}  # taken -> bytes the spanning layer would prefetch
        steps: list[Step] = []
        last = max((i + 1 for i, m in enumerate(order.moves) if m.backend == "prefetch"), default=0)
        for taken in range(n + 1):
            here = [s for s in counts if s == counts[0] or s < prefetched[taken]] if prefetched[taken] else counts[:1]
            span = span_candidate(order, taken) if taken >= last else None  # once every prefetch move is taken
            options = [Step(taken, s) for s in reversed(here)]  # the most slots, the highest peak, first
            if span is not None:
                self._span_bytes[taken] = sum(m.nbytes for m in order.moves[:taken] if m.position == span and m.unique)
                options = sorted(options + [Step(taken, s, span) for s in reversed(here)],
                                 key=lambda st: -self._upper_of(st))  # by peak (a spanning step's is exact)
            steps += options
        if uva is not None and uva.moves:
            steps.append(Step(len(uva.moves), counts[0], all_uva=True))
        self.steps = steps
        self._uva_floor = self.cost.lower_ms(placement(uva, len(uva.moves))) if uva is not None and uva.moves else None
        self.reckoning = Reckoning(peak=self.peak, pinned=self.pinned, upper=self._upper_of, lower=self._lower_of)
        self.speed = Speed(step_ms=self.step_ms, floor=self.floor, moves=lambda st: (st.all_uva, st.taken))
        self._walks: dict[int | None, Walk] = {}

    def choose(self, gpu_budget: int | None, cpu_budget: int | None) -> Chosen[Step] | NoFit[Step]:
        """``fit.choose`` on this path (which steps are kept is worked out once per CPU budget)."""
        if cpu_budget not in self._walks:
            self._walks[cpu_budget] = Walk(self.steps, self.reckoning, cpu_budget, self.speed)
        return self._walks[cpu_budget].choose(gpu_budget)

    def placed(self, st: Step) -> dict[int, dict[str, str]]:
        if st.all_uva:
            assert self.uva is not None
            return placement(self.uva, st.taken)
        return span_placement(self.order, st.taken, st.span)

    def pinned(self, st: Step) -> int:
        if st.all_uva:
            return sum(m.nbytes for m in self.uva.moves)  # type: ignore[union-attr]
        return self._upper[st.slots][st.taken][1]

    def peak(self, st: Step) -> tuple[int, int]:
        pinned = self.pinned(st)
        if st not in self._exact:
            if st.all_uva:
                self._exact[st] = 0
            elif st.span is None and self._lower[st.slots][st.taken] == self._upper[st.slots][st.taken][0]:
                self._exact[st] = self._upper[st.slots][st.taken][0] - (self.total - pinned)  # the bounds meet
            else:
                self._exact[st] = exact_pool(self.layers, self.placed(st), st.slots,
                                             () if st.span is None else (st.span,))
        return self.total - pinned + self._exact[st], pinned

    def _upper_of(self, st: Step) -> int:
        if st.all_uva or st.span is not None:
            return self.peak(st)[0]
        return self._upper[st.slots][st.taken][0]

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
        if st not in self._ms:
            span = () if st.span is None else (st.span,)
            self._ms[st] = self.cost.step_ms(self.placed(st), st.slots, span)
        return self._ms[st]

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

    def fits(self, st: Step, budget: int) -> bool:
        """Does ``st`` peak within ``budget``? (its bounds first, the exact pool only between them)"""
        if self._lower_of(st) > budget:
            return False
        return self._upper_of(st) <= budget or self.peak(st)[0] <= budget

    def first_with(self, slots: int, fits) -> Step | None:
        """The first step without a spanning layer that uses ``slots`` and satisfies ``fits``."""
        return next((st for st in self.steps if st.slots == slots and st.span is None and not st.all_uva
                     and fits(st)), None)
