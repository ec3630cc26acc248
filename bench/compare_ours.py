"""This project as a contender of bench_compare.py: the plans it measures and how they are applied.

- ``auto``: ``planner.plan(spec, gpu_budget=..., strategy="auto", workload=<that workload>)``.
- best hand plans: every plan of bench_auto.py's grid (backend x group x step) and the budget
  strategy's plans (for an MoE also with only the routed experts offloaded), predicted with the bundled
  profile; the predicted-fastest prefetch plan and the predicted-fastest UVA plan of each workload.
A plan the budget cannot hold is planned at the smallest feasible budget instead (the row says so).
"""

from __future__ import annotations

import json
from typing import NamedTuple

import planner
import runtime
from planner.errors import InfeasibleError, PlanningError
from schemas.workload import Workload

from compare_run import Applied


def plan_at(spec, budget: int, **options):
    """(plan, raised budget or None): the plan at ``budget``, else at the smallest feasible one."""
    try:
        return planner.plan(spec, gpu_budget=budget, **options), None
    except InfeasibleError as err:
        if err.min_gpu_budget is None:
            raise
        return planner.plan(spec, gpu_budget=err.min_gpu_budget, **options), err.min_gpu_budget


def layout_key(plan) -> str:
    """What apply() executes (layers, buffer pool, step), without the predictions: equal keys, equal runs."""
    return json.dumps({"layers": [layer.model_dump(mode="json") for layer in plan.layers],
                       "pool": plan.buffer_pool.model_dump(mode="json") if plan.buffer_pool else None,
                       "step": plan.summary.prefetch_step, "backend": plan.summary.backend}, sort_keys=True)


def predicted_ms(plan, workload: str) -> float:
    return {p.workload: p.step_ms for p in plan.predictions.workloads}[workload]


def plan_fields(plan, workloads: list[str]) -> dict[str, dict]:
    """What ``plan`` says of each workload's rows: its predicted step (None when it has no prediction for the
    workload) and the bytes it offloads (for the "/ own bytes" bound)."""
    predicted = {p.workload: p.step_ms for p in plan.predictions.workloads} if plan.predictions else {}
    return {w: {"predicted_ms": predicted.get(w), "offloaded_bytes": plan.summary.offloaded_bytes} for w in workloads}


class PlanGroup(NamedTuple):
    """Workloads that ``auto`` gave the same plan (same layout), and each one's fields from its own plan."""

    plan: object
    names: list[str]
    raised: int | None
    fields: dict[str, dict]


def auto_plans(spec, budget: int, workloads: Workload) -> list[PlanGroup]:
    """strategy auto per workload, workloads sharing a plan grouped. Each workload's prediction comes from
    the plan made for it (the group's plan was predicted for its first workload only)."""
    groups: dict[str, PlanGroup] = {}
    for name, item in workloads.items():
        plan, raised = plan_at(spec, budget, strategy="auto", workload=Workload({name: item}))
        key = layout_key(plan)
        if key not in groups:
            groups[key] = PlanGroup(plan, [], raised, {})
        groups[key].names.append(name)
        groups[key].fields.update(plan_fields(plan, [name]))
    return list(groups.values())


def hand_candidates(spec, budget: int, workloads: Workload, moe: bool) -> dict[str, object]:
    """Every grid and budget plan that fits ``budget``, with predictions for every workload."""
    from bench_auto import grid

    plans = dict(grid(spec, budget, workloads))
    variants = [("", {})] + ([(" experts", {"kinds": ["routed_experts"]})] if moe else [])
    for backend, steps in (("prefetch", (1, 2, 3)), ("uva", (None,))):
        for suffix, extra in variants:
            for step in steps:
                try:
                    plans[f"{backend} budget-strategy{suffix}" + (f" step {step}" if step else "")] = planner.plan(
                        spec, gpu_budget=budget, backend=backend, strategy="budget", prefetch_step=step,
                        workload=workloads, **extra)
                except (InfeasibleError, PlanningError):
                    pass
    return plans


def best_hand_plans(candidates: dict[str, object], workloads: list[str]) -> list[tuple[str, object, list[str]]]:
    """The predicted-fastest prefetch and UVA plan per workload: [(label, plan, workloads it is best for)]."""
    chosen: dict[str, tuple[str, object, list[str]]] = {}
    for backend in ("prefetch", "uva"):
        of_backend = {label: p for label, p in candidates.items() if p.summary.backend == backend}
        for w in workloads:
            if not of_backend:
                continue
            label = min(of_backend, key=lambda k: predicted_ms(of_backend[k], w))
            chosen.setdefault(label, (label, of_backend[label], []))[2].append(w)
    return list(chosen.values())


def apply_plan(plan, device):
    """A setup for compare_run: apply ``plan`` to the model copy; the teardown removes it."""
    def setup(model) -> Applied:
        handle = runtime.apply(plan, model, device=str(device))
        s = plan.summary
        info = {"backend": s.backend, "strategy": s.strategy, "prefetch_step": s.prefetch_step,
                "plan_peak_gpu_bytes": s.peak_gpu_bytes, "offloaded_bytes": s.offloaded_bytes,
                "pinned_host_bytes": s.pinned_host_bytes, "offloaded_layers": s.offloaded_layers,
                "arena_bytes": handle.stats()["pinned_host_bytes"]}
        if s.backend == "prefetch":
            info["moved_bytes"] = s.offloaded_bytes  # copied every step; UVA reads only what kernels touch
        return Applied(model, info, handle.remove)
    return setup
