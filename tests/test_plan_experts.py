"""Plans whose routed experts are split by expert (schemas/plan_experts.py): made, checked and refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from planner.assemble import Assignment, assemble
from planner.errors import PlanningError
from planner.layers import build_graph, layers_in_order
from schemas import Plan, SpecFile
from schemas.io import dump_model, load_plan
from schemas.errors import InputError
from schemas.plan_experts import ExpertSplit

E = 8


def moe_spec(layers: int = 2) -> SpecFile:
    block = {"attn.q_proj.weight": [16, 16], "mlp.gate.weight": [E, 16],
             "mlp.experts.gate_up_proj": [E, 32, 16], "mlp.experts.down_proj": [E, 16, 16]}
    return SpecFile.model_validate({"model": {"name": "toy-moe", "dtype": "bfloat16", "layers": [
        {"name": "embed", "params": {"weight": [64, 16]}},
        {"name": "model.layers.{i}", "repeat": layers, "params": block, "moe": {"experts": E, "top_k": 2}},
        {"name": "norm", "params": {"weight": [16]}}]},
        "memory": {"workspace": 0, "activations": 0, "graphs": 0}})  # a toy: its budgets are about weights


SPLIT = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
PER_EXPERT = (32 * 16 + 16 * 16) * 2


def split_of(places: list[str], **extra) -> ExpertSplit:
    return ExpertSplit(params=SPLIT, **{p: [e for e, q in enumerate(places) if q == p] for p in ("gpu", "uva", "cpu")},
                       **extra)


def make(places: list[str], **extra) -> Plan:
    spec = moe_spec()
    layers = layers_in_order(build_graph(spec.model.expanded()))
    return assemble(layers, Assignment({}, None, "budget", "test", experts={"model.layers.1": split_of(places, **extra)}),
                    model_name="toy-moe", spec_sha256="0" * 64)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["gpu", "uva", "cpu"]), min_size=E, max_size=E).filter(lambda p: set(p) != {"gpu"}))
def test_any_placement_makes_a_consistent_plan(places):
    plan = make(places)
    layer = plan.layers[2]
    host = sum(1 for p in places if p != "gpu")
    assert layer.offloaded_bytes == host * PER_EXPERT
    assert plan.summary.pinned_host_bytes == host * PER_EXPERT
    assert plan.summary.resident_bytes == plan.summary.total_bytes - host * PER_EXPERT
    used = {p for p in places if p != "gpu"}
    assert plan.summary.backend == (used.pop() if len(used) == 1 else "mixed")
    assert load_plan_text(dump_model(plan)) == plan


def load_plan_text(text: str) -> Plan:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.plan.yaml"
        path.write_text(text)
        return load_plan(path)


def _edited(plan: Plan, **split) -> dict:
    data = plan.model_dump(mode="json", exclude_defaults=True)
    data["layers"][2]["experts"].update(split)
    return data


@pytest.mark.parametrize("edit, message", [
    ({"cpu": [0, 1, 2, 3, 4, 5, 6, 7, 7]}, "expert 7 is listed twice"),
    ({"cpu": [0, 1, 2, 3, 4, 5, 6]}, "experts 7 are in none of gpu, uva and cpu"),
    ({"cpu": [0, 1, 2, 3, 4, 5, 6, 9]}, "expert 9 does not exist: the layer has 8 experts"),
    ({"params": ["mlp.experts.gate_up_proj", "attn.q_proj.weight"]}, "a split param's first dimension is the expert"),
    ({"params": ["mlp.experts.nope"]}, "'mlp.experts.nope' is not a param of the layer"),
    ({"cpu": [], "gpu": list(range(E))}, "every expert is on the GPU"),
    ({"cpu": [], "uva": list(range(E))}, "uva experts in a plan of backend cpu"),
])
def test_contradictions_are_found(edit, message):
    with pytest.raises(Exception) as err:
        Plan.model_validate(_edited(make(["cpu"] * E), **edit))
    assert message in str(err.value)


def test_cpu_experts_in_a_uva_plan_and_cpu_max_tokens_without_cpu_experts():
    data = make(["uva"] * E).model_dump(mode="json", exclude_defaults=True)
    data["layers"][2]["experts"]["cpu_max_tokens"] = 64
    with pytest.raises(Exception, match="cpu_max_tokens without cpu experts"):
        Plan.model_validate(data)
    data = make(["cpu"] * E).model_dump(mode="json", exclude_defaults=True)
    data["summary"]["backend"] = "uva"
    with pytest.raises(Exception, match="cpu experts in a plan of backend uva"):
        Plan.model_validate(data)


def test_backends_cpu_splits_every_expert_of_each_offloaded_layer():
    plan = planner.plan(moe_spec(4), strategy="budget", gpu_budget=20_000, backends={"routed_experts": "cpu"})
    split = [layer for layer in plan.layers if layer.experts is not None]
    assert split and all(sorted(layer.experts.cpu + layer.experts.uva) == list(range(E)) and
                         layer.experts.params == SPLIT for layer in split)
    assert any(note.startswith("cpu backend: ") for note in plan.summary.notes)
    assert plan.summary.backend_reason.startswith("offload.backends: routed_experts cpu")
    assert plan.predictions.workloads[0].step_ms > 0


def test_backends_cpu_needs_the_whole_experts_module():
    with pytest.raises(PlanningError, match="the host computes the experts module whole, but mlp.experts.down_proj"):
        planner.plan(moe_spec(), strategy="budget", gpu_budget=20_000, params=["gate_up_proj", "q_proj"],
                     backends={"routed_experts": "cpu"})


def test_a_layer_without_moe_cannot_split():
    spec = moe_spec()
    layers = layers_in_order(build_graph(spec.model.expanded()))
    with pytest.raises(PlanningError, match="has no routed experts"):
        assemble(layers, Assignment({}, None, "budget", "t", experts={"embed": split_of(["cpu"] * E)}),
                 model_name="x", spec_sha256="0" * 64)
    with pytest.raises(InputError):
        load_plan_text("plan_version: 2\n")


def qwen3_like(layers: int = 6) -> SpecFile:
    """Qwen3-MoE's decoder layer shapes (128 experts of width 768, top-8), a few layers."""
    block = {"self_attn.q_proj.weight": [4096, 2048], "self_attn.o_proj.weight": [2048, 4096],
             "mlp.gate.weight": [128, 2048], "mlp.experts.gate_up_proj": [128, 1536, 2048],
             "mlp.experts.down_proj": [128, 2048, 768], "input_layernorm.weight": [2048]}
    return SpecFile.model_validate({"model": {"name": "qwen3-like", "dtype": "bfloat16", "layers": [
        {"name": "model.embed_tokens", "params": {"weight": [151936, 2048]}},
        {"name": "model.layers.{i}", "repeat": layers, "params": block, "moe": {"experts": 128, "top_k": 8}},
        {"name": "lm_head", "params": {"weight": [151936, 2048]}}]}})


def _decode(tokens: int, mode: str = "eager"):
    from schemas.workload import Workload, WorkloadItem

    return Workload({"decode": WorkloadItem(tokens=tokens, mode=mode)})


def test_auto_lets_the_host_share_the_experts_where_that_is_faster():
    spec = qwen3_like()
    hybrid = planner.plan(spec, gpu_budget=3 * 10**9, workload=_decode(32))
    split = [layer.experts for layer in hybrid.layers if layer.experts is not None]
    assert split and all(s.cpu and s.uva for s in split)  # the host and the link at once
    assert any(note.startswith("cpu backend: of the 128 experts") and "moves it to the host's measured speed" in note
               for note in hybrid.summary.notes)  # the plan says the split moves at run time
    uva = planner.plan(spec, gpu_budget=3 * 10**9, workload=_decode(32), backends={"routed_experts": "uva"})
    assert hybrid.predictions.weighted_step_ms < 0.97 * uva.predictions.weighted_step_ms


@pytest.mark.parametrize("options", [
    {"workload": _decode(32, "graph")},  # a CUDA graph cannot capture the host's part
    {"workload": _decode(32), "backend": "uva"},  # the backend asked for
    {"workload": _decode(1)},  # one token: reading the few experts it routes to over the link is faster
])
def test_auto_keeps_the_experts_off_the_host_elsewhere(options):
    plan = planner.plan(qwen3_like(), gpu_budget=3 * 10**9, **options)
    assert all(layer.experts is None for layer in plan.layers)


def test_tensor_parallel_ranks_keep_their_share_of_the_experts_off_the_host():
    ranks = planner.plan_ranks(qwen3_like(), 2, gpu_budget=2 * 10**9, workload=_decode(32))
    assert all(layer.experts is None for plan in ranks for layer in plan.layers)
    with pytest.raises(PlanningError, match="under tensor parallelism a rank holds a share of the experts"):
        planner.plan_ranks(qwen3_like(), 2, gpu_budget=2 * 10**9, workload=_decode(32),
                           backends={"routed_experts": "cpu"})


def _where(spec, plan):
    from planner.layers import build_graph, layers_in_order

    layers = layers_in_order(build_graph(spec.model.expanded()))
    index = {layer.name: layer.index for layer in layers}
    where = {}
    for lay in plan.layers:
        params = {p: "uva" if p in lay.uva else "prefetch" for p in lay.offloaded}
        if lay.experts is not None:  # the strategies place a shared experts module as UVA params
            params.update(dict.fromkeys(lay.experts.params, "uva"))
        if params:
            where[index[lay.name]] = params
    return layers, where


@pytest.mark.parametrize("budget", [2 * 10**9, 3 * 10**9, 4 * 10**9])
@pytest.mark.parametrize("backends", [None, {"routed_experts": "cpu"}])
def test_the_search_prices_the_host_as_the_plan_predicts_it(budget, backends):
    """The placement cost the search walks prices a layer the host shares exactly as the finished plan's
    prediction does (the same split, the same timeline), with auto's trial and with the cpu backend given."""
    from planner.cost.placement import PlacementCost
    from schemas.hardware import load_hardware

    spec, workload = qwen3_like(), _decode(32)
    plan = planner.plan(spec, gpu_budget=budget, workload=workload, backends=backends)
    assert any(layer.experts is not None and layer.experts.cpu for layer in plan.layers)
    layers, where = _where(spec, plan)
    cost = PlacementCost(layers, load_hardware("h200"), workload, host=frozenset({"routed_experts"}),
                         optional=backends is None)
    assert cost.step_ms(where, plan.summary.prefetch_step or 1) == pytest.approx(
        plan.predictions.weighted_step_ms, abs=1e-3)


@pytest.mark.parametrize("tokens", [1, 32, 512])
def test_the_floor_of_a_path_with_the_host_is_under_every_later_step(tokens):
    """``AutoPath.floor`` (where auto's walk stops looking for a faster later step) stays a lower bound when the
    host may take experts: a layer's part is the least of it as placed and with its experts on the host."""
    from planner.build import _model
    from planner.cost.placement import PlacementCost
    from planner.layers import eligible_params
    from planner.strategy.auto_order import build_order
    from planner.strategy.auto_slots import AutoPath
    from schemas.hardware import load_hardware

    spec, workload, hw = qwen3_like(4), _decode(tokens), load_hardware("h200")
    m = _model(spec, spec.memory, spec.offload, hw, workload)
    eligible = {layer.index: eligible_params(layer, None, m.shared.get(layer.name, set()), None)
                for layer in m.layers}
    for whole in (frozenset(), frozenset({"routed_experts"})):
        cost = PlacementCost(m.layers, hw, workload, host=frozenset({"routed_experts"}), optional=True)
        order = build_order(m.layers, eligible, hw, workload, None, {"routed_experts": "uva"}, None, (), whole=whole)
        path = AutoPath(m.layers, order, m.total_bytes, cost, None, None)
        ms = [path.step_ms(st) for st in path.steps]
        for i, st in enumerate(path.steps):
            assert path.floor(st) <= min(ms[i:]) * (1 + 1e-9)
