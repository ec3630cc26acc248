"""auto_order.greedy_order: the moves by marginal predicted cost per byte freed, one nested order."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from planner.build import _merge, _model
from planner.cost.placement import PlacementCost
from planner.layers import eligible_params
from planner.memory.parts import weights_budget
from planner.strategy.auto_order import GREEDY_MOST_LAYERS, build_order, candidate_prefers, greedy_order
from planner.strategy.auto_slots import AutoPath
from schemas import load_spec
from schemas.hardware import load_hardware
from schemas.hardware_profile import HostRatePoint
from schemas.workload import Workload, WorkloadItem

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

import bench_search  # noqa: E402

HW = load_hardware("h200")
# the H200's host as torch.bmm's padded pass ran it (the profile's host figures before runtime/host_matmul.c, whose
# faster host makes the tiered orders win at every budget of the greedy order's test below)
BMM_HOST = HW.model_copy(update={"host_expert_gbps": [HostRatePoint(tokens=1, gbps=40.0), HostRatePoint(tokens=2, gbps=55.0)],
                                 "host_expert_us": 74.0, "host_link_share": 0.85})
DECODE = Workload({"decode": WorkloadItem(tokens=1)})


def _setting(name: str, workload: Workload):
    """The spec's layers, eligible params, the orders' tiers, its bytes and the placement cost auto weighs with."""
    spec = load_spec(ROOT / "examples" / "generated" / f"{name}.yaml")
    memory, offload = _merge(spec, {}, {"strategy": "auto"})
    m = _model(spec, memory, offload, HW, workload)
    eligible = {layer.index: eligible_params(layer, offload.params, m.shared.get(layer.name, set()), offload.kinds)
                for layer in m.layers}
    tiers = candidate_prefers(m.layers, eligible)
    large = tuple(dict.fromkeys(k for _, first in tiers for k in first))
    return spec, m, eligible, tiers, large


def _step_at(m, order, uva, budget: int) -> float:
    path = AutoPath(m.layers, order, m.total_bytes, m.cost, None, uva)
    return path.step_ms(path.choose(budget, None).step)


def test_greedy_order_reaches_the_searched_best_where_the_tiered_orders_miss():
    """Llama-3-8B, decode, 75% of its bytes: the searched best reads the embedding and the LM head through UVA and
    prefetches 26 layers' attention in 2 slots. Orders by tier take every attention move before the head (the head
    costs more per byte than a copy once the link is full); the greedy order takes the head once the link can no
    longer hide the copies, and its path holds a plan at least as fast as the search's."""
    spec, m, eligible, tiers, large = _setting("llama-3-8b", DECODE)
    budget = weights_budget(int(m.total_bytes * 0.75), bench_search.Space(spec).sizes.plan_memory(DECODE, HW))
    space = bench_search.Space(spec, slots=(1, 2), kinds=("attention",))
    best_ms, label, _ = bench_search.best(space, budget, PlacementCost(space.layers, HW, DECODE))
    assert "lm_head on UVA" in label and "2 slots" in label, label
    uva = build_order(m.layers, eligible, HW, DECODE, None, {}, "uva", ())
    base = build_order(m.layers, eligible, HW, DECODE, None, {}, None, (), large)
    greedy = greedy_order(m.layers, base, m.cost, m.total_bytes, len(large))
    assert greedy is not None and Counter(greedy.moves) == Counter(base.moves)  # the same moves, re-ordered
    assert _step_at(m, greedy, uva, budget) <= best_ms
    for prefer, first in tiers:
        if not prefer:  # the embedding tier puts the head first: at a larger budget that costs 60% (auto.py)
            order = build_order(m.layers, eligible, HW, DECODE, None, {}, None, prefer, first)
            assert _step_at(m, order, uva, budget) > 1.02 * best_ms, first


def test_greedy_order_interleaves_the_head_between_attention_moves():
    _, m, eligible, _, large = _setting("llama-3-8b", DECODE)
    base = build_order(m.layers, eligible, HW, DECODE, None, {}, None, (), large)
    greedy = greedy_order(m.layers, base, m.cost, m.total_bytes, len(large))
    assert greedy is not None
    names = [m.layers[move.position].name for move in greedy.moves]
    kinds = [move.kinds for move in greedy.moves]
    head = names.index("lm_head")
    attention = [i for i, k in enumerate(kinds) if k == ("attention",)]
    assert names[0] == "model.embed_tokens"  # read in place at decode: no step time for its bytes
    assert attention[0] < head < attention[-1]


def test_no_greedy_order_for_very_many_layers():
    from bench.synthetic_spec import synthetic_spec_text  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(synthetic_spec_text(GREEDY_MOST_LAYERS + 1, 2, hidden=64, gpu_budget="1GiB"))
    spec = load_spec(f.name)
    memory, offload = _merge(spec, {}, {"strategy": "auto"})
    m = _model(spec, memory, offload, HW, DECODE)
    eligible = {layer.index: eligible_params(layer, None, set()) for layer in m.layers}
    base = build_order(m.layers, eligible, HW, DECODE, None, {}, None, (), ("dense_mlp",))
    assert len(m.layers) > GREEDY_MOST_LAYERS and base.moves
    assert greedy_order(m.layers, base, m.cost, m.total_bytes, 1) is None


def test_auto_keeps_the_greedy_order_where_it_is_closest_to_the_fastest(monkeypatch):
    """Qwen3-30B-A3B at decode of 32 tokens, 75% of its bytes (the host computing experts): auto weighs the greedy
    order with the tiered ones, keeps it, says so, and its plan predicts faster than the best tiered order's."""
    import planner
    from planner.strategy import auto

    spec = load_spec(ROOT / "examples" / "generated" / "qwen3-30b-a3b.yaml")
    budget = int(sum(layer.nbytes for layer in spec.model.expanded()) * 0.75)
    workload = Workload({"decode32": WorkloadItem(tokens=32)})
    plan = planner.plan(spec, gpu_budget=budget, workload=workload, hardware=BMM_HOST)
    assert any("by least predicted cost per byte freed" in note for note in plan.summary.notes)
    monkeypatch.setattr(auto, "greedy_order", lambda *args, **kwargs: None)
    tiered = planner.plan(spec, gpu_budget=budget, workload=workload, hardware=BMM_HOST)
    assert not any("by least predicted cost per byte freed" in note for note in tiered.summary.notes)
    assert plan.predictions.weighted_step_ms < tiered.predictions.weighted_step_ms


def test_the_greedy_order_is_weighed_on_a_grid_fine_enough_to_see_its_holes(monkeypatch):
    """With the 2026-12-02 profile as it was before it gained ``matmul_gbps_rows`` (with them the coarse grid no
    longer keeps the greedy order at this budget), 8 grid budgets kept the greedy order for the Llama-3-8B shape's decode, whose plan at 13.55 GB predicts 1.63x the
    attention-first order's; weighed at GREEDY_GRID budgets it is not kept."""
    import planner
    import planner.strategy.auto as auto

    hw = HW.model_copy(update={"matmul_gbps_rows": None})
    spec = load_spec(ROOT / "examples" / "generated" / "llama-3-8b.yaml")
    kept = planner.plan(spec, gpu_budget=13_550_000_000, workload=DECODE, hardware=hw).predictions.weighted_step_ms
    monkeypatch.setattr(auto, "GREEDY_GRID", auto.GRID)
    monkeypatch.setattr(auto, "NEAR", -1.0)  # no near ties told apart on a finer grid (which also finds the hole)
    coarse = planner.plan(spec, gpu_budget=13_550_000_000, workload=DECODE, hardware=hw).predictions.weighted_step_ms
    assert kept * 1.5 < coarse
    monkeypatch.setattr(auto, "NEAR", 0.005)
    closer = planner.plan(spec, gpu_budget=13_550_000_000, workload=DECODE, hardware=hw).predictions.weighted_step_ms
    assert closer * 1.5 < coarse
