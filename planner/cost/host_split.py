"""Which of a layer's routed experts the host computes: the split that gives the layer its least predicted time.

A layer whose experts module the host shares with the link (the cpu backend: planner/strategy/experts.py) takes
as many experts on the host (the least used first) as gives it its least predicted time over the workload
(``balanced``); the link reads the others through UVA. The strategies place the experts as UVA params, so the
placement cost (planner/cost/placement.py) prices such a layer with this split, and the plan gets the same one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from planner.cost.host_experts import cpu_max_tokens, split_work
from planner.cost.layer import profile_for
from schemas.kinds import param_kind
from schemas.hardware import HardwareProfile
from schemas.plan_content import PlanLayer, PlanParam
from schemas.plan_experts import ExpertSplit
from schemas.spec import Layer
from schemas.workload import Workload


HOST_MARGIN = 0.03  # where the host is optional (auto's trial), it takes experts only for a layer this much faster


def per_expert(layer: Layer, parent: str) -> list[str]:
    """The layer's params below ``parent`` whose first dimension is the expert, in spec order."""
    n = layer.moe.experts
    return [t.name for t in layer.params if t.name.rpartition(".")[0] == parent and t.shape and t.shape[0] == n]


def whole_split(layer: Layer, on_uva: Collection[str], kinds: Collection[str]) -> ExpertSplit | None:
    """The split with every expert on the host, when the layer's params of ``kinds`` read through UVA
    (``on_uva``) are exactly one experts module's per-expert params; else None (the host takes nothing)."""
    if layer.moe is None or not kinds:
        return None
    chosen = [t.name for t in layer.params if t.name in on_uva and param_kind(layer.name, t.name, t.kind) in kinds]
    if not chosen:
        return None
    parents = {p.rpartition(".")[0] for p in chosen}
    if len(parents) != 1:
        return None
    params = per_expert(layer, parents.pop())
    if sorted(params) != sorted(chosen):
        return None
    return ExpertSplit(params=params, cpu=list(range(layer.moe.experts)))


def plan_layer(layer: Layer, split: ExpertSplit) -> PlanLayer:
    """What the cost model reads of a spec layer with ``split`` (an unchecked PlanLayer)."""
    params = {t.name: PlanParam.model_construct(shape=list(t.shape), dtype=t.dtype, bytes=t.nbytes, kind=t.kind)
              for t in layer.params}
    return PlanLayer.model_construct(name=layer.name, params=params, experts=split, moe=layer.moe,
                                     offloaded=list(split.params), uva=[])


def balanced(layer: Layer, split: ExpertSplit, hw: HardwareProfile, workload: Workload,
             shares: Sequence[float] | None = None, margin: float = 0.0, graphs: bool = True) -> ExpertSplit:
    """``split`` with its cpu experts cut back to the count (the least used first) that gives the layer its least
    predicted time over ``workload`` (fewer on ties); the others read through UVA. With ``margin`` a count above
    zero is weighed that much slower (the host takes experts only where it clearly pays). ``graphs``: the plan runs
    with the layer graphs (planner/cost/host_experts.py ``split_work``)."""
    pool = sorted(split.cpu, key=lambda e: (shares[e] if shares is not None else 0.0, e))
    whole = split.model_copy(update={"cpu": sorted(pool)})
    limit = cpu_max_tokens(plan_layer(layer, whole), hw, shares)
    items = workload.items()
    total = sum(item.weight for _, item in items)
    best: tuple[float, ExpertSplit] | None = None
    for count in range(0, len(pool) + 1, max(1, len(pool) // 64)) if pool else [0]:
        cpu = sorted(pool[:count])
        cand = split.model_copy(update={"cpu": cpu, "uva": sorted(set(split.uva) | set(pool[count:])),
                                        "cpu_max_tokens": limit if cpu else None})
        ms = sum(item.weight / total * split_work(plan_layer(layer, cand), item.rows, profile_for(hw, item.mode),
                                                  shares, graphs=graphs).alone_ms()
                 for _, item in items) / (1 - margin if cpu else 1)
        if best is None or ms < best[0] - 1e-9:
            best = (ms, cand)
    return best[1]
