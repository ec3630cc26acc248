"""The forward without copies that strategy auto's search prunes by (``PlacementCost._without_copies``) is
``simulate``'s step to the last bit, walked on the compute stream and the CPU alone where it may be."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.layer import LayerWork
from planner.cost.placement import PlacementCost
from planner.cost.timeline import simulate
from schemas.hardware import load_hardware
from schemas.workload import Workload, WorkloadItem

MS = st.floats(min_value=0.0, max_value=50.0, allow_nan=False)


@st.composite
def works(draw):
    out = []
    for _ in range(draw(st.integers(1, 40))):
        gpu, cpu, link = draw(MS), draw(MS), draw(st.sampled_from([0.0, 0.5, 3.0]))
        kind = draw(st.sampled_from(["plain", "plain", "synced", "host"]))
        if kind == "synced":
            out.append(LayerWork(gpu + 1.0, cpu + 1.0, 0.0, 0, synced_gpu_ms=1.0, synced_cpu_ms=0.5,
                                 uva_link_ms=link, synced_uva_link_ms=link / 2))
        elif kind == "host":
            out.append(LayerWork(gpu + 1.0, cpu, 0.0, 0, host_ms=draw(MS), beside_ms=1.0, joined_ms=draw(MS)))
        else:
            out.append(LayerWork(gpu, cpu, draw(MS), 1, uva_link_ms=link))
    return out


COST = PlacementCost([], load_hardware("h200"), Workload({"decode": WorkloadItem(tokens=1)}))


@settings(max_examples=200, deadline=None)
@given(works(), st.sampled_from([0.0, 0.0, 2.3, 7.77]))
def test_the_forward_without_copies_is_the_simulated_one(work, cpu_start):
    """Also where the CPU's clock starts later (the model's own work outside its layers, ``model_cpu_us``)."""
    assert COST._without_copies(work, cpu_start) == simulate(work, (), COST._link, cpu_start).step_ms


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(MS, MS), min_size=1, max_size=60), st.sampled_from([0.0, 1.5]))
def test_dense_forwards_take_the_walk(pairs, cpu_start):
    work = [LayerWork(g, c, 0.0, 0) for g, c in pairs]
    assert COST._without_copies(work, cpu_start) == simulate(work, (), COST._link, cpu_start).step_ms
