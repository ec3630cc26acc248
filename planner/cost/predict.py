"""A plan's predicted cost: per workload, one simulated forward (``planner.cost.timeline``), with the layer graphs as
the plan is applied with them (``schemas.expert_graphs.graphs_on``: its memory section says)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from schemas.expert_graphs import graphs_on
from schemas.hardware import HardwareProfile
from schemas.plan import Plan
from schemas.prediction import Prediction, Predictions
from schemas.fields import MILLISECONDS
from schemas.workload import Workload

from planner.cost.host_experts import split_work
from planner.errors import PlanningError
from planner.cost.block import ONE, Sequences, sequences_of
from planner.cost.layer import layers_work, model_cpu_ms, profile_for
from planner.cost.link import link_share
from planner.cost.timeline import Copy, Timeline, simulate


def copies_of(plan: Plan) -> list[Copy]:
    """The prefetch copies of a plan's forward, by position (a layer copied once, at apply time, has none)."""
    position = {layer.name: i for i, layer in enumerate(plan.layers)}
    return [Copy(i, position[layer.prefetch.copy_before], layer.prefetch.previous_forward)
            for i, layer in enumerate(plan.layers) if layer.prefetch is not None and not layer.prefetch.once]


def timeline(plan: Plan, hw: HardwareProfile, tokens: int, seqs: Sequences = ONE, routing=None) -> Timeline:
    """One forward of ``plan`` at ``tokens`` (in ``seqs``) on ``hw``; ``routing``: layer name -> each expert's
    chance of being picked by a token (measured routing), for every MoE layer: whole (planner/cost/layer.py) or
    with its experts split (planner/cost/host_experts.py). Eager experts calls replay the layer graphs where the
    plan runs with them (``graphs_on``)."""
    graphs = graphs_on(plan.memory)
    work = layers_work(plan.layers, tokens, hw, seqs, routing, graphs)
    for i, layer in enumerate(plan.layers):
        if layer.prefetch is not None and layer.prefetch.once:  # its slot keeps it: nothing to copy
            work[i] = replace(work[i], copy_ms=0.0, copy_bytes=0)
        if layer.experts is not None:
            work[i] = split_work(layer, tokens, hw, (routing or {}).get(layer.name), seqs, graphs)
    return simulate(work, copies_of(plan), link_share(hw), model_cpu_ms(hw))


def plan_sequences(plan: Plan, name: str, tokens: int) -> Sequences:
    """The sequences of the plan's forward ``name`` at ``tokens``, as its memory section records them (a
    forward the plan does not record at these tokens: one sequence, no context), run in the mode its
    prediction of ``name`` assumed."""
    predicted = next((w for w in plan.predictions.workloads if w.workload == name), None) if plan.predictions else None
    captured = predicted is not None and predicted.mode == "graph"
    f = plan.memory.forward(name) if plan.memory is not None else None
    if f is None or f.tokens != tokens:
        return Sequences(captured=captured)
    context = max(0, f.context - -(-f.tokens // f.batch)) if f.context else 0
    return Sequences(f.batch, context, captured)


def in_range(t: Timeline, workload: str, hw: HardwareProfile) -> None:
    """A prediction is written only with figures a plan file can hold: finite, at most a day
    (PlanningError naming the figure otherwise; figures of profiles in range keep to this)."""
    for what in ("step_ms", "compute_ms", "copy_ms", "stall_ms", "cpu_ms"):
        value = getattr(t, what)
        try:
            MILLISECONDS.check(value)
        except ValueError as err:
            raise PlanningError(f"the predicted {what} of workload '{workload}' on the hardware profile "
                                f"'{hw.name}' {err}; check the profile's figures against the machine") from None


def weighted_step_ms(rows: Sequence[tuple[float, float]]) -> float:
    """A plan's weighted step (as its predictions write it) from its workloads' (step_ms as written, weight)."""
    scale = max(1.0, *(weight for _, weight in rows))  # shares are relative: weights up to 1.8e308 each never overflow
    total = sum(weight / scale for _, weight in rows)
    return round(sum(step * (weight / scale) for step, weight in rows) / total, 4)


def prediction_rows(timelines: Sequence[Timeline], workload: Workload, hw: HardwareProfile) -> list[Prediction]:
    """One row per workload item from its simulated forward (checked by ``in_range``)."""
    rows = []
    for (name, item), t in zip(workload.items(), timelines):
        in_range(t, name, hw)
        rows.append(Prediction(workload=name, tokens=item.rows, weight=item.weight, mode=item.mode,
                               step_ms=round(t.step_ms, 4), compute_ms=round(t.compute_ms, 4),
                               copy_ms=round(t.copy_ms, 4), stall_ms=round(t.stall_ms, 4),
                               cpu_ms=round(t.cpu_ms, 4), bound=t.bound))
    return rows


def predict(plan: Plan, hw: HardwareProfile, workload: Workload, routing=None) -> Predictions:
    timelines = [timeline(plan, profile_for(hw, item.mode), item.rows, sequences_of(item, name), routing)
                 for name, item in workload.items()]
    rows = prediction_rows(timelines, workload, hw)
    return Predictions(hardware=hw.name, hardware_source=hw.source, profile=hw, workloads=rows,
                       weighted_step_ms=weighted_step_ms([(r.step_ms, r.weight) for r in rows]),
                       offloaded_layers=sum(1 for layer in plan.layers if layer.offloaded))
