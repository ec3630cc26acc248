"""The sentences of the plan check (schemas/plan_check.py), kept apart from its decisions.

Each function returns the text after a field path, e.g. for
``layers[3].params['mlp.w1'].bytes``: ``1 in the file, 512 from shape [16, 16], dtype float16``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schemas.errors import suggest


def value(v: Any) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, str):
        return f"'{v}'"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return str(v)


def mismatch(found: Any, want: Any, source: str) -> str:
    return f"{value(found)} in the file, {value(want)} from {source}"


def param_bytes_source(shape: Sequence[int], dtype: str, stride: Sequence[int] | None) -> str:
    strided = "" if stride is None else f", stride {value(stride)}"
    return f"shape {value(shape)}, dtype {dtype}{strided}"


def dtype_alias(found: str, canonical: str) -> str:
    return f"dtype '{found}' is a short form; a plan spells it '{canonical}'"


def stride_rank(stride: Sequence[int], shape: Sequence[int]) -> str:
    return f"stride {value(stride)} has {len(stride)} entries but shape {value(shape)} has {len(shape)}"


def duplicate_layer(name: str, first: int) -> str:
    return f"layer name '{name}' is also the name of layers[{first}]"


def offloaded_twice(rel: str) -> str:
    return f"'{rel}' is listed more than once"


def offloaded_unknown(rel: str, known: Sequence[str]) -> str:
    return f"'{rel}' is not a param of this layer{suggest(rel, list(known))}"


def offloaded_tied(rel: str, owner: str) -> str:
    return f"'{rel}' is tied to '{owner}' and shares its storage: a tied param is never offloaded"


def offloaded_tie_target(full: str, tied: Sequence[str]) -> str:
    more = f" and {len(tied) - 3} more" if len(tied) > 3 else ""
    return (f"'{full}' is offloaded but {', '.join(repr(t) for t in tied[:3])}{more} share its storage "
            "(tied): a tied param's owner stays on the GPU")


def tied_missing_param(rel: str) -> str:
    return f"tied param '{rel}' has no entry under params (the plan lists it with its owner's shape and dtype)"


def tied_unknown_target(target: str) -> str:
    return f"'{target}' is not a param of any layer of the plan"


def tied_to_itself(target: str) -> str:
    return f"'{target}' is the param itself"


def tied_chain(target: str) -> str:
    return f"'{target}' is itself a tied param; tie to the param that owns the storage"


def tied_differs(rel: str, mine: str, target: str, theirs: str) -> str:
    return f"'{rel}' is {mine} but its owner '{target}' is {theirs}"


def prefetch_without_backend(backend: str) -> str:
    return f"a prefetch entry, but the backend is '{backend}' (only the prefetch and mixed backends have them)"


def prefetch_without_offload() -> str:
    return "a prefetch entry, but the layer offloads nothing"


def prefetch_all_uva() -> str:
    return "a prefetch entry, but every offloaded param of the layer is on UVA (nothing to copy)"


def prefetch_missing(backend: str) -> str:
    if backend == "prefetch":
        return "the layer offloads params under the prefetch backend but has no prefetch entry"
    return f"the layer prefetches params (offloaded, not on UVA) under the {backend} backend but has no prefetch entry"


def uva_not_offloaded(rel: str, offloaded: Sequence[str]) -> str:
    return f"'{rel}' is not an offloaded param of this layer (uva lists offloaded params only){suggest(rel, list(offloaded))}"


def uva_plan_prefetches(rels: Sequence[str]) -> str:
    more = f" and {len(rels) - 3} more" if len(rels) > 3 else ""
    return (f"backend 'uva' reads every offloaded param through UVA, but {', '.join(repr(r) for r in rels[:3])}{more} "
            f"{'is' if len(rels) == 1 else 'are'} not listed here (list {'it' if len(rels) == 1 else 'them'}, "
            "or make the plan 'mixed')")


def prefetch_plan_uva(rels: Sequence[str]) -> str:
    return (f"backend 'prefetch' copies every offloaded param, but {value(list(rels))} "
            f"{'is' if len(rels) == 1 else 'are'} listed as on UVA "
            "(a plan with both is 'mixed')")


def mixed_one_kind(has_uva: bool, offloads: bool) -> str:
    if not offloads:
        return "'mixed' prefetches some offloaded params and reads the others through UVA, but no layer offloads any param (use 'none')"
    if not has_uva:
        return "'mixed' prefetches some offloaded params and reads the others through UVA, but no layer lists a param under uva (use 'prefetch')"
    return "'mixed' prefetches some offloaded params and reads the others through UVA, but every offloaded param is on UVA (use 'uva')"


def cpu_plan_links(prefetched: Sequence[str], uva: Sequence[str]) -> str:
    named = [*prefetched, *uva]
    return (f"backend cpu, but {', '.join(named)} {'is' if len(named) == 1 else 'are'} prefetched or read through UVA "
            "(a plan with more than one backend is mixed)")


def mixed_only_cpu() -> str:
    return "'mixed' uses more than one backend, but every offloaded param is computed by the host (use 'cpu')"


def cpu_without_experts() -> str:
    return "backend cpu, but no layer has experts the host computes (experts.cpu)"


def schedule_source(step: int, n: int, slots: int, spanning: int = 0) -> str:
    over = f", {spanning} of them spanning the slots" if spanning else ""
    return (f"the schedule of prefetch_step {step} over {n} offloaded layers in {slots} slot{'s' if slots != 1 else ''}"
            f"{over}")


def once_shared(slot: int | None, others: int, spanning: bool) -> str:
    if spanning:
        return ("once: a layer spans the slots, so every slot's bytes are overwritten each forward: only a "
                "slot's only user in a plan without spanning layers is copied once")
    return (f"once: slot {slot} also holds {others} other offloaded layer{'s' if others != 1 else ''}, which "
            "overwrite it: only a slot's only user (with no layer spanning the slots) is copied once")


def pool_bytes_source(arena: bool) -> str:
    if arena:
        return "the arena of the buffers the offloaded layers need (slots one after the other, spanning buffers over them)"
    return "the buffers the offloaded layers need"


def old_rule_slots() -> str:
    return ("; that is the old rule (plan_version 1, where prefetch_step meant slots - 1): "
            "make the plan again with `planner plan SPEC`")


def step_too_small(step: int) -> str:
    return f"must be >= 1 (got {step}): it is the number of buffer slots"


def step_missing(backend: str) -> str:
    if backend == "prefetch":
        return "the prefetch backend with offloaded layers needs a prefetch_step (>= 1)"
    return f"the {backend} backend with prefetched params needs a prefetch_step (>= 1)"


def step_without_prefetch(backend: str, step: int) -> str:
    return (f"{step}, but only the prefetch backend (or mixed) with prefetched params has a prefetch_step "
            f"(backend '{backend}')")


def pool_without_prefetch(backend: str) -> str:
    return f"backend '{backend}' has no buffer pool (only prefetch or mixed with prefetched params does)"


def pool_missing(backend: str) -> str:
    return f"the {backend} backend with prefetched params needs a buffer_pool"


def none_offloads(count: int, first: str) -> str:
    return f"'none' keeps every param on the GPU, but {count} layer(s) offload params (first: '{first}')"


def pool_key_text(key: Any) -> str:
    stride = "" if key.stride is None else f" stride {value(key.stride)}"
    return f"{key.param} {value(key.shape)} {key.dtype}{stride}"


def pool_key_unneeded(key: Any) -> str:
    return f"no offloaded param needs a buffer {pool_key_text(key)}"


def pool_key_twice(key: Any) -> str:
    return f"buffer {pool_key_text(key)} is listed more than once"


def pool_keys_missing(keys: Sequence[Any]) -> str:
    more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
    return "missing buffers the offloaded layers need: " + "; ".join(pool_key_text(k) for k in keys[:3]) + more


def pool_keys_order() -> str:
    return "keys are not in order (by param, shape, dtype, stride)"


def over_budget(what: str, found: int, budget: str, budget_field: str, limit: int) -> str:
    return f"{what} ({found} bytes) is larger than the plan's {budget} (summary.{budget_field}: {limit})"


def rank_world(rank: int | None, world_size: int | None) -> str:
    if rank is None or world_size is None:
        return f"rank {value(rank)} and world_size {value(world_size)}: a rank plan gives both, other plans neither"
    return f"rank {rank} is not below world_size {world_size}"


def shard_without_world() -> str:
    return "params have a shard but the summary has no world_size: only rank plans split params"


def sha_format(found: str) -> str:
    return f"{value(found)} is not a sha256 (64 lowercase hex digits)"


def workload_twice(name: str, first: int) -> str:
    return f"workload '{name}' is predicted twice (first at predictions.workloads[{first}])"


def step_too_short(step: float, below: float, what: str) -> str:
    return (f"{step} ms is shorter than {what}, {round(below, 4)} ms: a forward ends after its copies, its CPU "
            "work and its kernels")


def time_without_prefetch(name: str, found: float) -> str:
    return f"{found} ms, but the plan prefetches no layer: {name} is 0 without copies"


def copy_time_source() -> str:
    return ("the plan's prefetched bytes at the profile's link rate (predictions.profile.h2d_gbps) plus one "
            "copy call a param (copy_call_us), layers copied once (prefetch.once) left out")


def wrong_bound(bound: str, largest: str) -> str:
    return f"'{bound}', but {largest} is the largest of copy_ms, compute_ms and cpu_ms"


def weighted_source() -> str:
    return "the workloads' step_ms averaged with their weights"


def forward_twice(name: str, first: int) -> str:
    return f"workload '{name}' is listed twice (first at memory.forwards[{first}])"


def batch_over_tokens(batch: int, tokens: int) -> str:
    return f"{batch} sequences push at least one token each, more than the forward's {tokens} tokens"


def context_too_short(context: int, tokens: int, batch: int) -> str:
    return (f"a context of {context} tokens cannot hold the {-(-tokens // batch)} new tokens each sequence adds "
            f"(tokens {tokens} / batch {batch})")


def context_without_kv_size() -> str:
    return "a context needs memory.kv_bytes_per_token (the size of a token in the KV cache), which is absent"


def kv_source(batch: int, context: int, per_token: int | None) -> str:
    return f"batch {batch} x context {context} x memory.kv_bytes_per_token {value(per_token)}"


def largest_source(what: str) -> str:
    return f"the largest forward's {what} (memory.forwards)"


def kv_below_need(found: int, need: int, sizing: str) -> str:
    return (f"{found} bytes, less than the {need} bytes the largest forward's KV cache needs (memory.kv_cache "
            f"'{sizing}' sizes it at least so)")


def forward_not_predicted(name: str, predicted: Sequence[str]) -> str:
    return f"workload '{name}' is not among the predicted workloads ({', '.join(predicted) or 'none'})"


def forwards_missing(names: Sequence[str]) -> str:
    return f"the predicted workloads {', '.join(names)} have no entry here (every predicted forward has one)"


def predicted_tokens_source(name: str) -> str:
    return f"the tokens predictions.workloads gives '{name}'"


def tokens_per_s_source() -> str:
    return "batch x 1000 / step_ms"


def options_order() -> str:
    return "options are not listed by increasing batch, each once"


def chosen_not_an_option(batch: int, batches: Sequence[int]) -> str:
    return f"batch {batch} is not among the options ({', '.join(map(str, batches))})"


def chosen_source(batch: int) -> str:
    return f"the tokens_per_s of the option of batch {batch}"


def better_batch(batch: int, better: int) -> str:
    return f"batch {better} has more tokens per second than the chosen batch {batch}"


def throughput_not_predicted(name: str, batch: int, step_ms: float, tokens: int, predicted: float) -> str:
    return (f"batch {batch} at {step_ms} ms, but predictions give '{name}' {tokens} tokens at {predicted} ms: the "
            "plan is predicted at the chosen batch")


def throughput_not_in_memory(name: str, batch: int, context: int, mem_batch: int, mem_context: int) -> str:
    return (f"batch {batch} at a context of {context}, but memory.forwards gives '{name}' batch {mem_batch} at "
            f"{mem_context}: the plan's memory is of the chosen batch")


def memory_parts_source(mem: Any) -> str:
    return "".join(f" + memory.{name} {n}" for name, n in mem.parts())


def summary_intro(count: int) -> str:
    return f"the plan contradicts itself ({count} problem{'s' if count != 1 else ''})"
