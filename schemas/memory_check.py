"""The plan check of a plan's ``memory`` and ``throughput`` sections: the parts add up, re-proved from the
plan's own figures (``planner.memory`` computes them from the spec, which a plan does not carry; what the
plan says of itself must agree).

Per forward: its KV cache is ``batch x context x kv_bytes_per_token`` (none without a context), its batch is
at most its tokens and its context holds its new tokens, and it is the forward the predictions predict (the
same tokens). The section's KV cache is the largest forward's (``kv_cache: workload``), or at least that
(a reservation, or what the plan leaves); its activations are the largest forward's unless the spec gave
them. The summary's peak adds the parts up (``schemas.plan_check``). The throughput section: the chosen
batch is an option, each option's tokens per second is its batch over its step, the chosen one has the
most, and the predictions and the memory section are of that batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import schemas.plan_wording as say
from schemas.dtypes import canonical_dtype

if TYPE_CHECKING:
    from schemas.plan_content import PlanContent as Plan
    from schemas.plan_memory import PlanMemory

Finding = Callable[[tuple[Any, ...], str], None]
ROUNDING = 1e-4  # figures are written rounded to 4 decimals


def check_memory(plan: Plan, found: Finding) -> None:
    """Call ``found(loc, text)`` for each contradiction in ``plan.memory`` and ``plan.throughput``."""
    mem = plan.memory
    if mem is not None:
        _check_sections(mem, found)
        if plan.predictions is not None:
            _check_against_predictions(plan, mem, found)
    if plan.throughput is not None:
        _check_throughput(plan, found)


def _check_sections(mem: PlanMemory, found: Finding) -> None:
    loc: tuple[Any, ...] = ("memory",)
    try:
        if canonical_dtype(mem.kv_cache_dtype) != mem.kv_cache_dtype:
            found(loc + ("kv_cache_dtype",), say.dtype_alias(mem.kv_cache_dtype, canonical_dtype(mem.kv_cache_dtype)))
    except ValueError as err:
        found(loc + ("kv_cache_dtype",), str(err))
    seen: dict[str, int] = {}
    for i, f in enumerate(mem.forwards):
        where = loc + ("forwards", i)
        first = seen.setdefault(f.workload, i)
        if first != i:
            found(where + ("workload",), say.forward_twice(f.workload, first))
        if f.batch > f.tokens:
            found(where + ("batch",), say.batch_over_tokens(f.batch, f.tokens))
        if f.context and f.context < -(-f.tokens // f.batch):
            found(where + ("context",), say.context_too_short(f.context, f.tokens, f.batch))
        want = f.batch * f.context * (mem.kv_bytes_per_token or 0)
        if f.context and mem.kv_bytes_per_token is None:
            found(where + ("context",), say.context_without_kv_size())
        elif f.kv_cache_bytes != want:
            found(where + ("kv_cache_bytes",), say.mismatch(f.kv_cache_bytes, want, say.kv_source(
                f.batch, f.context, mem.kv_bytes_per_token)))
    largest_kv = max(f.kv_cache_bytes for f in mem.forwards)
    if mem.kv_cache == "workload" and mem.kv_cache_bytes != largest_kv:
        found(loc + ("kv_cache_bytes",), say.mismatch(mem.kv_cache_bytes, largest_kv, say.largest_source("KV cache")))
    elif mem.kv_cache != "workload" and mem.kv_cache_bytes < largest_kv:
        found(loc + ("kv_cache_bytes",), say.kv_below_need(mem.kv_cache_bytes, largest_kv, mem.kv_cache))
    largest_act = max(f.activation_bytes for f in mem.forwards)
    if mem.activations == "model" and mem.activation_bytes != largest_act:
        found(loc + ("activation_bytes",), say.mismatch(mem.activation_bytes, largest_act,
                                                        say.largest_source("activations' peak")))


def _check_against_predictions(plan: Plan, mem: PlanMemory, found: Finding) -> None:
    """The memory section is of the forwards the plan predicts (same names, same tokens)."""
    preds = plan.predictions
    assert preds is not None
    predicted = {row.workload: row.tokens for row in preds.workloads}
    mine = {f.workload: f.tokens for f in mem.forwards}
    for i, f in enumerate(mem.forwards):
        tokens = predicted.get(f.workload)
        if tokens is None:
            found(("memory", "forwards", i, "workload"), say.forward_not_predicted(f.workload, list(predicted)))
        elif tokens != f.tokens:
            found(("memory", "forwards", i, "tokens"), say.mismatch(f.tokens, tokens, say.predicted_tokens_source(
                f.workload)))
    missing = [name for name in predicted if name not in mine]
    if missing:
        found(("memory", "forwards"), say.forwards_missing(missing))


def _check_throughput(plan: Plan, found: Finding) -> None:
    t = plan.throughput
    assert t is not None
    loc: tuple[Any, ...] = ("throughput",)
    for i, o in enumerate(t.options):
        want = o.batch * 1000.0 / o.step_ms if o.step_ms > 0 else 0.0
        if abs(o.tokens_per_s - want) > 0.01 + want * ROUNDING / max(o.step_ms, ROUNDING):  # both rounded
            found(loc + ("options", i, "tokens_per_s"), say.mismatch(o.tokens_per_s, round(want, 4),
                                                                     say.tokens_per_s_source()))
    batches = [o.batch for o in t.options]
    if batches != sorted(set(batches)):
        found(loc + ("options",), say.options_order())
    chosen = next((o for o in t.options if o.batch == t.batch), None)
    if chosen is None:
        found(loc + ("batch",), say.chosen_not_an_option(t.batch, batches))
        return
    if abs(chosen.tokens_per_s - t.tokens_per_s) > 0.01:
        found(loc + ("tokens_per_s",), say.mismatch(t.tokens_per_s, chosen.tokens_per_s, say.chosen_source(t.batch)))
    better = [o.batch for o in t.options if o.tokens_per_s > chosen.tokens_per_s + 0.01]
    if better:
        found(loc + ("batch",), say.better_batch(t.batch, better[0]))
    if plan.predictions is not None:
        row = next((r for r in plan.predictions.workloads if r.workload == t.workload), None)
        if row is None:
            found(loc + ("workload",), say.forward_not_predicted(t.workload, [r.workload for r in plan.predictions.workloads]))
        elif row.tokens != t.batch or abs(row.step_ms - chosen.step_ms) > ROUNDING:
            found(loc + ("batch",), say.throughput_not_predicted(t.workload, t.batch, chosen.step_ms, row.tokens,
                                                                  row.step_ms))
    forward = plan.memory.forward(t.workload) if plan.memory is not None else None
    if forward is not None and (forward.batch != t.batch or forward.context != t.context):
        found(loc + ("context",), say.throughput_not_in_memory(t.workload, t.batch, t.context, forward.batch,
                                                                forward.context))
