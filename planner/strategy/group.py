"""strategy group: vLLM's rule (``planner.layers.group_rule``), the last ``k`` of every ``g`` block-stack layers.

The group is an order of one step, all of its layers, tried on each backend the request allows
(backend auto: prefetch, then UVA) through the prefix fit (planner/strategy/fit.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.errors import InfeasibleError
from planner.kinds import param_kind
from planner.strategy.choice import Choice
from planner.strategy.fit import Fit, Reckoning, first_fit
from planner.strategy.infeasible import Infeasible, Need
from planner.strategy.peaks import exact_pool
from schemas.spec import Layer, Tensor


def placed(layers: Sequence[Layer], chosen: Sequence[tuple[int, Sequence[Tensor]]], base: str,
           forced: Mapping[str, str]) -> dict[int, dict[str, str]]:
    """Position -> param -> backend: the ``chosen`` (position, params) on ``base``, a kind ``forced`` lists on its own."""
    out: dict[int, dict[str, str]] = {}
    for position, params in chosen:
        name = layers[position].name
        out[position] = {t.name: forced.get(param_kind(name, t.name, t.kind), base) if forced else base
                         for t in params}
    return out


def decide(layers: Sequence[Layer], chosen: Sequence[tuple[int, Sequence[Tensor]]], *, total_bytes: int,
           gpu_budget: int | None, cpu_budget: int | None, requested: str, forced: Mapping[str, str],
           slots: int) -> Choice:
    """The group's plan on the requested backend (auto: prefetch if it fits, else UVA); InfeasibleError
    when none fits the GPU budget. The CPU budget is checked on the plan made (planner/build.py)."""
    positions = tuple(p for p, _ in chosen)
    if not chosen:
        if gpu_budget is not None and total_bytes > gpu_budget:
            raise InfeasibleError(Infeasible("nothing_to_offload", gpu_budget, None, total_bytes, strategy="group",
                                             total_bytes=total_bytes, why_nothing="group"))
        return Choice("group", "none", "group_empty")
    backends = ["prefetch", "uva"] if requested == "auto" else [requested]
    plans = {b: placed(layers, chosen, b, forced) for b in backends}
    offloaded = sum(t.nbytes for _, params in chosen for t in params)
    pools = {b: exact_pool(layers, plans[b], slots) for b in backends}
    reckon = Reckoning(peak=lambda b: (total_bytes - offloaded + pools[b], offloaded))
    found = first_fit(backends, reckon, gpu_budget, None)
    if not isinstance(found, Fit):
        needs = tuple(Need(b, reckon.peak(b)[0], len(chosen)) for b in backends)
        raise InfeasibleError(Infeasible("no_plan", gpu_budget, cpu_budget, min(n.peak for n in needs), strategy="group",
                                         requested=None if requested == "auto" else requested, needs=needs))
    backend = found.step
    if requested != "auto":
        why = "requested"
    elif gpu_budget is None:
        why = "no_budget"
    else:
        why = "prefetch_fits" if backend == "prefetch" else "uva_fits"
    return Choice("group", backend, why, plans[backend], found.peak, pools[backend], offloaded, slots,
                  alternative=pools["prefetch"] if why == "uva_fits" else None, chosen=positions)
