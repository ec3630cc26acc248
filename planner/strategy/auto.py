"""strategy auto, deciding: every layer's eligible params, the order of moves (planner/strategy/auto_order.py),
the slot path (planner/strategy/auto_slots.py), the first pair on it that fits, as an Assignment plus the
facts its notes are written from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.assemble import Assignment
from planner.strategy.auto_order import build_order, span_placement, where
from planner.strategy.auto_slots import SlotPath, fixed_path, slot_path
from planner.errors import InfeasibleError
from planner.cost.placement import PlacementCost
from planner.layers import eligible_params
from planner.strategy.fit import NoFit, Reckoning, first_fit
from planner.strategy.infeasible import Infeasible, Need
from planner.strategy.order import Order
from planner.strategy.peaks import exact_pool, peaks
from schemas.hardware import HardwareProfile
from schemas.spec import Layer, MemorySection, OffloadSection
from schemas.workload import Workload


@dataclass(frozen=True)
class SlotOption:
    slots: int
    taken: int  # the shortest prefix that fits the budget with this many slots
    step_ms: float  # its predicted weighted step


@dataclass(frozen=True)
class RunnerUp:
    """The budget strategy's plan at the same budget, set beside auto's: its backend, bytes and predicted step."""

    backend: str
    offloaded_bytes: int
    step_ms: float
    ours_ms: float  # auto's plan's predicted step


@dataclass(frozen=True)
class AutoDecision:
    where: dict[str, dict[str, str]]
    order: Order
    taken: int
    peak_bound: int
    slots: int  # buffer slots of the plan
    all_uva: bool = False  # below the smallest prefetch pool: every eligible param on UVA
    searched: bool = False  # the slot count was chosen (no prefetch_step given)
    step_ms: float | None = None  # the chosen pair's predicted weighted step
    options: tuple[SlotOption, ...] = ()  # at this budget, the other slot counts that fit
    prefer: tuple[str, ...] = ()  # offload.prefer: kinds whose moves come first
    span: int | None = None  # the position of the layer prefetched spanning the slots (its unique moves)
    runner_up: RunnerUp | None = None  # the budget strategy's best plan at this budget (planner/build.py)

    def moves_by(self, backend: str) -> list:
        """The moves taken on ``backend`` as the order has them (a spanned layer's moves are its "uva" ones)."""
        return [m for m in self.order.moves[:self.taken] if m.backend == backend]

    def spanned(self, move) -> bool:
        """Is ``move`` one the plan prefetches spanning the slots instead of reading it through UVA?"""
        return self.span is not None and move.position == self.span and move.unique

    def in_place(self) -> list:
        """The moves read in place through UVA in the plan (the order's UVA moves less the spanned ones)."""
        return [m for m in self.moves_by("uva") if not self.spanned(m)]

    @property
    def prefetched(self) -> int:
        return len({m.position for m in self.moves_by("prefetch")})


def decide(layers: Sequence[Layer], shared: Mapping[str, set[str]], memory: MemorySection, offload: OffloadSection,
           hw: HardwareProfile, workload: Workload, step: int | None, total_bytes: int,
           cost: PlacementCost | None = None) -> AutoDecision:
    """The auto plan's placement (raises InfeasibleError when no pair fits the budgets).

    ``step``: the slot count the spec gives (offload.prefetch_step), else None: chosen by cost."""
    eligible = {layer.index: eligible_params(layer, offload.params, shared.get(layer.name, set()), offload.kinds)
                for layer in layers}
    only = offload.backend if offload.backend in ("prefetch", "uva") else None
    prefer = tuple(offload.prefer or ())
    forced = dict(offload.backends or {})
    order = build_order(layers, eligible, hw, workload, step, forced, only, prefer)
    if memory.gpu_budget is not None and total_bytes <= memory.gpu_budget:
        return AutoDecision({}, order, 0, total_bytes, step or 1, searched=step is None, prefer=prefer)
    cost = cost or PlacementCost(layers, hw, workload)
    cache: dict[tuple[int, int, int | None], float] = {}

    def step_ms(taken: int, slots: int, span: int | None = None) -> float:
        key = (taken, min(slots, order.slots), span)
        if key not in cache:
            cache[key] = cost.step_ms(span_placement(order, taken, span), slots, () if span is None else (span,))
        return cache[key]

    def span_pool(taken: int, slots: int, span: int) -> int:
        """The exact bytes of the arena with ``span`` spanning the slots."""
        return exact_pool(layers, span_placement(order, taken, span), slots, (span,))

    path = (fixed_path(order, total_bytes, step, step_ms, span_pool) if step is not None else
            slot_path(order, total_bytes, step_ms, span_pool))
    found = first_fit(path.steps, Reckoning(peak=lambda st: path.peak(*st)), memory.gpu_budget, memory.cpu_budget)
    if isinstance(found, NoFit):
        need = found.peak
        if only is None:
            # below the smallest prefetch pool: every eligible param read in place (no buffers). Taking all of
            # them keeps the rule that a larger budget never moves a param from the GPU to the host.
            uva = build_order(layers, eligible, hw, workload, step, forced, "uva", prefer)
            peak, pinned = peaks(uva, total_bytes)[-1]
            fits_cpu = memory.cpu_budget is None or pinned <= memory.cpu_budget
            all_in_place = fits_cpu and uva.moves and all(sig is None for sig in uva.signatures)
            if all_in_place and peak <= (memory.gpu_budget or 0):
                return AutoDecision(where(uva, len(uva.moves), layers), uva, len(uva.moves), peak, step or 1,
                                    all_uva=True, searched=step is None, prefer=prefer)
            if all_in_place:
                need = min(need, peak)
        raise InfeasibleError(Infeasible("no_plan", memory.gpu_budget, memory.cpu_budget, need, strategy="auto",
                                         needs=(Need("auto", need),), movable=bool(order.moves)))
    slots, taken, span = found.step
    peak = found.peak
    options = ()
    if step is None and memory.gpu_budget is not None and any(m.backend == "prefetch" for m in order.moves[:taken]):
        options = tuple(_options(path, memory.gpu_budget, memory.cpu_budget, step_ms, slots))
    return AutoDecision(where(order, taken, layers, span), order, taken, peak, slots, searched=step is None,
                        step_ms=step_ms(taken, slots, span) if step is None else None, options=options, prefer=prefer,
                        span=span)


def _options(path: SlotPath, gpu_budget: int, cpu_budget: int | None, step_ms, chosen: int) -> list[SlotOption]:
    """For each slot count the path knows, the shortest prefix that fits the budget alone and its step."""
    out = []
    for slots, table in sorted(path.tables.items()):
        for taken, (peak, pinned) in enumerate(table):
            if cpu_budget is not None and pinned > cpu_budget:
                break
            if peak <= gpu_budget:
                out.append(SlotOption(slots, taken, step_ms(taken, slots)))
                break
    return [o for o in out if o.slots != chosen]


def assignment(decision: AutoDecision, reason: str, notes: Sequence[str], step: int | None,
               layer_names: Sequence[str] = ()) -> Assignment:
    span = frozenset() if decision.span is None else frozenset({layer_names[decision.span]})
    return Assignment(decision.where, step, "auto", reason, tuple(notes), span)
