"""strategy auto, deciding: every layer's eligible params, the order of moves (planner/auto.py),
the shortest prefix that fits, as an Assignment plus the facts its notes are written from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.assignment import Assignment
from planner.auto import Order, build_order, fit, infeasible, peaks, where
from planner.errors import InfeasibleError
from planner.select import eligible_params
from schemas.hardware import HardwareProfile
from schemas.spec import Layer, MemorySection, OffloadSection
from schemas.workload import Workload


@dataclass(frozen=True)
class AutoDecision:
    where: dict[str, dict[str, str]]
    order: Order
    taken: int
    peak_bound: int
    slots: int
    all_uva: bool = False  # below the smallest prefetch pool: every eligible param on UVA

    def moves_by(self, backend: str) -> list:
        return [m for m in self.order.moves[:self.taken] if m.backend == backend]


def decide(layers: Sequence[Layer], shared: Mapping[str, set[str]], memory: MemorySection, offload: OffloadSection,
           hw: HardwareProfile, workload: Workload, slots: int, total_bytes: int) -> AutoDecision:
    """The auto plan's placement (raises InfeasibleError when no prefix fits the budgets)."""
    eligible = {layer.index: eligible_params(layer, offload.params, shared.get(layer.name, set()), offload.kinds)
                for layer in layers}
    only = offload.backend if offload.backend in ("prefetch", "uva") else None
    order = build_order(layers, eligible, hw, workload, slots, dict(offload.backends or {}), only)
    if memory.gpu_budget is not None and total_bytes <= memory.gpu_budget:
        return AutoDecision({}, order, 0, total_bytes, slots)
    try:
        found = fit(order, total_bytes, memory.gpu_budget, memory.cpu_budget)
    except InfeasibleError as err:
        if only is not None:
            raise
        # below the smallest prefetch pool: every eligible param read in place (no buffers). Taking all of
        # them keeps the rule that a larger budget never moves a param from the GPU to the host.
        uva = build_order(layers, eligible, hw, workload, slots, dict(offload.backends or {}), "uva")
        peak, pinned = peaks(uva, total_bytes)[-1]
        fits_cpu = memory.cpu_budget is None or pinned <= memory.cpu_budget
        all_in_place = fits_cpu and uva.moves and all(sig is None for sig in uva.signatures)
        if all_in_place and peak <= (memory.gpu_budget or 0):
            return AutoDecision(where(uva, len(uva.moves), layers), uva, len(uva.moves), peak, slots, all_uva=True)
        if not all_in_place or err.min_gpu_budget is None or err.min_gpu_budget <= peak:
            raise
        raise infeasible(peak, memory.gpu_budget, memory.cpu_budget, True) from None
    return AutoDecision(where(order, found.taken, layers), order, found.taken, found.peak_bound, slots)


def assignment(decision: AutoDecision, reason: str, notes: Sequence[str], step: int | None) -> Assignment:
    return Assignment(decision.where, step, "auto", reason, tuple(notes))
