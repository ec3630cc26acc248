"""The plan check: every field a plan derives is recomputed from the plan's own content.

A plan file is read by people and may be edited by hand, so nothing derived is trusted:
param bytes (from shape, dtype and stride), per-layer and summary totals, the peak and the
budgets, backend consistency (which offloaded params are on UVA, which are prefetched), ties, an MoE
layer's expert count against its routed-expert tensors (``schemas.kinds.expert_count_problems``),
the buffer pool (``schemas.buffer_pool.build_pool``) and every prefetch entry
(``schemas.schedule.schedule`` from the step), both from the prefetched params only, and the
predictions (``schemas.prediction_check``). All findings are
collected, each with the field path it is about; the wording is in ``schemas/plan_wording.py``.

The check is linear in the size of the plan: plans of 1,000-layer models are loaded often.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import schemas.plan_wording as say
from schemas.buffer_pool import PoolEntry, PoolKey, Signature, build_pool, has_span, pool_bytes
from schemas.dtypes import DTYPE_BYTES, canonical_dtype
from schemas.errors import InputError, Problem, format_path
from schemas.kinds import expert_count_problems
from schemas.memory_check import check_memory
from schemas.plan_content import PREFETCHING, PlanContent, PlanLayer, PlanParam
from schemas.plan_experts import host_bytes, split_findings
from schemas.prediction_check import check_predictions
from schemas.schedule import filled_once, num_slots, schedule
from schemas.spec_layers import storage_elements

SHA256 = re.compile(r"[0-9a-f]{64}")

Loc = tuple[Any, ...]


@dataclass(frozen=True)
class Finding:
    """One thing in a plan that contradicts the rest of it: the field path and what is wrong."""

    loc: Loc
    text: str

    def __str__(self) -> str:
        return f"{format_path(self.loc)}: {self.text}"


def check_plan(plan: PlanContent, source: str | None = None) -> None:
    """Raise InputError listing every finding of ``plan_findings`` (nothing when the plan is consistent)."""
    findings = plan_findings(plan)
    if findings:
        raise InputError([Problem(f.text, source, None, format_path(f.loc)) for f in findings])


def findings_text(findings: list[Finding]) -> str:
    return say.summary_intro(len(findings)) + ":\n" + "\n".join(f"  {f}" for f in findings)


def plan_findings(plan: PlanContent) -> list[Finding]:
    out: list[Finding] = []
    tied_to = _tie_targets(plan)
    owners = _owners(plan) if tied_to else {}
    first_index: dict[str, int] = {}
    totals = _Totals()
    for i, layer in enumerate(plan.layers):
        first = first_index.setdefault(layer.name, i)
        if first != i:
            out.append(Finding(("layers", i, "name"), say.duplicate_layer(layer.name, first)))
        _check_layer(i, layer, plan.summary.backend, tied_to, owners, totals, out)
    _check_summary(plan, totals, out)
    _check_prefetch(plan, totals, out)
    check_predictions(plan, len(totals.offloaded_layers), lambda loc, text: out.append(Finding(loc, text)))
    check_memory(plan, lambda loc, text: out.append(Finding(loc, text)))
    return out


@dataclass
class _Totals:
    """What the layers add up to, and the buffer pool rebuilt from them."""

    total: int = 0
    offloaded: int = 0
    offloaded_layers: list[int] = field(default_factory=list)  # indices, in order
    prefetched_layers: list[int] = field(default_factory=list)  # indices of layers with prefetched params
    uva_params: int = 0  # offloaded params (or split experts) read through UVA
    cpu_layers: int = 0  # layers whose host CPU computes routed experts (schemas/plan_experts.py)
    pool: list[PoolEntry] = field(default_factory=list)
    buffer: int = 0  # bytes of ``pool``
    # per distinct param object (repeated layers share them; PlanParams are frozen): checked once, keyed once
    good: set[int] = field(default_factory=set)  # id(PlanParam) of the params whose bytes agree
    keys: dict[tuple[str, int], tuple[PoolKey, int]] = field(default_factory=dict)  # (rel, id) -> (key, bytes)


def _tie_targets(plan: PlanContent) -> dict[str, list[str]]:
    """Full name of a tied param's owner -> the full names of the params tied to it."""
    out: dict[str, list[str]] = {}
    for layer in plan.layers:
        for rel, target in layer.tied.items():
            out.setdefault(target, []).append(f"{layer.name}.{rel}")
    return out


def _owners(plan: PlanContent) -> dict[str, tuple[PlanLayer, str]]:
    """Full name -> (layer, relative name) of every param and tied param (only built when ties exist)."""
    return {f"{layer.name}.{rel}": (layer, rel) for layer in plan.layers for rel in layer.params}


def _param_bytes(i: int, rel: str, p: PlanParam, out: list[Finding], good: set[int]) -> None:
    if id(p) in good:
        return
    size = DTYPE_BYTES.get(p.dtype)
    if size is None or p.stride is not None or p.bytes != storage_elements(p.shape, None) * size:
        found = len(out)
        _param_problems(("layers", i, "params", rel), p, out)
        if len(out) > found:
            return
    good.add(id(p))


def _param_problems(loc: Loc, p: PlanParam, out: list[Finding]) -> None:
    size = DTYPE_BYTES.get(p.dtype)
    if size is None:
        try:
            canonical = canonical_dtype(p.dtype)
        except ValueError as err:
            out.append(Finding(loc + ("dtype",), str(err)))
        else:
            out.append(Finding(loc + ("dtype",), say.dtype_alias(p.dtype, canonical)))
        return
    if p.stride is not None and len(p.stride) != len(p.shape):
        out.append(Finding(loc + ("stride",), say.stride_rank(p.stride, p.shape)))
        return
    want = storage_elements(p.shape, p.stride) * size
    if p.bytes != want:
        out.append(Finding(loc + ("bytes",), say.mismatch(p.bytes, want, say.param_bytes_source(
            p.shape, p.dtype, p.stride))))


def _check_layer(i: int, layer: PlanLayer, backend: str, tied_to: dict[str, list[str]],
                 owners: dict[str, tuple[PlanLayer, str]], totals: _Totals, out: list[Finding]) -> None:
    loc: Loc = ("layers", i)
    params = layer.params
    own = 0
    for rel, p in params.items():
        _param_bytes(i, rel, p, out, totals.good)
        if rel not in layer.tied:
            own += p.bytes
    if layer.moe is not None:  # the count the predictions price its experts by, against its own tensors
        out.extend(Finding(loc + ("moe",), text) for text in expert_count_problems(
            layer.name, layer.moe.experts, ((rel, p.shape, p.kind) for rel, p in params.items())))
    offloaded = 0
    seen: set[str] = set()
    split = layer.experts
    if split is not None:
        split_findings(layer, backend, lambda where, text: out.append(Finding(loc + where, text)))
        split_names = set(split.params)
        totals.uva_params += bool(split.uva)
        totals.cpu_layers += bool(split.cpu)
    for j, rel in enumerate(layer.offloaded):
        where = loc + ("offloaded", j)
        if rel in seen:
            out.append(Finding(where, say.offloaded_twice(rel)))
            continue
        seen.add(rel)
        if rel in layer.tied:
            out.append(Finding(where, say.offloaded_tied(rel, layer.tied[rel])))
        elif rel not in params:
            out.append(Finding(where, say.offloaded_unknown(rel, list(params))))
        else:
            if split is not None and rel in split_names and layer.moe is not None:
                offloaded += host_bytes(params[rel].bytes, layer.moe.experts, split)
            else:
                offloaded += params[rel].bytes
            if tied_to:
                full = f"{layer.name}.{rel}"
                if full in tied_to:
                    out.append(Finding(where, say.offloaded_tie_target(full, tied_to[full])))
    prefetched = _check_uva(loc, layer, backend, seen, totals, out)
    for rel, target in layer.tied.items():
        _check_tie(loc, layer, rel, target, owners, out)
    if layer.resident_bytes != own - offloaded:
        out.append(Finding(loc + ("resident_bytes",), say.mismatch(
            layer.resident_bytes, own - offloaded, "its params' bytes less the offloaded ones (tied params "
            "count at their owner)")))
    if layer.offloaded_bytes != offloaded:
        out.append(Finding(loc + ("offloaded_bytes",), say.mismatch(
            layer.offloaded_bytes, offloaded, "the bytes of its offloaded params")))
    totals.total += own
    totals.offloaded += offloaded
    if layer.offloaded:
        totals.offloaded_layers.append(i)
    if prefetched:
        totals.prefetched_layers.append(i)
    if layer.prefetch is not None:
        if backend not in PREFETCHING:
            out.append(Finding(loc + ("prefetch",), say.prefetch_without_backend(backend)))
        elif not layer.offloaded:
            out.append(Finding(loc + ("prefetch",), say.prefetch_without_offload()))
        elif not prefetched:
            out.append(Finding(loc + ("prefetch",), say.prefetch_all_uva()))
    elif backend in PREFETCHING and prefetched:
        out.append(Finding(loc + ("prefetch",), say.prefetch_missing(backend)))


def _check_uva(loc: Loc, layer: PlanLayer, backend: str, offloaded: set[str], totals: _Totals,
               out: list[Finding]) -> bool:
    """Check ``layer.uva`` (a subset of the offloaded params, agreeing with the backend); whether the
    layer prefetches any param."""
    on_uva: set[str] = set()
    for j, rel in enumerate(layer.uva):
        where = loc + ("uva", j)
        if rel in on_uva:
            out.append(Finding(where, say.offloaded_twice(rel)))
        elif rel not in offloaded:
            out.append(Finding(where, say.uva_not_offloaded(rel, layer.offloaded)))
        else:
            on_uva.add(rel)
    totals.uva_params += len(on_uva)
    by_expert = set(layer.experts.params) if layer.experts is not None else set()
    prefetched = [rel for rel in offloaded if rel not in on_uva and rel not in by_expert]
    if backend == "cpu" and (prefetched or layer.uva):
        out.append(Finding(loc + ("uva",), say.cpu_plan_links(sorted(prefetched), list(layer.uva))))
    elif backend == "uva" and prefetched:
        out.append(Finding(loc + ("uva",), say.uva_plan_prefetches(sorted(prefetched, key=layer.offloaded.index))))
    elif backend == "prefetch" and layer.uva:
        out.append(Finding(loc + ("uva",), say.prefetch_plan_uva(layer.uva)))
    return bool(prefetched)


def _check_tie(loc: Loc, layer: PlanLayer, rel: str, target: str,
               owners: dict[str, tuple[PlanLayer, str]], out: list[Finding]) -> None:
    where = loc + ("tied", rel)
    found = owners.get(target)
    if found is None:
        out.append(Finding(where, say.tied_unknown_target(target)))
        return
    owner_layer, owner_rel = found
    if owner_layer is layer and owner_rel == rel:
        out.append(Finding(where, say.tied_to_itself(target)))
        return
    if owner_rel in owner_layer.tied:
        out.append(Finding(where, say.tied_chain(target)))
        return
    mine = layer.params.get(rel)
    if mine is None:
        out.append(Finding(where, say.tied_missing_param(rel)))
        return
    theirs = owner_layer.params[owner_rel]
    if (mine.shape, mine.dtype, mine.stride) != (theirs.shape, theirs.dtype, theirs.stride):
        out.append(Finding(loc + ("params", rel), say.tied_differs(
            rel, say.param_bytes_source(mine.shape, mine.dtype, mine.stride), target,
            say.param_bytes_source(theirs.shape, theirs.dtype, theirs.stride))))


def _check_summary(plan: PlanContent, totals: _Totals, out: list[Finding]) -> None:
    s = plan.summary
    loc: Loc = ("summary",)
    n = len(totals.offloaded_layers)
    resident = totals.total - totals.offloaded
    if s.backend == "none" and n:
        first = plan.layers[totals.offloaded_layers[0]].name
        out.append(Finding(loc + ("backend",), say.none_offloads(n, first)))
    used = (totals.uva_params > 0) + (len(totals.prefetched_layers) > 0) + (totals.cpu_layers > 0)
    if s.backend == "mixed" and used < 2:
        out.append(Finding(loc + ("backend",), say.mixed_only_cpu() if totals.cpu_layers else
                           say.mixed_one_kind(totals.uva_params > 0, n > 0)))
    if s.backend == "cpu" and not totals.cpu_layers:
        out.append(Finding(loc + ("backend",), say.cpu_without_experts()))
    prefetching = s.backend in PREFETCHING and totals.prefetched_layers
    if plan.buffer_pool is not None and not prefetching:
        out.append(Finding(("buffer_pool",), say.pool_without_prefetch(s.backend)))
    if s.prefetch_step is not None and not prefetching:
        out.append(Finding(loc + ("prefetch_step",), say.step_without_prefetch(s.backend, s.prefetch_step)))
    if (s.rank is None) != (s.world_size is None) or (s.world_size is not None and not s.rank < s.world_size):
        out.append(Finding(loc + ("rank" if s.rank is not None else "world_size",), say.rank_world(s.rank, s.world_size)))
    if s.world_size is None and any(p.shard for layer in plan.layers for p in layer.params.values()):
        out.append(Finding(loc + ("world_size",), say.shard_without_world()))
    if not SHA256.fullmatch(s.spec_sha256):
        out.append(Finding(loc + ("spec_sha256",), say.sha_format(s.spec_sha256)))
    buffer = _rebuilt_buffer(plan, totals)
    others = plan.memory.non_weight_bytes if plan.memory is not None else 0
    peak = resident + buffer + others
    wants = [
        ("layers", len(plan.layers), "the layers listed"),
        ("offloaded_layers", n, "the layers that offload params"),
        ("total_bytes", totals.total, "the layers' params (tied params count at their owner)"),
        ("offloaded_bytes", totals.offloaded, "the layers' offloaded_bytes"),
        ("resident_bytes", resident, "total_bytes less offloaded_bytes"),
        ("pinned_host_bytes", totals.offloaded, "offloaded_bytes (each offloaded param is pinned once)"),
        ("buffer_bytes", buffer, "the buffer pool" if plan.buffer_pool is not None or buffer else "no buffer pool"),
        ("peak_gpu_bytes", peak, f"resident_bytes {resident} + buffer_bytes {buffer}" + (
            "" if plan.memory is None else say.memory_parts_source(plan.memory))),
    ]
    for name, want, source in wants:
        found = getattr(s, name)
        if found != want:
            out.append(Finding(loc + (name,), say.mismatch(found, want, source)))
    if s.gpu_budget_bytes is not None and peak > s.gpu_budget_bytes:
        if buffer > s.gpu_budget_bytes:
            out.append(Finding(("buffer_pool", "bytes"), say.over_budget(
                "the buffer pool alone", buffer, "GPU budget", "gpu_budget_bytes", s.gpu_budget_bytes)))
        else:
            out.append(Finding(loc + ("peak_gpu_bytes",), say.over_budget(
                "the peak", peak, "GPU budget", "gpu_budget_bytes", s.gpu_budget_bytes)))
    if s.cpu_budget_bytes is not None and totals.offloaded > s.cpu_budget_bytes:
        out.append(Finding(loc + ("pinned_host_bytes",), say.over_budget(
            "the pinned host memory", totals.offloaded, "host budget", "cpu_budget_bytes", s.cpu_budget_bytes)))


def _rebuilt_buffer(plan: PlanContent, totals: _Totals) -> int:
    """GPU bytes of the buffer pool the plan's prefetched layers need (checked in _check_prefetch)."""
    s = plan.summary
    if s.backend not in PREFETCHING or not totals.prefetched_layers:
        return 0
    step = s.prefetch_step if s.prefetch_step is not None and s.prefetch_step >= 1 else None
    if step is None:
        return plan.buffer_pool.bytes if plan.buffer_pool is not None else 0
    interned: dict[Signature, Signature] = {}  # equal layers share one signature: few objects, one pass
    sigs = [interned.setdefault(sig, sig) for sig in (_signature(plan.layers[i], totals.keys)
                                                       for i in totals.prefetched_layers)]
    span = _spanning(plan, totals.prefetched_layers)
    every = _every_slot(plan)
    totals.pool = build_pool(sigs, step if every else num_slots(len(sigs) - sum(span), step), span, every)
    totals.buffer = pool_bytes(totals.pool)
    return totals.buffer


def _every_slot(plan: PlanContent) -> bool:
    """Whether the plan's pool gives every key a buffer in each of prefetch_step slots (vLLM's pool)."""
    return plan.buffer_pool is not None and plan.buffer_pool.every_slot


def _spanning(plan: PlanContent, positions: list[int]) -> list[bool]:
    """Per prefetched layer: does the plan say it spans the slots (the planner's choice, read, not derived)."""
    return [(pf := plan.layers[i].prefetch) is not None and pf.span for i in positions]


def _signature(layer: PlanLayer, keys: dict[tuple[str, int], tuple[PoolKey, int]]) -> Signature:
    """The pool keys of the layer's prefetched params (offloaded, not on UVA); ``keys``: those made already."""
    params, on_uva = layer.params, set(layer.uva) | set(layer.experts.params if layer.experts is not None else ())
    out = []
    for rel in dict.fromkeys(layer.offloaded):
        p = params.get(rel)
        if p is None or rel in layer.tied or rel in on_uva:
            continue
        entry = keys.get((rel, id(p)))
        if entry is None:
            entry = keys[(rel, id(p))] = (PoolKey.of(rel, p.shape, p.dtype, p.stride), p.bytes)
        out.append(entry)
    return tuple(out)


def _check_prefetch(plan: PlanContent, totals: _Totals, out: list[Finding]) -> None:
    s = plan.summary
    positions = totals.prefetched_layers
    if s.backend not in PREFETCHING or not positions:
        return
    if s.prefetch_step is None:
        out.append(Finding(("summary", "prefetch_step"), say.step_missing(s.backend)))
        return
    if s.prefetch_step < 1:
        out.append(Finding(("summary", "prefetch_step"), say.step_too_small(s.prefetch_step)))
        return
    n, step = len(positions), s.prefetch_step
    span = _spanning(plan, positions)
    k = step if _every_slot(plan) else num_slots(n - sum(span), step)
    source = say.schedule_source(step, n, k, sum(span))
    if plan.buffer_pool is None:
        out.append(Finding(("buffer_pool",), say.pool_missing(s.backend)))
    else:
        _check_pool(plan, totals, k, source, out)
    layers = plan.layers
    num_layers = len(layers)
    spans = {p for p, spanning in zip(positions, span) if spanning}
    triggers = schedule(positions, num_layers, step, spans)
    alone = filled_once(triggers)
    for p, t, once in zip(positions, triggers, alone):
        pf = layers[p].prefetch
        if pf is None:
            continue  # reported with the layer
        loc: Loc = ("layers", p, "prefetch")
        if pf.once and not once:
            others = sum(1 for u in triggers if u.slot == t.slot) - 1
            out.append(Finding(loc + ("once",), say.once_shared(t.slot, others, bool(spans))))
        before = layers[t.copy_before(num_layers)].name
        if pf.slot != t.slot and not t.span:
            out.append(Finding(loc + ("slot",), say.mismatch(pf.slot, t.slot, source)))
        if pf.copy_before != before:
            out.append(Finding(loc + ("copy_before",), say.mismatch(pf.copy_before, before, source)))
        if pf.previous_forward != t.previous_forward:
            out.append(Finding(loc + ("previous_forward",), say.mismatch(pf.previous_forward, t.previous_forward,
                                                                       source)))


def _check_pool(plan: PlanContent, totals: _Totals, k: int, source: str, out: list[Finding]) -> None:
    pool = plan.buffer_pool
    assert pool is not None
    entries = totals.pool
    loc: Loc = ("buffer_pool",)
    if pool.slots != k:
        old = pool.slots == min(len(totals.offloaded_layers), plan.summary.prefetch_step + 1)  # type: ignore[operator]
        out.append(Finding(loc + ("slots",), say.mismatch(pool.slots, k, source) + (say.old_rule_slots() if old else "")))
    want = {e.key: e for e in entries}
    seen: set[PoolKey] = set()
    for i, bk in enumerate(pool.keys):
        key = bk.key
        where = loc + ("keys", i)
        if key in seen:
            out.append(Finding(where, say.pool_key_twice(key)))
            continue
        seen.add(key)
        e = want.get(key)
        if e is None:
            out.append(Finding(where, say.pool_key_unneeded(key)))
            continue
        if bk.bytes != e.nbytes:
            out.append(Finding(where + ("bytes",), say.mismatch(bk.bytes, e.nbytes, "the offloaded params with this key")))
        if list(bk.slots) != list(e.slots):
            out.append(Finding(where + ("slots",), say.mismatch(
                bk.slots, e.slots, f"the slots of the offloaded layers holding {key.param} ({source})")))
        if bk.span != e.span:
            out.append(Finding(where + ("span",), say.mismatch(
                bk.span, e.span, f"the spanning layers holding {key.param} ({source})")))
    missing = [e.key for e in entries if e.key not in seen]
    if missing:
        out.append(Finding(loc + ("keys",), say.pool_keys_missing(missing)))
    elif len(pool.keys) == len(entries) and [bk.key for bk in pool.keys] != [e.key for e in entries]:
        out.append(Finding(loc + ("keys",), say.pool_keys_order()))
    if pool.bytes != totals.buffer:
        out.append(Finding(loc + ("bytes",), say.mismatch(pool.bytes, totals.buffer, say.pool_bytes_source(
            has_span(entries)))))
