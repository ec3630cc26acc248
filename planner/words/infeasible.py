"""Why no plan fits, in words: the message of an ``Infeasible`` record (planner/strategy/infeasible.py).

Every message that knows the smallest feasible GPU budget ends by naming it in bytes, so a reader (or
the CLI's hint) can rerun with it.
"""

from __future__ import annotations

from planner.strategy.infeasible import Infeasible
from planner.words.selection import params_desc
from schemas.sizes import format_bytes


def message(record: Infeasible) -> str:
    text = _MESSAGES[record.cause](record)
    if record.tp is not None:
        text = tp_prefix(*record.tp) + text
    return text


def tp_prefix(world_size: int, rank_bytes: int) -> str:
    """What a rank's message starts with under tensor parallelism."""
    return f"tensor parallel over {world_size} ranks, each GPU holding {format_bytes(rank_bytes)} of the model: "


def _smallest(record: Infeasible) -> str:
    return f"the smallest feasible gpu_budget is {record.smallest} bytes"


def _no_plan(r: Infeasible) -> str:
    if r.strategy == "auto":
        cpu = f" within the {format_bytes(r.cpu_budget)} cpu_budget" if r.cpu_budget is not None else ""
        lowest = ("the lowest peak of any auto plan is " if r.movable else
                  "nothing can be offloaded (no layer has eligible params), so the whole model stays at ")
        return (f"no auto plan fits the {format_bytes(r.gpu_budget or 0)} gpu_budget{cpu}: {lowest}"
                f"{format_bytes(r.needs[0].peak)}; {_smallest(r)}")
    what = f"no {r.requested} plan" if r.requested else "no plan"
    cpu = f" within the {format_bytes(r.cpu_budget)} cpu_budget" if r.cpu_budget else ""
    details = "; ".join(f"{n.backend} needs at least {format_bytes(n.peak)} ({n.peak} bytes, {n.layers} layers "
                        f"offloaded)" for n in sorted(r.needs, key=lambda n: n.backend))
    return f"{what} fits the {format_bytes(r.gpu_budget or 0)} gpu_budget{cpu}: {details}; {_smallest(r)}"


def _backend_none(r: Infeasible) -> str:
    return (f"backend none keeps the whole model ({format_bytes(r.total_bytes)}) on the GPU, which exceeds the "
            f"{format_bytes(r.gpu_budget or 0)} gpu_budget; {_smallest(r)}")


def _nothing_to_offload(r: Infeasible) -> str:
    model, gpu = format_bytes(r.total_bytes), format_bytes(r.gpu_budget or 0)
    if r.why_nothing == "group":
        return f"nothing can be offloaded and the model ({model}) exceeds the {gpu} gpu_budget; {_smallest(r)}"
    where = "no block stack" if r.why_nothing == "no_stack" else f"no block-stack layer has {params_desc(*r.selection)}"
    return f"the model ({model}) exceeds the {gpu} gpu_budget and nothing can be offloaded ({where}); {_smallest(r)}"


def _over_cpu(r: Infeasible) -> str:
    who = "vLLM's flags pin" if r.strategy == "vllm" else "the plan pins"
    return f"{who} {format_bytes(r.pinned)} of host memory, more than the {format_bytes(r.cpu_budget or 0)} cpu_budget"


def _vllm_flags(r: Infeasible) -> str:
    peak = r.needs[0].peak
    others = "" if r.non_weight is None else f", {r.non_weight} for the KV cache, activations and workspace"
    return (f"vLLM's flags make a plan that peaks at {peak} bytes ({format_bytes(peak)}), over the {r.gpu_budget}-byte "
            f"gpu_budget ({r.offloaded} bytes offloaded, {r.buffer} in buffers{others}); the smallest feasible "
            f"gpu_budget for these flags is {r.smallest} bytes")


_MESSAGES = {"no_plan": _no_plan, "backend_none": _backend_none, "nothing_to_offload": _nothing_to_offload,
             "over_cpu": _over_cpu, "vllm_flags": _vllm_flags}
