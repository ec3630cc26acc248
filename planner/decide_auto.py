"""strategy auto, deciding: every layer's eligible params, the order of moves (planner/auto.py),
the shortest prefix that fits, as an Assignment plus the facts its notes are written from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.assignment import Assignment
from planner.auto import Order, build_order, fit, where
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
    found = fit(order, total_bytes, memory.gpu_budget, memory.cpu_budget)
    return AutoDecision(where(order, found.taken, layers), order, found.taken, found.peak_bound, slots)


def assignment(decision: AutoDecision, reason: str, notes: Sequence[str], step: int | None) -> Assignment:
    return Assignment(decision.where, step, "auto", reason, tuple(notes))
