"""strategy auto, in words: why each group of params went where it went, and the runner-up."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from planner.strategy.auto import AutoDecision, RunnerUp
from planner.words.names import join_names
from schemas.sizes import format_bytes
from schemas.workload import Workload

_WHY_UVA = {
    "embedding": "an embedding lookup reads only the rows of the tokens",
    "routed_experts": "a batch reads only the experts it routes to",
}


def _workload_text(workload: Workload) -> str:
    return ", ".join(f"{name} ({item.rows} token{'s' if item.rows != 1 else ''}"
                     + (f", weight {item.weight:g}" if len(workload.root) > 1 else "") + ")"
                     for name, item in workload.items())


def reason(decision: AutoDecision, workload: Workload, hardware: str, budget: int | None,
           host: frozenset[str] = frozenset(), host_at: Collection[int] | None = None) -> str:
    """``host``: the kinds the host CPU computes (offload.backends cpu), placed as UVA moves; ``host_at``: the
    positions of the layers whose experts it shares (None: every layer's)."""
    if not decision.taken:
        fits = "no gpu_budget given" if budget is None else f"the whole model fits the {format_bytes(budget)} gpu_budget"
        return f"auto: {fits}: nothing is offloaded"
    uva, pf = decision.in_place(), decision.moves_by("prefetch")
    spanned = [m for m in decision.moves_by("uva") if decision.spanned(m)]
    parts = []
    on_host = [m for m in uva if _on_host(m, host, host_at)]
    uva = [m for m in uva if not _on_host(m, host, host_at)]
    if uva:
        parts.append(f"UVA for {format_bytes(sum(m.nbytes for m in uva))}")
    if on_host:
        parts.append(f"the host CPU beside UVA for {format_bytes(sum(m.nbytes for m in on_host))}")
    if pf:
        layers = decision.prefetched
        parts.append(f"prefetch of {layers} layers in {_slots(min(layers, decision.slots))}"
                     + (" and one layer spanning them" if spanned else ""))
    return (f"auto: the lowest predicted step for {_workload_text(workload)} on {hardware} that fits: "
            + " and ".join(parts))


def _on_host(move, host: frozenset[str], host_at: Collection[int] | None) -> bool:
    return move.kinds[0] in host and (host_at is None or move.position in host_at)


def notes(decision: AutoDecision, layer_names: Sequence[str], budget: int | None = None,
          host: frozenset[str] = frozenset(), host_at: Collection[int] | None = None) -> list[str]:
    """``budget``: the gpu_budget, for the note of a plan that offloads nothing; ``host``, ``host_at``: as
    ``reason``'s."""
    out = []
    if not decision.taken:
        out.append("strategy auto without a gpu_budget: nothing offloaded (give --gpu-budget)" if budget is None else
                   f"the whole model ({format_bytes(decision.peak_bound)}) fits the {format_bytes(budget)} "
                   "gpu_budget: nothing offloaded")
    by_kind: dict[str, list] = {}
    for m in decision.in_place():
        by_kind.setdefault((m.kinds[0], _on_host(m, host, host_at)), []).append(m)
    for (kind, shared), moves in by_kind.items():
        why = _WHY_UVA.get(kind, "reading it in place costs less than copying it for this workload")
        names = join_names((layer_names[m.position] for m in moves), 8)
        if shared:
            out.append(f"auto: {kind} of {names} in host memory ({format_bytes(sum(m.nbytes for m in moves))}), "
                       "shared expert by expert between the host CPU and GPU kernels reading them through UVA "
                       "(the cpu backend)")
            continue
        out.append(f"auto: {kind} of {names} read in place through UVA ({format_bytes(sum(m.nbytes for m in moves))}): "
                   f"{why}")
    pf = decision.moves_by("prefetch")
    if pf:
        positions = sorted({m.position for m in pf})
        names = join_names((layer_names[p] for p in positions), 8)
        kinds = sorted({k for m in pf for k in m.kinds})
        whole = "prefetched whole" if not (decision.prefer or decision.first or decision.greedy) else "prefetched"
        out.append(f"auto: {len(positions)} layers {whole} ({', '.join(kinds)}; {format_bytes(sum(m.nbytes for m in pf))}), "
                   f"spread evenly: {names}; copying them costs less than reading them through UVA for this workload")
        out += _slot_notes(decision)
    out += _unique_notes(decision, layer_names)
    out += _span_notes(decision, layer_names)
    out += _order_notes(decision)
    left = len(decision.order.moves) - decision.taken
    if decision.all_uva:
        out.append("auto: every eligible param read in place through UVA (no buffers): the plan of the path that "
                   "moves the most, taken when no plan moving less fits or predicts a faster step")
    elif decision.taken:
        passed = (f"; {decision.passed} plans moving less fit too, but one moving more predicts a faster step at no "
                  "higher peak" if decision.passed else "")
        out.append(f"auto: {decision.taken} of {len(decision.order.moves)} moves of a fixed order taken, the first "
                   f"plan of its path that fits and that no plan moving more beats{passed}; a larger budget takes no "
                   f"later plan of the same path, so no param moves from the GPU to the host and the predicted step "
                   f"never grows as the budget does ({left} moves not needed)")
    if decision.runner_up is not None:
        out.append(_runner_up(decision.runner_up))
    return out


def _runner_up(r: RunnerUp) -> str:
    what = f"strategy budget with {r.backend} ({format_bytes(r.offloaded_bytes)} offloaded)"
    return f"auto: runner-up {what}: predicted {r.step_ms:.1f} ms a step against {r.ours_ms:.1f} ms"


def _slots(n: int) -> str:
    return "1 slot" if n == 1 else f"{n} slots"


def _slot_notes(decision: AutoDecision) -> list[str]:
    """Why this many buffer slots: the predicted step against the other slot counts that fit."""
    if not decision.searched or decision.step_ms is None:
        return []
    k = min(decision.prefetched, decision.slots)
    if not decision.options:
        return [f"auto: {_slots(k)} ({decision.step_ms:.1f} ms predicted): no other slot count fits this budget"]
    others = "; ".join(f"{_slots(o.slots)}: {o.step_ms:.1f} ms with {o.taken} moves" for o in decision.options)
    faster = [o for o in decision.options if o.step_ms < decision.step_ms]
    why = ("the fastest that fits" if not faster else
           "a faster one would take a plan a smaller budget passes over, and a larger budget never moves a param "
           "to the host")
    return [f"auto: {_slots(k)} chosen by predicted step ({decision.step_ms:.1f} ms with {decision.taken} moves; "
            f"{others}): {why}; one slot less frees a slot's bytes, one more lets copies start earlier"]


def _order_notes(decision: AutoDecision) -> list[str]:
    """Which order of moves, and why that one."""
    if not decision.taken:
        return []
    tiers = f"{', then '.join(decision.prefer)}, then the other kinds" if decision.prefer else "every kind together"
    if decision.given_prefer:
        return [f"auto: offload.prefer orders the moves: {tiers}; within each, the cheapest per byte first"]
    w = decision.weighed
    if w is None:
        return []
    first = f", prefetching {', '.join(decision.first)} before the other kinds" if decision.first else ""
    which = ("the order of moves by least predicted cost per byte freed, each step advancing one kind's moves"
             if decision.greedy else f"the order of moves taking {tiers}{first} (within each, the cheapest per byte "
             "first)")
    return [f"auto: {which}, of "
            f"{w.orders} orders weighed at budgets from the lowest peak to the whole model: its plans predict at "
            f"most {100 * (w.worst - 1):.1f}% above the fastest order's at each; one order for every budget, so "
            "that a larger budget never moves a param from the GPU to the host"]


def _unique_notes(decision: AutoDecision, layer_names: Sequence[str]) -> list[str]:
    """Moved layers no other layer is like (an LM head, a final norm): why UVA rather than prefetch."""
    unique = [m for m in decision.in_place() if m.unique]
    if not unique:
        return []
    names = join_names((layer_names[m.position] for m in unique), 8)
    return [f"auto: {names} on UVA, not prefetched: no other layer shares {'its' if len(unique) == 1 else 'their'} "
            "buffers, so a prefetch buffer would be as large as the params it frees; resident until the budget "
            "needs their bytes, as their predicted cost per byte ranks them"]


def _span_notes(decision: AutoDecision, layer_names: Sequence[str]) -> list[str]:
    """The layer prefetched spanning the slots: why not UVA, and what it costs."""
    spanned = [m for m in decision.moves_by("uva") if decision.spanned(m)]
    if not spanned:
        return []
    name = layer_names[spanned[0].position]
    return [f"auto: {name} prefetched spanning the slots ({format_bytes(sum(m.nbytes for m in spanned))}): no other "
            "layer shares its buffers, so they lie over the slots' bytes instead of a buffer of their own; that "
            "predicts a faster step than reading it through UVA at this budget (its copy cannot overlap the "
            "layers that use the slots)"]
