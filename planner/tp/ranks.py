"""Tensor-parallel planning: one plan per rank, each a normal plan of that rank's shards.

``plan_ranks(spec, world_size, **kwargs)`` splits every param (planner/tp/split.py), plans the rank spec
like any spec (``planner.plan`` with the same keyword arguments; budgets are per GPU), and marks the plan
with each param's ``shard``, the original spec's hash and ``rank``/``world_size``. Splits are even, so
every rank's part has the same shapes and the ranks' plans differ only in ``summary.rank``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from schemas.plan import Plan
from schemas.spec import SpecFile
from schemas.spec_hash import spec_sha256

from planner.tp import notes as tp_notes
from planner.errors import InfeasibleError
from planner.words.infeasible import tp_prefix
from planner.tp.split import Split, split_spec


def _marked(plan: Plan, split: Split, spec: SpecFile) -> Plan:
    """``plan`` of the rank spec with every param's shard, the rank notes and the original spec's hash."""
    by_layer = split.by_layer()
    full = {f"{layer}.{rel}": shard for layer, row in by_layer.items() for rel, shard in row.items()}
    layers = []
    for layer in plan.layers:
        row = by_layer[layer.name]
        params = {rel: p.model_copy(update={"shard": row[rel] if rel in row else full[layer.tied[rel]]})
                  for rel, p in layer.params.items()}
        layers.append(layer.model_copy(update={"params": params}))
    by_shard = split.bytes_by_shard()
    model_bytes = sum(by_shard.values())
    notes = [tp_notes.split_note(split.world_size, model_bytes, plan.summary.total_bytes, by_shard)]
    if split.unmatched:
        notes.append(tp_notes.unmatched_note(split.unmatched))
    if split.by_rows:
        notes.append(tp_notes.by_rows_note(split.by_rows))
    if split.world_size > 1:
        notes.append(tp_notes.collectives_note(split.row_parallel_layers(), "vocab" in by_shard))
    summary = plan.summary.model_copy(update={
        "spec_sha256": spec_sha256(spec), "rank": 0, "world_size": split.world_size,
        "notes": list(plan.summary.notes) + notes})
    return plan.model_copy(update={"layers": layers, "summary": summary})


def plan_ranks(spec: SpecFile, world_size: int, make: Callable[[SpecFile], Plan] | None = None,
               **kwargs: Any) -> list[Plan]:
    """The plans of ranks ``0..world_size-1`` (index = rank); ``kwargs`` as ``planner.plan`` (gpu_budget and
    cpu_budget per GPU); ``make``: what plans the rank spec instead of ``planner.plan`` (a plan assembled by
    hand, say). Raises ShardError (an InputError) for a param that cannot be split, and InfeasibleError,
    saying the tensor-parallel split, when a rank's part does not fit."""
    from planner.build import plan

    split = split_spec(spec, world_size)
    try:
        one = make(split.spec) if make is not None else plan(split.spec, **kwargs)
    except InfeasibleError as err:
        rank_bytes = sum(layer.nbytes for layer in split.spec.model.expanded())
        if err.record is not None:
            raise InfeasibleError(replace(err.record, tp=(world_size, rank_bytes))) from None
        raise InfeasibleError(tp_prefix(world_size, rank_bytes) + err.message, err.min_gpu_budget) from None
    first = _marked(one, split, spec)
    return [first] + [first.model_copy(update={"summary": first.summary.model_copy(update={"rank": r})})
                      for r in range(1, world_size)]


def slowest_rank(plans: list[Plan]) -> int | None:
    """The rank whose predicted (weighted) step is the longest: it sets the set's step; None without predictions."""
    return slowest_of([None if p.predictions is None else p.predictions.weighted_step_ms for p in plans])


def slowest_of(steps: list[float | None]) -> int | None:
    """The index (rank) of the longest step, the lowest rank of equal ones; None when none is known."""
    timed = [(ms, r) for r, ms in enumerate(steps) if ms is not None]
    if not timed:
        return None
    return max(timed, key=lambda t: (t[0], -t[1]))[1]
