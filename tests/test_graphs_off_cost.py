"""A plan applied without the layer graphs (its spec's ``memory: {graphs: 0}``, so ``memory.graph_bytes`` 0) is
priced as it runs: every eager experts call launched. One rule says whether a plan runs with them
(schemas/expert_graphs.py ``graphs_on``): runtime.apply follows it, ``predict`` prices by it and the search prices by
the memory section it gives the plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import weights_only
from test_host_experts_cost import E, layer as split_layer

import planner
from planner.cost.host_experts import GPU_PART_LAUNCHES, split_work
from planner.cost.layer import EXPERTS_CALL_LAUNCHES, GRAPH_CALL_LAUNCHES, profile_for
from planner.cost.predict import predict, timeline
from schemas import load_spec
from schemas.expert_graphs import GRAPHED_MAX_TOKENS, graphed, graphs_on, stacked_experts
from schemas.hardware import load_hardware
from schemas.plan import Plan
from schemas.spec import SpecFile
from schemas.workload import Workload, WorkloadItem

GENERATED = Path(__file__).resolve().parent.parent / "examples" / "generated"
GB = 10**9
HW = load_hardware("h200")
SAVING_MS = (EXPERTS_CALL_LAUNCHES - GRAPH_CALL_LAUNCHES) * HW.launch_us / 1e3  # a graphed call's, in issue time
WORKLOAD = Workload({"decode": WorkloadItem(tokens=1, weight=3.0), "decode32": WorkloadItem(tokens=32),
                     "replayed": WorkloadItem(tokens=4, mode="graph"), "prefill": WorkloadItem(tokens=512)})


def _qwen(graphs: int | None) -> SpecFile:
    """Qwen3-30B-A3B (stacked experts) with its weights' budget alone, the layer graphs counted (None) or not (0)."""
    spec = weights_only(load_spec(GENERATED / "qwen3-30b-a3b.yaml"))
    return spec.model_copy(update={"memory": spec.memory.model_copy(update={"graphs": graphs})})


def _without_graphs(plan: Plan) -> Plan:
    """The same plan (the same placement) as one whose spec said ``memory: {graphs: 0}``."""
    return plan.model_copy(update={"memory": plan.memory.model_copy(update={"graph_bytes": 0})})


def test_the_runtime_runs_with_the_layer_graphs_where_the_cost_model_prices_them():
    apply = pytest.importorskip("runtime.apply")  # (imports torch)
    decode = Workload({"decode": WorkloadItem(tokens=1)})
    counted = planner.plan(_qwen(None), gpu_budget=40 * GB, workload=decode)
    left_out = planner.plan(_qwen(0), gpu_budget=40 * GB, workload=decode)
    dense = planner.plan(load_spec(GENERATED / "llama-3.2-1b.yaml"), gpu_budget=4 * GB, workload=decode)
    older = counted.model_copy(update={"memory": None})  # a plan written before the memory section
    assert counted.memory.graph_bytes > 0 and left_out.memory.graph_bytes == dense.memory.graph_bytes == 0
    for plan, on in ((counted, True), (left_out, False), (dense, False), (older, True)):
        assert graphs_on(plan.memory) is on
        assert apply.graphs_counted(plan) is on


def test_without_the_layer_graphs_a_plan_is_predicted_slower_at_eager_decode_alone():
    """The same placement without the graphs: every layer whose eager call of T tokens replays a graph with them
    (``graphed``) issues the experts call's launches instead of the replay's, at decode (at most
    GRAPHED_MAX_TOKENS tokens); in graph replay and at a prefill nothing changes."""
    plan = planner.plan(_qwen(None), gpu_budget=40 * GB, workload=WORKLOAD, strategy="budget", backend="uva")
    off = _without_graphs(plan)
    on_rows = {r.workload: r for r in predict(plan, HW, WORKLOAD).workloads}
    off_rows = {r.workload: r for r in predict(off, HW, WORKLOAD).workloads}
    assert list(on_rows.values()) == plan.predictions.workloads  # the plan counts them: predicted with them
    assert off_rows["replayed"] == on_rows["replayed"] and off_rows["prefill"] == on_rows["prefill"]
    for name, tokens in (("decode", 1), ("decode32", 32)):
        assert tokens <= GRAPHED_MAX_TOKENS
        n = sum(1 for layer in plan.layers if graphed(layer, tokens))
        assert n == sum(1 for layer in plan.layers if layer.moe is not None) == 48  # UVA and resident alike
        assert off_rows[name].cpu_ms - on_rows[name].cpu_ms == pytest.approx(n * SAVING_MS, abs=1e-3)
        assert off_rows[name].step_ms > on_rows[name].step_ms
        for layer, with_graphs, launched in zip(plan.layers, timeline(plan, HW, tokens).work,
                                                timeline(off, HW, tokens).work):
            assert launched.cpu_ms - with_graphs.cpu_ms == pytest.approx(SAVING_MS if graphed(layer, tokens) else 0.0)
            # a replayed call's matmuls through UVA pay no fixed time a call; launched, each does
            on_uva = [rel for rel in stacked_experts(layer.name, layer.params.items()) if rel in layer.uva] \
                if graphed(layer, tokens) else []
            assert launched.gpu_ms - with_graphs.gpu_ms == pytest.approx(len(on_uva) * HW.uva_expert_call_ms)
            assert launched.copy_ms == with_graphs.copy_ms


def test_a_split_layer_without_the_layer_graphs_is_priced_launched():
    """A split layer's graphed call holds the module's call and its parts' extra launches: without the graphs it
    issues them all (one GPU part: the experts call's launches less the replay's; two: the second part's too); a
    call the host computes part of, a prefill or a replayed forward is priced alike with and without them."""
    launch = HW.launch_us / 1e3
    one = split_layer(uva=list(range(E)))
    two = split_layer(gpu=list(range(26)), uva=list(range(26, E)))
    for layer, extra in ((one, 0), (two, GPU_PART_LAUNCHES)):
        for tokens in (1, 8, GRAPHED_MAX_TOKENS):
            assert graphed(layer, tokens)
            with_graphs, launched = split_work(layer, tokens, HW), split_work(layer, tokens, HW, graphs=False)
            assert launched.cpu_ms - with_graphs.cpu_ms == pytest.approx(SAVING_MS + extra * launch)
            assert launched.cpu_ms == pytest.approx(HW.moe_block_cpu_us / 1e3 + extra * launch)
            # the uva part's call replayed pays no fixed time a call, launched it does
            assert launched.gpu_ms - with_graphs.gpu_ms == pytest.approx(HW.uva_expert_call_ms)
            assert launched.host_ms == with_graphs.host_ms
        for tokens, hw in ((GRAPHED_MAX_TOKENS + 1, HW), (512, HW), (1, profile_for(HW, "graph"))):
            assert split_work(layer, tokens, hw, graphs=False) == split_work(layer, tokens, hw)
    host = split_layer(gpu=list(range(26)), uva=list(range(26, 64)), cpu=list(range(64, E)))
    assert split_work(host, 32, HW, graphs=False) == split_work(host, 32, HW)  # the host's part: never graphed
    # at 1 token the guard sends the host's experts through UVA (``bypassed``): graphed with the graphs alone
    level0 = split_layer(gpu=list(range(26)), uva=list(range(26, E)))
    assert split_work(host, 1, HW, graphs=False) == split_work(level0, 1, HW, graphs=False)
