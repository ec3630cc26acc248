"""The planner's decision as one record (``Assignment``), and that record made into the plan file.

A strategy (budget, group, auto or any other) decides: which params leave the GPU and how each comes
back. ``assemble`` turns the spec's layers and an ``Assignment`` into the plan: params, totals, schedule
and buffer pool. Nothing else passes from deciding to assembling, so a new strategy only has to produce
an ``Assignment``.

The schedule and the buffer pool cover the prefetched layers only (those with an offloaded
param not on UVA); UVA params need neither. The step, when the assignment leaves it to the
planner, is the longest run of consecutive prefetched layers (at least 1). ``pool_of`` sizes the pool
of a placement (layer -> param -> backend); strategy auto also sizes candidate placements with it
where the pool's upper bound is not enough (a layer spanning the slots).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from planner.errors import PlanningError
from schemas.kinds import classify, name_key, param_kind
from planner.layers import longest_run
from planner.words.assemble_notes import schedule_notes, span_notes, tied_note
from schemas.buffer_pool import PoolEntry, Signature, build_pool, pool_bytes, signature
from schemas.plan import Plan
from schemas.plan_experts import ExpertSplit, host_bytes
from schemas.plan_content import BufferKey, BufferPool, PlanLayer, PlanParam, Prefetch, Summary
from schemas.schedule import DEFAULT_PREFETCH_STEP, filled_once, num_slots, schedule
from schemas.spec_layers import Layer, Tensor
from schemas.plan_memory import PlanMemory


ParamBackend = Literal["prefetch", "uva"]
PARAM_BACKENDS: tuple[ParamBackend, ...] = ("prefetch", "uva")


@dataclass(frozen=True)
class Assignment:
    """``where``: layer name -> param (relative to its layer) -> its backend; a param (or layer)
    absent is resident. Any layer may appear, in or out of the block stack; a tied param or a
    param other params are tied to may not (``assemble`` refuses them)."""

    where: Mapping[str, Mapping[str, ParamBackend]]
    prefetch_step: int | None  # buffer slots; None: the default (schemas.schedule.DEFAULT_PREFETCH_STEP)
    strategy: str  # what decided (the plan's summary.strategy)
    reason: str  # why this backend (summary.backend_reason)
    notes: tuple[str, ...] = ()  # the decision in sentences (summary.notes, before the schedule's)
    span: frozenset[str] = frozenset()  # prefetched layers whose buffers lie over the slots' (schemas/schedule.py)
    every_slot: bool = False  # every pool key gets a buffer in each of the step's slots (vLLM's pool)
    fill_once: bool = False  # a slot's only user is copied once, at apply time (vLLM's prefetch runtime)
    # layer -> where each routed expert lives and runs (schemas/plan_experts.py); its params are not in ``where``
    experts: Mapping[str, ExpertSplit] = field(default_factory=dict)

    @property
    def backend(self) -> str:
        """The plan's backend: none, prefetch, uva, cpu, or mixed when more than one occurs."""
        used = {b for params in self.where.values() for b in params.values()}
        for split in self.experts.values():
            used |= {place for place in ("uva", "cpu") if getattr(split, place)}
        if not used:
            return "none"
        return used.pop() if len(used) == 1 else "mixed"


def uniform(layers: Iterable[tuple[str, Iterable[str]]], backend: ParamBackend) -> dict[str, dict[str, ParamBackend]]:
    """``where`` for (layer, params) pairs all on one backend."""
    return {layer: dict.fromkeys(params, backend) for layer, params in layers}


def layers_with_prefetch(layers: Sequence[Layer], where: Mapping[str, Mapping[str, str]]) -> list[Layer]:
    """The layers with a prefetched param, in execution order."""
    return [layer for layer in layers if layer.name in where and "prefetch" in where[layer.name].values()]


def signatures(prefetched: Sequence[Layer], where: Mapping[str, Mapping[str, str]]) -> list[Signature]:
    """The pool signature of each prefetched layer: its prefetched params (one object per distinct value).

    Layers listing the same params share one tuple of them (schemas/spec.py), so a signature is made
    once per distinct (params, placement of them)."""
    interned: dict[Signature, Signature] = {}
    made: dict[tuple, Signature] = {}
    out = []
    for layer in prefetched:
        mine = where[layer.name]
        key = (id(layer.params), tuple(mine.items()))
        sig = made.get(key)
        if sig is None:
            sig = signature(t for t in layer.params if mine.get(t.name) == "prefetch")
            sig = made[key] = interned.setdefault(sig, sig)
        out.append(sig)
    return out


def pool_of(prefetched: Sequence[Layer], where: Mapping[str, Mapping[str, str]], step: int,
            span: Collection[str] = (), every_slot: bool = False) -> tuple[int, list[PoolEntry]]:
    """(slot count, pool entries) of the prefetched layers at prefetch step ``step``; ``span``: the names of
    the layers that span the slots; ``every_slot``: every key in each of the ``step`` slots (vLLM's pool)."""
    spanning = [layer.name in span for layer in prefetched]
    slots = step if every_slot else num_slots(len(prefetched) - sum(spanning), step)
    return slots, build_pool(signatures(prefetched, where), slots, spanning, every_slot)


def assemble(layers: Sequence[Layer], assignment: Assignment, *, model_name: str, spec_sha256: str,
             gpu_budget: int | None = None, cpu_budget: int | None = None, record_kinds: bool = False,
             checked: bool = True, memory: PlanMemory | None = None) -> Plan:
    """The plan of ``layers`` (the spec's, expanded, in execution order) as ``assignment`` says.

    ``memory``: what the plan counts besides the weights (planner/memory), added to its peak.

    ``record_kinds``: write each param's kind into the plan. ``checked=False`` skips the plan's own
    check (schemas/plan_check.py), for a plan that is only predicted, never written. Raises PlanningError when the
    assignment names a layer or param the spec does not have, or offloads a tied param or one
    that other params are tied to. The budgets are recorded, not enforced here: the plan's own
    check refuses a plan over them.
    """
    where = assignment.where
    _check_assignment(layers, where, assignment.experts)
    num_layers = len(layers)
    prefetched = layers_with_prefetch(layers, where)
    positions = [layer.index for layer in prefetched]
    run = longest_run(positions, num_layers)
    step = assignment.prefetch_step if assignment.prefetch_step is not None else DEFAULT_PREFETCH_STEP
    spans = {layer.index for layer in prefetched if layer.name in assignment.span}
    triggers = schedule(positions, num_layers, step, spans) if positions else []
    once = filled_once(triggers) if assignment.fill_once else [False] * len(triggers)
    make_prefetch = Prefetch if checked else Prefetch.model_construct  # unchecked: as make_layer below
    entries = {p: make_prefetch(slot=t.slot, span=t.span, copy_before=layers[t.copy_before(num_layers)].name,
                                previous_forward=t.previous_forward, once=alone)
               for p, t, alone in zip(positions, triggers, once)}
    backend = assignment.backend
    notes = list(assignment.notes)
    if positions:
        notes += schedule_notes([layer.name for layer in prefetched], triggers, step, run,
                                 assignment.prefetch_step is None, "offloaded" if backend == "prefetch" else "prefetched",
                                 once)
        notes += span_notes(layers, positions, triggers)
    notes += tied_note(layers)
    owner_of = {f"{layer.name}.{t.name}": t for layer in layers for t in layer.params} if any(
        layer.tied for layer in layers) else {}
    cache: dict[tuple[Tensor, str | None], PlanParam] = {}
    make_layer = PlanLayer if checked else PlanLayer.model_construct  # unchecked: built here, never written
    made: dict[tuple, list[tuple[str, PlanParam]]] = {}  # a layer's own params, per name key and params tuple
    plan_layers = []
    offloaded_total = 0
    for layer in layers:
        mine = where.get(layer.name, {})
        key = (name_key(layer.name), id(layer.params))
        own = made.get(key)
        if own is None:
            own = made[key] = [(t.name, _plan_param(t, cache, param_kind(layer.name, t.name, t.kind)
                                                   if record_kinds else None)) for t in layer.params]
        params = dict(own)
        if record_kinds:
            params |= {rel: _plan_param(owner_of[target], cache, owner_of[target].kind or classify(target))
                       for rel, target in layer.tied.items()}
        else:
            params |= {rel: _plan_param(owner_of[target], cache, None) for rel, target in layer.tied.items()}
        split = assignment.experts.get(layer.name)
        by_expert = set(split.params) if split is not None else set()
        off = [t for t in layer.params if t.name in mine or t.name in by_expert]
        off_bytes = sum(host_bytes(t.nbytes, layer.moe.experts, split) if t.name in by_expert else t.nbytes
                        for t in off)
        offloaded_total += off_bytes
        plan_layers.append(make_layer(
            name=layer.name, params=params, tied=dict(layer.tied), offloaded=[t.name for t in off],
            uva=[t.name for t in off if mine.get(t.name) == "uva"], resident_bytes=layer.nbytes - off_bytes,
            offloaded_bytes=off_bytes, prefetch=entries.get(layer.index), moe=layer.moe, experts=split))
    pool = None
    if positions:
        slots, entries_ = pool_of(prefetched, where, step, assignment.span, assignment.every_slot)
        pool = BufferPool(slots=slots, every_slot=assignment.every_slot, keys=[BufferKey.from_entry(e) for e in entries_],
                          bytes=pool_bytes(entries_))
    total = sum(layer.nbytes for layer in layers)
    buffer = pool.bytes if pool else 0
    summary = Summary(
        model=model_name, backend=backend, backend_reason=assignment.reason, strategy=assignment.strategy,
        prefetch_step=step if pool else None, gpu_budget_bytes=gpu_budget, cpu_budget_bytes=cpu_budget,
        total_bytes=total, resident_bytes=total - offloaded_total, offloaded_bytes=offloaded_total,
        buffer_bytes=buffer, peak_gpu_bytes=total - offloaded_total + buffer + (memory.non_weight_bytes if memory else 0),
        pinned_host_bytes=offloaded_total,
        layers=num_layers, offloaded_layers=sum(1 for layer in plan_layers if layer.offloaded),
        spec_sha256=spec_sha256, notes=notes)
    fields = {"summary": summary, "memory": memory, "layers": plan_layers, "buffer_pool": pool}
    return Plan(**fields) if checked else Plan.model_construct(**fields)


def _check_assignment(layers: Sequence[Layer], where, experts: Mapping[str, ExpertSplit]) -> None:
    by_name = {layer.name: layer for layer in layers}
    problems = []
    for name, split in experts.items():
        layer = by_name.get(name)
        if layer is None or layer.moe is None:
            problems.append(f"layer '{name}' has no routed experts (moe) to split" if layer else
                            f"layer '{name}' is not in the spec")
            continue
        named = [p for p in split.params if p in where.get(name, {})]
        if named:
            problems.append(f"{name}: {', '.join(named)} split by expert and also given a backend")
    targets = {target for layer in layers for target in layer.tied.values()}
    for name, params in where.items():
        layer = by_name.get(name)
        if layer is None:
            problems.append(f"layer '{name}' is not in the spec")
            continue
        own = {t.name for t in layer.params}
        for rel, backend in params.items():
            if backend not in PARAM_BACKENDS:
                problems.append(f"{name}.{rel}: backend '{backend}' (expected prefetch or uva)")
            elif rel in layer.tied:
                problems.append(f"{name}.{rel} is tied to {layer.tied[rel]}: a tied param is never offloaded")
            elif rel not in own:
                problems.append(f"{name}.{rel} is not a param of the spec")
            elif f"{name}.{rel}" in targets:
                problems.append(f"{name}.{rel} has params tied to it: it stays on the GPU")
    if problems:
        more = f" and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise PlanningError("the assignment cannot apply to this spec: " + "; ".join(problems[:5]) + more)


def _plan_param(t: Tensor, cache: dict[tuple[Tensor, str | None], PlanParam], kind: str | None) -> PlanParam:
    """One (immutable) PlanParam per distinct tensor description and kind: repeated layers share them."""
    param = cache.get((t, kind))
    if param is None:
        param = cache[(t, kind)] = PlanParam(shape=list(t.shape), dtype=t.dtype, bytes=t.nbytes,
                                             stride=None if t.stride is None else list(t.stride),
                                             buffer=t.buffer, kind=kind)
    return param
