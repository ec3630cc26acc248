"""strategy auto, in words: why each group of params went where it went, and the runner-up."""

from __future__ import annotations

from collections.abc import Sequence

from planner.decide_auto import AutoDecision
from planner.names import join_names
from schemas.sizes import format_bytes
from schemas.workload import Workload

_WHY_UVA = {
    "embedding": "an embedding lookup reads only the rows of the tokens",
    "routed_experts": "a batch reads only the experts it routes to",
}


def _workload_text(workload: Workload) -> str:
    return ", ".join(f"{name} ({item.tokens} token{'s' if item.tokens != 1 else ''}"
                     + (f", weight {item.weight:g}" if len(workload.root) > 1 else "") + ")"
                     for name, item in workload.items())


def reason(decision: AutoDecision, workload: Workload, hardware: str, budget: int | None) -> str:
    if not decision.taken:
        fits = "no gpu_budget given" if budget is None else f"the whole model fits the {format_bytes(budget)} gpu_budget"
        return f"auto: {fits}: nothing is offloaded"
    uva, pf = decision.moves_by("uva"), decision.moves_by("prefetch")
    parts = []
    if uva:
        parts.append(f"UVA for {format_bytes(sum(m.nbytes for m in uva))}")
    if pf:
        parts.append(f"prefetch of {len(pf)} layers in {min(len(pf), decision.slots)} slots")
    return (f"auto: the lowest predicted step for {_workload_text(workload)} on {hardware} that fits: "
            + " and ".join(parts))


def notes(decision: AutoDecision, layer_names: Sequence[str], runner_up: tuple[str, float, float] | None,
          budget: int | None = None) -> list[str]:
    """``runner_up``: (its description, its predicted weighted step ms, the chosen plan's);
    ``budget``: the gpu_budget, for the note of a plan that offloads nothing."""
    out = []
    if not decision.taken:
        out.append("strategy auto without a gpu_budget: nothing offloaded (give --gpu-budget)" if budget is None else
                   f"the whole model ({format_bytes(decision.peak_bound)}) fits the {format_bytes(budget)} "
                   "gpu_budget: nothing offloaded")
    by_kind: dict[str, list] = {}
    for m in decision.moves_by("uva"):
        by_kind.setdefault(m.kinds[0], []).append(m)
    for kind, moves in by_kind.items():
        why = _WHY_UVA.get(kind, "reading it in place costs less than copying it for this workload")
        names = join_names((layer_names[m.position] for m in moves), 8)
        out.append(f"auto: {kind} of {names} read in place through UVA ({format_bytes(sum(m.nbytes for m in moves))}): "
                   f"{why}")
    pf = decision.moves_by("prefetch")
    if pf:
        names = join_names(sorted((layer_names[m.position] for m in pf), key=layer_names.index), 8)
        kinds = sorted({k for m in pf for k in m.kinds})
        out.append(f"auto: {len(pf)} layers prefetched whole ({', '.join(kinds)}; {format_bytes(sum(m.nbytes for m in pf))}), "
                   f"spread evenly: {names}; copying them costs less than reading them through UVA for this workload")
    left = len(decision.order.moves) - decision.taken
    if decision.all_uva:
        out.append("auto: the budget is below the smallest prefetch buffer pool, so every eligible param is read in "
                   "place through UVA (no buffers); a larger budget prefetches layers instead")
    elif decision.taken:
        out.append(f"auto: the first {decision.taken} of {len(decision.order.moves)} moves in a fixed order (cheapest per "
                   f"byte first) fit; a larger budget takes a shorter prefix of the same order, so no param moves from "
                   f"the GPU to the host when the budget grows ({left} moves not needed)")
    if runner_up is not None:
        what, theirs, ours = runner_up
        out.append(f"auto: runner-up {what}: predicted {theirs:.1f} ms a step against {ours:.1f} ms")
    return out
