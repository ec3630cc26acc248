"""The plan check of a plan's predictions: what a simulated forward always satisfies, re-proved from the
plan and the profile it carries (``planner.cost.timeline`` makes the figures; re-running it at every load
would cost a simulated forward per workload, so its invariants are checked instead).

Per workload: the step is at least the copy stream's busy time (a forward ends with the join of the
copy stream), the CPU's time, and the compute stream's busy time plus its stalls; the stall is 0
without prefetched layers; ``bound`` names the largest of copy, compute and CPU. With the profile
carried, the copy time is the plan's own: its prefetched bytes at the profile's link rate plus one
copy call per param (the same at every token count), leaving out layers copied once (``prefetch.once``).
Across workloads: names once each, the weighted
step is the weighted mean of the steps, and ``offloaded_layers`` counts the plan's offloaded layers.
Figures are written rounded to 4 decimals, so comparisons allow that rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import schemas.plan_wording as say
from schemas.hardware_profile import HardwareProfile
from schemas.plan_content import PlanContent
from schemas.prediction import Prediction, Predictions

ROUNDING = 1e-4  # each figure is rounded to 4 decimals; a sum of three may be off by this much

Finding = Callable[[tuple[Any, ...], str], None]


def check_predictions(plan: PlanContent, offloaded_layers: int, found: Finding) -> None:
    """Call ``found(loc, text)`` for each contradiction in ``plan.predictions`` (nothing without predictions).
    ``offloaded_layers``: how many of the plan's layers have offloaded params."""
    preds = plan.predictions
    if preds is None:
        return
    prefetched = [i for i, layer in enumerate(plan.layers) if layer.prefetch is not None]
    loc = ("predictions",)
    profile = preds.profile
    if profile is not None:
        for name, mine, theirs, field in (("hardware", preds.hardware, profile.name, "name"),
                                          ("hardware_source", preds.hardware_source, profile.source, "source")):
            if mine != theirs:
                found(loc + (name,), say.mismatch(mine, theirs, f"predictions.profile.{field}"))
    copy_ms = _copy_ms(plan, prefetched, profile) if profile is not None else None
    seen: dict[str, int] = {}
    for i, row in enumerate(preds.workloads):
        where = loc + ("workloads", i)
        first = seen.setdefault(row.workload, i)
        if first != i:
            found(where + ("workload",), say.workload_twice(row.workload, first))
        _check_row(row, where, bool(prefetched), copy_ms, found)
    _check_totals(preds, offloaded_layers, found)


def _copy_ms(plan: PlanContent, prefetched: list[int], hw: HardwareProfile) -> float:
    """The copy stream's busy time of one forward: every prefetched param copied once (planner.cost.layer)."""
    total = 0.0
    for i in prefetched:
        layer = plan.layers[i]
        if layer.prefetch is not None and layer.prefetch.once:
            continue  # copied when the plan is applied, not in a forward
        rels = [rel for rel in layer.prefetched if rel in layer.params]  # an unknown one is a finding already
        copy_bytes = sum(layer.params[rel].bytes for rel in rels)
        total += copy_bytes / hw.h2d_gbps / 1e6 + len(rels) * hw.copy_call_us / 1e3
    return total


def _check_row(row: Prediction, where: tuple[Any, ...], prefetching: bool, copy_ms: float | None,
               found: Finding) -> None:
    step = row.step_ms + 3 * ROUNDING
    for name, below, words in (("copy_ms", row.copy_ms, "the copy stream's busy time (copy_ms)"),
                               ("cpu_ms", row.cpu_ms, "the CPU's time (cpu_ms)"),
                               ("compute_ms", row.compute_ms + row.stall_ms,
                                "the compute stream's busy time and stalls (compute_ms + stall_ms)")):
        if below > step:
            found(where + ("step_ms",), say.step_too_short(row.step_ms, below, words))
    if not prefetching:
        for name, value in (("copy_ms", row.copy_ms), ("stall_ms", row.stall_ms)):
            if value > ROUNDING:
                found(where + (name,), say.time_without_prefetch(name, value))
    elif copy_ms is not None and abs(row.copy_ms - copy_ms) > 2 * ROUNDING:
        found(where + ("copy_ms",), say.mismatch(row.copy_ms, round(copy_ms, 4), say.copy_time_source()))
    figures = {"copy": row.copy_ms, "compute": row.compute_ms, "cpu": row.cpu_ms}
    top = max(figures.values())
    if figures[row.bound] < top - 2 * ROUNDING:
        found(where + ("bound",), say.wrong_bound(row.bound, max(figures, key=lambda k: figures[k])))


def _check_totals(preds: Predictions, offloaded_layers: int, found: Finding) -> None:
    weights = sum(row.weight for row in preds.workloads)
    if preds.workloads and weights > 0:
        mean = sum(row.step_ms * row.weight for row in preds.workloads) / weights
        if abs(preds.weighted_step_ms - mean) > 2 * ROUNDING + 1e-9 * mean:
            found(("predictions", "weighted_step_ms"), say.mismatch(preds.weighted_step_ms, round(mean, 4),
                                                                    say.weighted_source()))
    if preds.offloaded_layers != offloaded_layers:
        found(("predictions", "offloaded_layers"), say.mismatch(preds.offloaded_layers, offloaded_layers,
                                                                "the layers with offloaded params"))
