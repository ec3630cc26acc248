"""strategy group: vLLM's rule (``planner.layers.group_rule``), the last ``k`` of every ``g`` block-stack layers.

The group is an order of one step, all of its layers, on each backend the request allows (backend
auto: prefetch, then UVA, the same params at a lower peak), taken by ``fit.choose`` (planner/strategy/fit.py):
the backend that fits and predicts the faster step. The group never depends on the budget, so a
larger budget never moves a param from the GPU to the host nor predicts a slower step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.errors import InfeasibleError
from schemas.kinds import param_kind
from planner.strategy.choice import Choice
from planner.cost.placement import PlacementCost
from planner.strategy.fit import Chosen, Reckoning, Speed, choose
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
           slots: int, cost: PlacementCost) -> Choice:
    """The group's plan on the requested backend; with backend auto, by predicted time (``cost``): prefetch
    unless UVA fits and predicts a faster step. InfeasibleError when none fits the GPU budget. The CPU
    budget is checked on the plan made (planner/build.py)."""
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
    ms = {b: cost.step_ms(plans[b], slots) for b in backends}
    reckon = Reckoning(peak=lambda b: (total_bytes - offloaded + pools[b], offloaded))
    found = choose(backends, reckon, gpu_budget, None, Speed(step_ms=ms.__getitem__, moves=lambda b: 0))
    if not isinstance(found, Chosen):
        needs = tuple(Need(b, reckon.peak(b)[0], len(chosen)) for b in backends)
        raise InfeasibleError(Infeasible("no_plan", gpu_budget, cpu_budget, min(n.peak for n in needs), strategy="group",
                                         requested=None if requested == "auto" else requested, needs=needs))
    backend = found.step
    other = [b for b in backends if b != backend]
    if requested != "auto":
        why = "requested"
    elif backend == "prefetch":
        why = "prefetch_faster"
    else:
        fits = gpu_budget is None or reckon.peak("prefetch")[0] <= gpu_budget
        why = "uva_faster" if fits else "uva_fits"
    return Choice("group", backend, why, plans[backend], found.peak, pools[backend], offloaded, slots,
                  alternative=reckon.peak(other[0])[0] if other else None, chosen=positions, step_ms=ms[backend],
                  other_ms=ms[other[0]] if other else None)
