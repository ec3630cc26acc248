"""The cost of a layer whose experts are split by expert (planner/cost/host_experts.py)."""

from __future__ import annotations

import pytest

from dataclasses import replace

from planner.cost.host_experts import cpu_max_tokens, expected_max, split_work
from planner.cost.timeline import simulate
from planner.cost.host_split import balanced, plan_layer
from schemas.hardware import load_hardware
from schemas.plan_content import PlanLayer, PlanParam
from schemas.plan_experts import ExpertSplit
from schemas.spec_layers import Layer, MoeSpec, Tensor
from schemas.workload import Workload, WorkloadItem

E, K = 128, 8
HW = load_hardware("h200")


def layer(**places) -> PlanLayer:
    """A Qwen3-MoE-shaped layer (hidden 2048, expert width 768) split as ``places`` says."""
    params = {"attn.q_proj.weight": PlanParam(shape=[4096, 2048], dtype="bfloat16", bytes=4096 * 2048 * 2),
              "mlp.experts.gate_up_proj": PlanParam(shape=[E, 1536, 2048], dtype="bfloat16", bytes=E * 1536 * 2048 * 2),
              "mlp.experts.down_proj": PlanParam(shape=[E, 2048, 768], dtype="bfloat16", bytes=E * 2048 * 768 * 2)}
    split = ExpertSplit(params=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], **places)
    return PlanLayer.model_construct(name="model.layers.0", params=params, offloaded=list(split.params), uva=[],
                                     tied={}, moe=MoeSpec(experts=E, top_k=K), experts=split, prefetch=None)


def test_hot_experts_that_take_the_tokens_cut_the_link_time():
    hot = list(range(26))
    split = layer(gpu=hot, uva=list(range(26, E)))
    uniform = split_work(split, 1, HW)
    skewed = [0.8 * K / 26 if e in hot else 0.2 * K / (E - 26) for e in range(E)]
    measured = split_work(split, 1, HW, skewed)
    assert measured.gpu_ms < 0.5 * uniform.gpu_ms
    assert measured.synced_gpu_ms is None  # no host part: nothing to wait for mid-layer


def test_a_split_layer_costs_the_cpu_the_launches_its_parts_add():
    """Launched (above GRAPHED_MAX_TOKENS): GPU parts share one pass (3 launches a part after the first), the host's
    part adds its hand-off, and the host's experts read through UVA above cpu_max_tokens a pass of their own
    (planner/cost/host_experts.py). At most GRAPHED_MAX_TOKENS with no host part, the experts call is replayed from
    a CUDA graph: the module's call and the parts' launches are replaced by the graph's few, in eager mode only."""
    from planner.cost.host_experts import GPU_PART_LAUNCHES, HOST_PART_LAUNCHES, OWN_PASS_LAUNCHES
    from planner.cost.layer import EXPERTS_CALL_LAUNCHES, GRAPH_CALL_LAUNCHES, profile_for
    from schemas.expert_graphs import GRAPHED_MAX_TOKENS

    block = HW.moe_block_cpu_us / 1e3
    launch = HW.launch_us / 1e3
    launched = GRAPHED_MAX_TOKENS + 1
    two = layer(gpu=list(range(26)), uva=list(range(26, E)))
    assert split_work(layer(uva=list(range(E))), launched, HW).cpu_ms == pytest.approx(block)
    assert split_work(two, launched, HW).cpu_ms == pytest.approx(block + GPU_PART_LAUNCHES * launch)
    three = dict(gpu=list(range(26)), uva=list(range(26, 64)), cpu=list(range(64, E)))
    assert split_work(layer(**three), 32, HW).cpu_ms == pytest.approx(
        block + (GPU_PART_LAUNCHES + HOST_PART_LAUNCHES) * launch)  # the host's part: not graphed
    beyond = layer(**three, cpu_max_tokens=16)
    assert split_work(beyond, launched, HW).cpu_ms == pytest.approx(
        block + (GPU_PART_LAUNCHES + OWN_PASS_LAUNCHES) * launch)
    graphed_ms = block + (GRAPH_CALL_LAUNCHES - EXPERTS_CALL_LAUNCHES) * launch
    for split, tokens in ((two, 1), (two, GRAPHED_MAX_TOKENS), (layer(uva=list(range(E))), 8), (beyond, 32)):
        assert split_work(split, tokens, HW).cpu_ms == pytest.approx(graphed_ms)
    assert 0 < graphed_ms < block
    assert split_work(two, 1, profile_for(HW, "graph")).cpu_ms == 0  # replayed whole: no issue time at all


def test_a_host_slower_than_the_link_for_all_its_experts_is_priced_bypassed():
    """The runtime's guard sends a split layer's host experts through UVA where the host's part takes longer than
    the GPU reading every host-memory expert (runtime/host_guard.py): the planner prices such a call as that level
    0 (the host's experts on UVA, the call replayed from a graph), and a call where the host is faster as the
    split; a split without uva experts has no guard and keeps its host part."""
    from planner.cost.host_experts import ExpertShape, bypassed, chances, host_part_ms

    three = dict(gpu=list(range(26)), uva=list(range(26, 64)), cpu=list(range(64, E)))
    level0 = layer(gpu=list(range(26)), uva=list(range(26, E)))
    split = layer(**three)
    q = chances(split.experts, ExpertShape.of(split), None)
    assert bypassed(q, 1, ExpertShape.of(split), HW) and not bypassed(q, 32, ExpertShape.of(split), HW)
    assert split_work(split, 1, HW) == split_work(level0, 1, HW)
    assert split_work(split, 32, HW).host_ms > 0
    no_guard = layer(gpu=list(range(64)), cpu=list(range(64, E)))
    shape = ExpertShape.of(no_guard)
    assert split_work(no_guard, 1, HW).host_ms == pytest.approx(
        host_part_ms(chances(no_guard.experts, shape, None)["cpu"], 1, shape, HW, False))


def test_a_split_layer_whose_experts_module_offloads_more_is_priced_launched():
    """The runtime does not graph a layer whose experts module has another tensor offloaded (its place may move
    between calls): the planner prices it launched, by the same rule (schemas.expert_graphs.graphed)."""
    from planner.cost.host_experts import GPU_PART_LAUNCHES
    from schemas.expert_graphs import graphed

    two = layer(gpu=list(range(26)), uva=list(range(26, E)))
    parent = two.experts.params[0].rpartition(".")[0]
    beside = two.model_copy(update={"offloaded": [*two.offloaded, f"{parent}.norm.weight"]})
    assert graphed(two, 1) and not graphed(beside, 1)
    assert split_work(beside, 1, HW).cpu_ms == pytest.approx((HW.moe_block_cpu_us + GPU_PART_LAUNCHES *
                                                                HW.launch_us) / 1e3)


def test_the_host_part_runs_beside_the_gpu_parts_and_joins():
    work = split_work(layer(uva=list(range(64)), cpu=list(range(64, E))), 32, HW)
    assert work.host_ms > 0 and 0 < work.beside_ms < work.gpu_ms  # the UVA part runs beside the host's thread
    assert work.synced_gpu_ms is None  # the issuing CPU does not wait for the host
    assert work.cpu_ms < work.host_ms  # issue time only: the host's experts are on their own thread
    assert max(work.beside_ms, work.host_ms) <= work.joined_ms <= 1.05 * max(work.beside_ms, work.host_ms)
    assert work.alone_ms() == pytest.approx(work.gpu_ms - work.beside_ms + work.joined_ms)
    alone = split_work(layer(cpu=list(range(E))), 32, HW)
    assert alone.host_ms > work.host_ms  # twice the experts on the host, alone on host memory


def test_the_next_layers_issue_overlaps_the_host_and_the_stream_waits_for_it():
    work = split_work(layer(uva=list(range(64)), cpu=list(range(64, E))), 32, HW)
    own = work.gpu_ms - work.beside_ms  # the layer's own kernels, before the experts
    assert work.cpu_ms > own
    # the first layer waits for its issue; after it each layer is its own kernels, then the host and the link at
    # once: the next layers' issue time (2.4 ms each) is hidden behind the host's part, never added to it
    for host_ms in (work.host_ms, 3 * work.host_ms):
        w = replace(work, host_ms=host_ms)
        per_layer = own + max(w.joined_ms, host_ms)
        assert simulate([w] * 4, []).step_ms == pytest.approx(w.cpu_ms + 4 * per_layer - own)


def test_with_few_tokens_the_layer_waits_for_the_part_the_routing_makes_slower():
    """One token of a Mixtral-shaped layer (8 experts, top-2) split 4 / 4: it may pick both experts on one side."""
    params = {"mlp.experts.gate_up_proj": PlanParam(shape=[8, 2 * 14336, 4096], dtype="bfloat16",
                                                    bytes=8 * 2 * 14336 * 4096 * 2),
              "mlp.experts.down_proj": PlanParam(shape=[8, 4096, 14336], dtype="bfloat16", bytes=8 * 4096 * 14336 * 2)}
    split = ExpertSplit(params=list(params), uva=[0, 1, 2, 3], cpu=[4, 5, 6, 7])
    mixtral = PlanLayer.model_construct(name="model.layers.0", params=params, offloaded=list(params), uva=[],
                                        tied={}, moe=MoeSpec(experts=8, top_k=2), experts=split, prefetch=None)
    work = split_work(mixtral, 1, HW)
    assert work.joined_ms > 1.1 * max(work.beside_ms, work.host_ms)
    assert expected_max(3.0, 0.0, 5.0, 0.0) == 5.0 and expected_max(4.0, 1.0, 4.0, 1.0) > 4.5


def test_the_balanced_split_has_the_host_and_the_link_finish_together():
    params = tuple(Tensor(name, shape, "bfloat16", None, False, 2 * E * shape[1] * shape[2], "routed_experts")
                   for name, shape in (("mlp.experts.gate_up_proj", (E, 1536, 2048)),
                                       ("mlp.experts.down_proj", (E, 2048, 768))))
    spec_layer = Layer("model.layers.0", 0, params, moe=MoeSpec(experts=E, top_k=K))
    whole = ExpertSplit(params=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], cpu=list(range(E)))
    split = balanced(spec_layer, whole, HW, Workload({"step": WorkloadItem(tokens=32)}))
    assert 0 < len(split.cpu) < E and len(split.cpu) + len(split.uva) == E
    work = split_work(plan_layer(spec_layer, split), 32, HW)
    one_expert = 3 * 768 * 2048 * 2 / (HW.uva_gbps * 1e6)  # an expert's bytes over the link, ms
    assert abs(work.host_ms - work.beside_ms) <= 2 * one_expert + HW.host_call_us / 1e3


@pytest.mark.parametrize("tokens", [1, 32, 2048])
def test_above_cpu_max_tokens_the_gpu_reads_the_host_experts(tokens):
    places = {"cpu": list(range(E))}
    limit = cpu_max_tokens(layer(**places), HW)
    assert limit is not None and 32 <= limit < 2048  # the host is bound by reading its experts up to there
    work = split_work(layer(**places, cpu_max_tokens=limit), tokens, HW)
    assert (work.host_ms > 0) == (tokens <= limit)


def test_a_split_layer_keeps_its_attention_over_the_context():
    """The layer's other params are costed with the forward's sequences: a decode over 4,095 cached tokens a
    sequence adds the attention over them (planner/cost/block.py) to the GPU time, host experts or not."""
    from planner.cost.block import Sequences, block_ms, block_shape

    attn = {f"attn.{n}_proj.weight": PlanParam(shape=[rows, 2048], dtype="bfloat16", bytes=rows * 2048 * 2)
            for n, rows in (("q", 4096), ("k", 512), ("v", 512), ("o", 2048))}
    base = layer(uva=list(range(64)), cpu=list(range(64, E)))
    full = base.model_copy(update={"params": {**attn, **base.params}})
    seqs = Sequences(32, 4095)
    with_context = split_work(full, 32, HW, None, seqs).gpu_ms - split_work(full, 32, HW).gpu_ms
    shape = block_shape([(rel, p, "matmul") for rel, p in attn.items()], None)
    # (without sequences the 32 tokens are one sequence's: a few more query-key pairs than 32 sequences' own)
    assert with_context == pytest.approx(block_ms(shape, 32, seqs, HW) - block_ms(shape, 32, Sequences(32, 0), HW),
                                         rel=1e-4)
    assert with_context > 1  # 32 x 4,096 tokens of grouped keys and values, repeated for 32 query heads


def test_a_split_layer_pays_an_moe_blocks_floor():
    """Its other params are priced without the experts, but its small kernels are an MoE block's: the floor moves
    with ``moe_block_gpu_us`` (not ``block_gpu_us``), as the whole layer's does, whatever the split."""
    for places in ({"gpu": list(range(E))}, {"uva": list(range(E))}, {"uva": list(range(64)), "cpu": list(range(64, E))}):
        split = layer(**places)
        more = HW.model_copy(update={"moe_block_gpu_us": HW.moe_block_gpu_us + 500.0})
        dense_more = HW.model_copy(update={"block_gpu_us": HW.block_gpu_us + 500.0})
        for tokens in (1, 32):
            base = split_work(split, tokens, HW)
            assert split_work(split, tokens, more).gpu_ms == pytest.approx(base.gpu_ms + 0.5)
            assert split_work(split, tokens, dense_more).gpu_ms == pytest.approx(base.gpu_ms)


def test_a_grouped_call_over_part_of_the_experts_takes_taller_tiles():
    """torch's grouped_mm tiles a call by its rows over its groups (schemas/grouped_tiles.py): a split layer's part
    holds every pair's row over fewer experts, and the runtime pads a call of 64-128 rows a group, so at a 2,048-
    token prefill (128 rows a group over all 128, the calibrated curve's short tiles) both a part of 78 and the whole
    layer take tiles twice as tall; at 512 tokens (32 a group over all, 52 over 78) and at 8,192 (512 a group: the
    curve's own tiles are tall) nothing changes."""
    from planner.cost.expert_reads import taller_tiles

    assert taller_tiles((E, K), 2048, 78) and taller_tiles((E, K), 2048, 50)
    assert taller_tiles((E, K), 2048, E)  # the whole layer: the runtime pads its call (runtime/experts_forward.py)
    assert not taller_tiles((E, K), 512, 78)  # 52 rows a group: short tiles still
    assert not taller_tiles((E, K), 8192, 78)  # the curve was measured with tall tiles there
    assert not taller_tiles((E, K), 2048, 0)


@pytest.mark.parametrize("shares", [None, "skewed"])
def test_the_host_experts_read_through_uva_are_a_call_of_their_own(shares):
    """Above cpu_max_tokens the runtime reads the host's experts through UVA in a grouped call of their own
    (runtime/cpu_experts.py SplitForward), beside the uva part's: the layer costs its rest and the two calls, each
    with its own experts read as at half their rows against the module's call (H200: 17-28 ms a layer split 78 / 50
    against 28-35 through transformers' module, predicted within 2% a layer, 2026-12-02)."""
    from planner.cost.expert_reads import uva_passes
    from planner.cost.host_experts import ExpertShape, chances, gpu_part_ms, touched_by

    q = None if shares is None else [(K / E) * (3.0 if e % 5 == 0 else 0.5) for e in range(E)]
    if q is not None:
        q = [x * K / sum(q) for x in q]
    split = layer(uva=list(range(78)), cpu=list(range(78, E)), cpu_max_tokens=16)
    shape = ExpertShape.of(split)
    places = chances(split.experts, shape, q)
    two = gpu_part_ms(places["uva"], 2048, shape, HW, True) + gpu_part_ms(places["cpu"], 2048, shape, HW, True)
    base = split_work(layer(uva=[], cpu=list(range(E)), cpu_max_tokens=1 << 20), 2048, HW, q)  # the layer's rest
    rest = base.gpu_ms - base.beside_ms
    assert split_work(split, 2048, HW, q).gpu_ms == pytest.approx(rest + two, rel=1e-9)
    for part in (places["uva"], places["cpu"]):
        touched, rows = touched_by(part, 2048)
        tall = uva_passes(part, (E, K), 2048, touched, rows / touched, HW, len(part))
        short = uva_passes(part, (E, K), 2048, touched, rows / touched, HW)  # the module's own call
        assert tall < 0.95 * short


def test_an_experts_module_not_split_is_priced_graphed_at_eager_decode():
    """Not split, read through UVA or resident (runtime/experts_forward.py): at most GRAPHED_MAX_TOKENS tokens an
    eager call issues the graph's launches in place of the module's; above, or in graph replay, or where the MoE
    block reads the routing back (``moe_sync``), or where a tensor of the module is copied into a prefetch slot, as
    launched. The placement search (planner/cost/placement.py) prices it the same through ``placed_work``."""
    from planner.cost.layer import EXPERTS_CALL_LAUNCHES, GRAPH_CALL_LAUNCHES, layer_work, profile_for
    from schemas.expert_graphs import GRAPHED_MAX_TOKENS, graphed

    routed = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    whole = layer(uva=list(range(E))).model_copy(update={"experts": None, "uva": routed})
    launched = layer_work(whole, GRAPHED_MAX_TOKENS + 1, HW).cpu_ms
    assert launched == pytest.approx(HW.moe_block_cpu_us / 1e3)
    saving = (EXPERTS_CALL_LAUNCHES - GRAPH_CALL_LAUNCHES) * HW.launch_us / 1e3
    for tokens in (1, GRAPHED_MAX_TOKENS):
        assert graphed(whole, tokens)
        assert layer_work(whole, tokens, HW).cpu_ms == pytest.approx(launched - saving)
        looped = HW.model_copy(update={"moe_sync": True})
        assert layer_work(whole, tokens, looped).cpu_ms == pytest.approx(looped.moe_block_cpu_us / 1e3)
    copied = whole.model_copy(update={"uva": routed[:1]})  # down_proj copied into a slot
    assert not graphed(copied, 1) and layer_work(copied, 1, HW).cpu_ms == pytest.approx(launched)
    resident = whole.model_copy(update={"uva": [], "offloaded": []})  # graphed too: a larger budget is no slower
    assert graphed(resident, 1) and layer_work(resident, 1, HW).cpu_ms == pytest.approx(launched - saving)
    assert layer_work(resident, 1, HW).gpu_ms < layer_work(whole, 1, HW).gpu_ms
    assert layer_work(whole, 1, profile_for(HW, "graph")).cpu_ms == 0


def test_a_point_s_own_expert_cost_prices_the_host_at_its_rows():
    """A calibrated point carries what a touched expert costs at its rows (runtime/calibrate_host.py solves it with
    the rate there); a point without one falls back to ``host_expert_us``. The host part's time moves with it by
    exactly the touched experts times the difference, at that point's rows only."""
    from planner.cost.expert_reads import touched_by
    from planner.cost.host_experts import ExpertShape, host_part_ms
    from schemas.hardware_profile import HostRatePoint

    points = [HostRatePoint(tokens=1, gbps=80.0, expert_us=300.0), HostRatePoint(tokens=4, gbps=100.0)]
    own = HW.model_copy(update={"host_expert_gbps": points, "host_expert_us": 20.0})
    assert own.host_expert_us_at(1.0) == 300.0 and own.host_expert_us_at(4.0) == 20.0
    assert own.host_expert_us_at(2.5) == pytest.approx(160.0) and own.host_expert_us_at(0.5) == 300.0
    plain = own.model_copy(update={"host_expert_gbps": [p.model_copy(update={"expert_us": None}) for p in points]})
    assert plain.host_expert_us_at(1.0) == 20.0
    host = layer(uva=list(range(64)), cpu=list(range(64, E)))
    shape = ExpertShape.of(host)
    q = [K / E] * 64
    touched, _ = touched_by(q, 1)
    assert host_part_ms(q, 1, shape, own, False) - host_part_ms(q, 1, shape, plain, False) == \
        pytest.approx(touched * 0.28)
