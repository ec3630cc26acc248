"""Routed experts split by expert, as records on top of any strategy: the host computes them (the cpu backend),
and measured routing keeps the most used experts on the GPU.

A param the host computes takes what a UVA param takes: host memory and no buffer slot. So the strategies
place the kinds given ``cpu`` (``offload.backends: {routed_experts: cpu}``) as if they were on UVA
(``link_view``), and ``to_host`` then turns each layer's UVA params of those kinds into an ``ExpertSplit``
(schemas/plan_experts.py) that shares the experts between the host and the link: the host and GPU kernels
reading host memory through UVA run at once, so the host takes as many experts (the least used first) as gives
the layer its least predicted time over the plan's workload (``balanced``, planner/cost/host_split.py: the search
prices the layer with the same split), the link the others. The split takes every per-expert param of the
layer's experts module (the runtime replaces that module's forward), so a layer where only some of them
were chosen is refused. ``cpu_max_tokens`` is where the cost model (planner/cost/host_experts.py) finds UVA
faster than the host: a prefill then reads those experts through UVA. Strategy auto's own trial of the host
(``host_to_try``) is optional: only layers whose experts module it reads through UVA whole, and only where the
split gives the host experts by ``HOST_MARGIN``.

With measured routing (``planner plan --routing FILE``, schemas/routing.py), ``keep_hot`` redistributes the
GPU memory the routed experts had: every MoE layer's experts are split, the ones not kept go to UVA (or to
the host, for kinds given cpu; a prefetched experts layer is read through UVA instead), and the GPU bytes
left under the budget hold the most used experts of all layers, the most used first (each expert's chance of
being picked by a token, from the file). A layer whose every expert is kept stays resident whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from planner.assemble import Assignment
from planner.cost.host_split import HOST_MARGIN, balanced, per_expert, whole_split
from planner.errors import PlanningError
from schemas.kinds import name_key, param_kind
from planner.layers import eligible_params
from planner.words.experts_notes import host_limits, hot_note
from schemas.hardware import HardwareProfile
from schemas.plan_experts import ExpertSplit
from schemas.spec import Layer, OffloadSection
from schemas.spec_layers import moe_shape
from schemas.workload import Workload


def link_view(offload: OffloadSection) -> tuple[OffloadSection, frozenset[str]]:
    """``offload`` with its cpu kinds on uva (what the strategies place), and those kinds."""
    chosen = offload.backends or {}
    host = frozenset(kind for kind, backend in chosen.items() if backend == "cpu")
    if not host:
        return offload, host
    backends = {kind: "uva" if kind in host else backend for kind, backend in chosen.items()}
    return offload.model_copy(update={"backends": backends}), host


def to_host(assignment: Assignment, layers: Sequence[Layer], kinds: frozenset[str], hw: HardwareProfile,
            workload: Workload, optional: bool = False, graphs: bool = True) -> Assignment:
    """``assignment`` with the UVA params of ``kinds`` shared between the host and the link, expert by expert.
    ``optional`` (auto's trial): only a layer whose experts module is read through UVA whole and for which the
    split gives the host experts (``balanced`` with ``HOST_MARGIN``); the others stay on UVA as they are (the
    placement cost priced them so: planner/cost/placement.py). ``graphs``: the plan runs with the layer graphs
    (``balanced``)."""
    if not kinds:
        return assignment
    by_name = {layer.name: layer for layer in layers}
    where = {name: dict(params) for name, params in assignment.where.items()}
    experts = dict(assignment.experts)
    splits: dict[tuple, ExpertSplit | None] = {}  # layers alike with the same params chosen: one split, made once
    for name, params in assignment.where.items():
        layer = by_name[name]
        chosen = [p for p, b in params.items() if b == "uva" and
                  param_kind(name, p, next(t.kind for t in layer.params if t.name == p)) in kinds]
        if not chosen:
            continue
        whole = whole_split(layer, chosen, kinds) if optional else _host_split(layer, chosen)  # the latter refuses
        key = (name_key(name), layer.params, moe_shape(layer.moe),
               frozenset(chosen))
        if key not in splits:
            splits[key] = None if whole is None else balanced(layer, whole, hw, workload,
                                                              margin=HOST_MARGIN if optional else 0.0, graphs=graphs)
        split = splits[key]
        if split is None or (optional and not split.cpu):
            continue
        for p in split.params:
            where[name].pop(p, None)
        experts[name] = split
    made = [name for name in experts if name not in assignment.experts]
    notes = host_limits(made, [experts[name].cpu_max_tokens for name in made],
                        [(len(experts[name].cpu), by_name[name].moe.experts) for name in made])
    return replace(assignment, where={n: p for n, p in where.items() if p}, experts=experts,
                   notes=assignment.notes + tuple(notes))


def _host_split(layer: Layer, chosen: list[str]) -> ExpertSplit:
    if layer.moe is None:
        raise PlanningError(f"{layer.name}: {', '.join(chosen)} given the cpu backend, but the layer has no moe "
                            "(experts, top_k): the host computes routed experts of MoE layers only")
    parents = {p.rpartition(".")[0] for p in chosen}
    if len(parents) != 1:
        raise PlanningError(f"{layer.name}: the cpu backend takes one experts module a layer; {', '.join(chosen)} "
                            "are below several")
    params = per_expert(layer, parents.pop())
    left = [p for p in params if p not in chosen]
    odd = [p for p in chosen if p not in params]
    if odd:
        raise PlanningError(f"{layer.name}: {', '.join(odd)} given the cpu backend, but the host computes "
                            f"per-expert params only (first dimension {layer.moe.experts}; under tensor parallelism a "
                            "rank holds a share of the experts: the cpu backend plans one GPU's model)")
    if left:
        raise PlanningError(f"{layer.name}: the host computes the experts module whole, but {', '.join(left)} "
                            "stays on the GPU (offload every per-expert param of the module, or none)")
    return ExpertSplit(params=params, cpu=list(range(layer.moe.experts)))


@dataclass(frozen=True)
class HotResult:
    assignment: Assignment
    kept: int  # experts kept on the GPU, in all layers
    layers: int  # layers split
    share: float  # of the routed tokens, the share their kept experts receive
    nbytes: int  # GPU bytes of the kept experts


def _experts_parent(layer: Layer) -> str | None:
    """The module holding the layer's routed experts (the parent of its routed_experts params), if one."""
    parents = {t.name.rpartition(".")[0] for t in layer.params
               if param_kind(layer.name, t.name, t.kind) == "routed_experts"}
    return parents.pop() if len(parents) == 1 else None


def keep_hot(assignment: Assignment, layers: Sequence[Layer], shares: Mapping[str, Sequence[float]],
             gpu_budget: int | None, host: frozenset[str], hw: HardwareProfile, workload: Workload,
             peak_of: Callable[[Assignment], int], graphs: bool = True) -> HotResult:
    """``assignment`` with every MoE layer's experts split and the most used kept on the GPU within the budget
    (``peak_of``: the peak GPU bytes of an assignment's plan; ``graphs``: the plan runs with the layer graphs)."""
    where = {name: dict(params) for name, params in assignment.where.items()}
    experts = dict(assignment.experts)
    split_layers: list[Layer] = []
    for layer in layers:
        if layer.moe is None or layer.name not in shares:
            continue
        parent = _experts_parent(layer)
        params = per_expert(layer, parent) if parent is not None else []
        mine = where.get(layer.name, {})
        if not params or any(p in mine and mine[p] not in ("uva", "prefetch") for p in params):
            continue
        old = experts.get(layer.name)
        on_host = old is not None and bool(old.cpu) or "routed_experts" in host
        n = layer.moe.experts
        experts[layer.name] = ExpertSplit(params=params, **{"cpu" if on_host else "uva": list(range(n))})
        for p in params:
            mine.pop(p, None)
        where[layer.name] = mine
        split_layers.append(layer)
    base = replace(assignment, where={n: p for n, p in where.items() if p}, experts=experts)
    left = 0 if gpu_budget is None else gpu_budget - peak_of(base)
    ranked = sorted(((-shares[layer.name][e], i, e) for i, layer in enumerate(split_layers)
                     for e in range(layer.moe.experts)))
    kept: dict[str, list[int]] = {}
    used = total = taken = 0.0
    for q, i, e in ranked:
        layer = split_layers[i]
        size = sum(t.nbytes for t in layer.params if t.name in experts[layer.name].params) // layer.moe.experts
        total += -q
        if size <= left:
            left -= size
            used += size
            taken += -q
            kept.setdefault(layer.name, []).append(e)
    for layer in split_layers:
        experts[layer.name] = _with_gpu(experts[layer.name], sorted(kept.get(layer.name, [])), layer, hw,
                                        workload, shares[layer.name], graphs)
    whole = [name for name, split in experts.items() if split is not None and not split.host]
    for name in whole:
        del experts[name]
    result = replace(base, experts={n: s for n, s in experts.items()},
                     notes=assignment.notes + (hot_note(len(split_layers) - len(whole), sum(map(len, kept.values())),
                                                        int(used), taken / total if total else 0.0),))
    return HotResult(result, sum(map(len, kept.values())), len(split_layers), taken / total if total else 0.0,
                     int(used))


def _with_gpu(split: ExpertSplit, gpu: list[int], layer: Layer, hw: HardwareProfile, workload: Workload,
              shares: Sequence[float], graphs: bool) -> ExpertSplit:
    """``split`` with ``gpu`` kept on the GPU; a host layer's other experts shared between the host and the link."""
    kept = set(gpu)
    if split.cpu:
        rest = [e for e in range(layer.moe.experts) if e not in kept]
        return balanced(layer, split.model_copy(update={"gpu": gpu, "cpu": rest, "uva": []}), hw, workload, shares,
                        graphs=graphs)
    return split.model_copy(update={"gpu": gpu, "uva": [e for e in split.uva if e not in kept]})


HOST_TRIAL = frozenset({"routed_experts"})  # the kinds auto tries on the host


def host_to_try(offload: OffloadSection, workload: Workload, layers: Sequence[Layer],
                shared: Mapping[str, set[str]]) -> frozenset[str]:
    """The kinds strategy auto tries on the host beside UVA: routed experts, where some are eligible to move,
    the backend and the routed experts' backend are left to auto, and every workload runs eagerly (a CUDA graph
    cannot capture the host's part). It does not depend on the budget. In the trial the placement cost prices a
    layer whose experts module is read through UVA whole with the host sharing it, where that is faster
    (planner/cost/placement.py, ``optional``), ``to_host`` then makes the same split, and auto weighs its orders
    also with those experts held to UVA (``trial_offload``)."""
    if offload.backend != "auto" or "routed_experts" in (offload.backends or {}):
        return frozenset()
    if any(item.mode != "eager" for _, item in workload.items()):
        return frozenset()
    found = False
    for layer in layers:
        if layer.moe is None:
            continue
        eligible = eligible_params(layer, offload.params, shared.get(layer.name, set()), offload.kinds)
        routed = [t for t in eligible if param_kind(layer.name, t.name, t.kind) == "routed_experts"]
        # split by expert only where the params hold every expert (not a tensor-parallel rank's share of them)
        if routed and not all(t.shape and t.shape[0] == layer.moe.experts for t in routed):
            return frozenset()
        found = found or bool(routed)
    return HOST_TRIAL if found else frozenset()


def trial_offload(offload: OffloadSection, host: frozenset[str]) -> OffloadSection:
    """``offload`` for auto's trial of the host: the kinds it shares read through UVA where offloaded."""
    return offload.model_copy(update={"backends": {**(offload.backends or {}), **{k: "uva" for k in host}}})
