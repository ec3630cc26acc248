"""The memory a plan counts besides the weights, in words: its notes, the infeasible message that names the
part that does not fit, and what a request the model cannot size needs."""

from __future__ import annotations

from schemas.plan_memory import ForwardMemory, PlanMemory
from schemas.sizes import format_bytes
from schemas.workload import is_prefill


def _tokens(n: int) -> str:
    return f"{n:,} token{'s' if n != 1 else ''}"


def kv_part(f: ForwardMemory) -> str:
    """``the KV cache for 32 x 4,096 tokens``."""
    return f"the KV cache for {f.batch:,} x {f.context:,} tokens"


def _parts(mem: PlanMemory) -> list[tuple[str, int]]:
    """The parts besides the weights, largest first, with how each was sized."""
    largest_kv = max(mem.forwards, key=lambda f: f.kv_cache_bytes)
    if mem.kv_cache != "reserved" and largest_kv.context:
        kv = kv_part(largest_kv)
    else:
        kv = "the KV cache reserved" if mem.kv_cache == "reserved" else "the KV cache"
    largest_act = max(mem.forwards, key=lambda f: f.activation_bytes)
    act = ("the activations (memory.activations)" if mem.activations == "spec" else
           f"the activations of {largest_act.workload} ({_tokens(largest_act.tokens)}, at {largest_act.largest})")
    words = {"kv_cache_bytes": kv, "activation_bytes": act, "workspace_bytes": "the workspace",
             "graph_bytes": "the experts' decode graphs"}
    return sorted(((words[name], n) for name, n in mem.parts() if n), key=lambda p: -p[1])


def infeasible(gpu_budget: int, mem: PlanMemory, need: int | None, weights_message: str) -> str:
    """No plan fits: which part does not, what is left for weights and buffers, the smallest budget."""
    parts = _parts(mem)
    others = mem.non_weight_bytes
    named = ", ".join(f"{what} ({format_bytes(n)})" for what, n in parts) or "nothing"
    if parts and parts[0][1] > gpu_budget:
        what, n = parts[0]
        head = f"{what} alone {_need(what)} {format_bytes(n)}, more than the {format_bytes(gpu_budget)} gpu_budget"
        rest = f" ({', '.join(f'{w} {format_bytes(n)}' for w, n in parts[1:])} besides)" if parts[1:] else ""
        head += rest
    elif others > gpu_budget:
        head = (f"besides the weights the plan counts {named}, {format_bytes(others)} together, more than the "
                f"{format_bytes(gpu_budget)} gpu_budget")
    else:
        head = (f"besides the weights the plan counts {named}, which leaves {format_bytes(gpu_budget - others)} of "
                f"the {format_bytes(gpu_budget)} gpu_budget for weights and buffers")
    smallest = "" if need is None else (f"; with every weight offloaded that can be, the smallest gpu_budget is "
                                        f"{format_bytes(need)} ({need} bytes)")
    if others >= gpu_budget:  # nothing is left for the weights: what they alone would need is beside the point
        return f"no plan fits: {head}{smallest}"
    return f"no plan fits: {head}{smallest}\n  weights and buffers alone: {weights_message}"


def _need(what: str) -> str:
    return "need" if what.startswith("the activations") else "needs"


def budget_note(gpu_budget: int | None, mem: PlanMemory) -> list[str]:
    """What the plan counts besides the weights, and what that leaves them."""
    parts = _parts(mem)
    if not parts:
        return []
    listed = "; ".join(f"{what}: {format_bytes(n)}" for what, n in parts)
    left = ("" if gpu_budget is None else
            f"; weights and buffers get the {format_bytes(gpu_budget - mem.non_weight_bytes)} left of the "
            f"{format_bytes(gpu_budget)} gpu_budget")
    return [f"memory besides the weights: {listed}{left}"]


def assumed_notes(mem: PlanMemory, given_batch: dict[str, bool]) -> list[str]:
    """What the plan assumed of each forward the workload did not spell out (``given_batch``: name -> whether
    the workload gave its batch)."""
    out = []
    for f in mem.forwards:
        if not given_batch.get(f.workload, True) and f.context:
            how = ("one sequence (a prefill)" if is_prefill(f.workload) else
                   f"{f.batch:,} sequence{'s' if f.batch != 1 else ''} of one new token (a decode step)")
            out.append(f"{f.workload}: {_tokens(f.tokens)} read as {how}; give batch to say otherwise")
    blind = [f.workload for f in mem.forwards if not f.context]
    if blind and mem.kv_cache == "workload":
        names = " and ".join(blind)
        out.append(f"{names}: no context given, so no KV cache is counted; a forward that keeps one says how long "
                   f"(-w {blind[0]}=N@CONTEXT, --context N, or context: N in the spec's workload)")
    return out


def room_notes(mem: PlanMemory) -> list[str]:
    """How much the KV cache holds, as serving engines say it at start-up."""
    tokens = mem.kv_tokens
    if tokens is None:
        return [f"KV cache: {format_bytes(mem.kv_cache_bytes)} (the size of a token in it is not known)"]
    context = max((f.context for f in mem.forwards), default=0)
    room = f"room for {tokens // context:,} sequences of {context:,} tokens" if context else f"room for {_tokens(tokens)}"
    how = "what the plan leaves of the gpu_budget" if mem.kv_cache == "auto" else "reserved"
    return [f"KV cache: {format_bytes(mem.kv_cache_bytes)}, {how}: {room} ({_tokens(tokens)} of "
            f"{format_bytes(mem.kv_bytes_per_token or 0)} each)"]


def kv_unknown(name: str, context: int, problem: str) -> str:
    return f"workload '{name}' keeps a KV cache ({_tokens(context)} a sequence), whose size is not known: {problem}"


def reservation_too_small(given: int, f: ForwardMemory) -> str:
    return (f"memory.kv_cache reserves {format_bytes(given)} ({given} bytes), less than {kv_part(f)} of workload "
            f"'{f.workload}' needs, {format_bytes(f.kv_cache_bytes)} ({f.kv_cache_bytes} bytes)")


def beyond_any_gpu(name: str, what: str, n: int) -> str:
    return f"workload '{name}': its {what} needs {n:.3e} bytes, more than any GPU holds (at most 2^63-1)"
