"""A plan's predicted cost: per workload, one simulated forward (``planner.cost.timeline``).

A forward that keeps a KV cache (a context in the plan's memory section) also reads it: each attention
layer reads its part of ``batch x context x kv_bytes_per_token`` from GPU memory (SDPA attention of a
decode step is bound by that read), split evenly over the layers with attention params.
"""

from __future__ import annotations

from schemas.hardware import HardwareProfile
from schemas.plan import Plan
from schemas.prediction import Prediction, Predictions
from schemas.reals import MILLISECONDS
from schemas.workload import Workload, batch_of

from planner.errors import PlanningError
from planner.cost.layer import attention_positions, layers_work, profile_for, read_kv
from planner.cost.timeline import Copy, Timeline, simulate


def copies_of(plan: Plan) -> list[Copy]:
    """The prefetch copies of a plan, by position."""
    position = {layer.name: i for i, layer in enumerate(plan.layers)}
    return [Copy(i, position[layer.prefetch.copy_before], layer.prefetch.previous_forward)
            for i, layer in enumerate(plan.layers) if layer.prefetch is not None]


def timeline(plan: Plan, hw: HardwareProfile, tokens: int, kv_read: int = 0) -> Timeline:
    """One forward of ``plan`` at ``tokens`` on ``hw``, reading ``kv_read`` bytes of KV cache."""
    work = layers_work(plan.layers, tokens, hw)
    if kv_read:
        read_kv(work, attention_positions(plan.layers), kv_read, hw)
    return simulate(work, copies_of(plan))


def kv_read(plan: Plan, name: str, item) -> int:
    """Bytes of KV cache forward ``name`` reads: its sequences' contexts (none without a memory section)."""
    mem = plan.memory
    if mem is None or not item.context or not mem.kv_bytes_per_token:
        return 0
    return batch_of(name, item) * item.context * mem.kv_bytes_per_token


def _in_range(t: Timeline, workload: str, hw: HardwareProfile) -> None:
    """A prediction is written only with figures a plan file can hold: finite, at most a day
    (PlanningError naming the figure otherwise; figures of profiles in range keep to this)."""
    for what in ("step_ms", "compute_ms", "copy_ms", "stall_ms", "cpu_ms"):
        value = getattr(t, what)
        try:
            MILLISECONDS.check(value)
        except ValueError as err:
            raise PlanningError(f"the predicted {what} of workload '{workload}' on the hardware profile "
                                f"'{hw.name}' {err}; check the profile's figures against the machine") from None


def predict(plan: Plan, hw: HardwareProfile, workload: Workload) -> Predictions:
    rows = []
    for name, item in workload.items():
        t = timeline(plan, profile_for(hw, item.mode), item.rows, kv_read(plan, name, item))
        _in_range(t, name, hw)
        rows.append(Prediction(workload=name, tokens=item.rows, weight=item.weight, mode=item.mode,
                               step_ms=round(t.step_ms, 4), compute_ms=round(t.compute_ms, 4),
                               copy_ms=round(t.copy_ms, 4), stall_ms=round(t.stall_ms, 4),
                               cpu_ms=round(t.cpu_ms, 4), bound=t.bound))
    scale = max(1.0, *(r.weight for r in rows))  # shares are relative: weights up to 1.8e308 each never overflow
    total = sum(r.weight / scale for r in rows)
    weighted = sum(r.step_ms * (r.weight / scale) for r in rows) / total
    return Predictions(hardware=hw.name, hardware_source=hw.source, profile=hw, workloads=rows,
                       weighted_step_ms=round(weighted, 4),
                       offloaded_layers=sum(1 for layer in plan.layers if layer.offloaded))
