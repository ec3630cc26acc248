"""Experts modules not split by expert (runtime/experts_forward.py): prefill-sized calls of those read through UVA
padded to torch's tall tiles (schemas/grouped_tiles.py), decode calls replayed from CUDA graphs
(schemas/expert_graphs.py). The tile arithmetic, and on the CPU the forward's install, dispatch and removal, the
graphs' decisions with a stand-in capture; tests/test_experts_forward_gpu.py checks the outputs on a GPU."""

from __future__ import annotations

import importlib

import pytest
from conftest import WEIGHTS_ONLY

from schemas.grouped_tiles import SHORT_TILE_ROWS, padded_rows, tall_tiles

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_tall_tiles_above_the_short_tiles_rows_a_group():
    assert not tall_tiles(128 * 128, 128)  # a 2,048-token prefill at top-8 of 128: short tiles
    assert tall_tiles(129 * 128, 128)
    assert tall_tiles(16384, 64)  # half the experts in a call of their own, every pair's row in it
    assert not tall_tiles(16384, 0)


@pytest.mark.parametrize("rows, groups, want", [
    (16384, 128, 129 * 128),  # 128 a group: padded just past the short tile's rows
    (65 * 128, 128, 129 * 128),  # just over half: at most about twice the rows
    (64 * 128, 128, 64 * 128),  # half or less: each expert's rows fit one short tile anyway
    (256, 128, 256),  # a decode step: untouched
    (129 * 128, 128, 129 * 128),  # tall already
    (300, 0, 300),
])
def test_padded_rows(rows, groups, want):
    got = padded_rows(rows, groups)
    assert got == want
    assert got >= rows and (got == rows or tall_tiles(got, groups))
    assert got <= 2 * rows  # never more than twice the call's rows
    assert SHORT_TILE_ROWS == 128


def _uva_plan(model):
    import planner
    import runtime

    spec = runtime.describe(model)  # weights only: every expert off the GPU
    spec = spec.model_copy(update={"memory": spec.memory.model_copy(update=WEIGHTS_ONLY)})
    rest = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if ".experts." not in name)
    return planner.plan(spec, strategy="budget", backend="uva", kinds=["routed_experts"], gpu_budget=rest)


def test_the_forward_is_installed_on_uva_experts_and_removed_with_the_plan():
    import runtime
    from moe_models import make_moe
    from runtime.experts_forward import ExpertsForward

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    plan = _uva_plan(model)
    layers = model.model.layers
    assert all(set(f"mlp.experts.{n}" for n in ("gate_up_proj", "down_proj")) <= set(plan.layer(f"model.layers.{i}").uva)
               for i in range(len(layers)))
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
    with runtime.apply(plan, model, device="cpu"):
        assert all(isinstance(layer.mlp.experts.__dict__.get("forward"), ExpertsForward) for layer in layers)
        with torch.no_grad():
            got = model(ids).logits
    assert torch.equal(got, want)  # on the CPU every call is the module's own
    assert all("forward" not in layer.mlp.experts.__dict__ for layer in layers)


def test_a_split_layer_keeps_its_own_forward():
    """Layers whose experts are split by expert (runtime/cpu_experts.py) are not the tall-tile forward's."""
    from moe_models import make_moe, split_plan
    from runtime.experts_forward import experts_modules

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    assert list(experts_modules(split_plan(model), model)) == []
    found = list(experts_modules(_uva_plan(model), model))
    assert len(found) == len(model.model.layers) and all(tall for *_, tall in found)


def test_tensor_parallel_shards_keep_the_modules_forward(monkeypatch):
    """Experts held as DTensor shards (a rank plan) keep transformers' forward: the runtime's grouped path reads
    plain tensors."""
    import runtime.experts_forward as ue
    from moe_models import make_moe

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    plan = _uva_plan(model)
    assert list(ue.experts_modules(plan, model))
    monkeypatch.setattr(ue, "is_dtensor", lambda t: t is not None)
    assert list(ue.experts_modules(plan, model)) == []


def test_the_tall_tile_path_gives_the_modules_rows(monkeypatch):
    """Where it applies (a GPU's prefill; forced here on the CPU) the forward runs the runtime's grouped path over
    every expert: the module's output."""
    import runtime.experts_forward as ue
    from moe_models import make_moe

    model = make_moe("qwen3_moe", implementation="grouped_mm").float()
    experts = model.model.layers[0].mlp.experts
    own = experts.forward
    forward = ue.ExpertsForward(experts, own, True)
    g = torch.Generator().manual_seed(2)
    tokens, k = 64, model.config.num_experts_per_tok
    hidden = torch.randn(tokens, model.config.hidden_size, generator=g)
    index = torch.stack([torch.randperm(experts.num_experts, generator=g)[:k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, k, generator=g), -1)
    calls = []
    monkeypatch.setattr(ue, "tall_tiles_apply", lambda *a: calls.append(a) or True)
    with torch.no_grad():
        got = forward(hidden, index, weights)
        want = own(hidden, index, weights)
    assert calls
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(ue, "tall_tiles_apply", lambda *a: False)
    with torch.no_grad():
        assert torch.equal(forward(hidden, index, weights), want)


def test_compiling_keeps_the_modules_forward(monkeypatch):
    """While torch.compile traces (``torch.compiler.is_compiling``), a call the tall tiles would take runs the module's
    own forward: inductor rounds the padded path otherwise than the resident model's compiled forward."""
    import runtime.experts_forward as ue
    from moe_models import make_moe

    model = make_moe("qwen3_moe", implementation="grouped_mm").float()
    experts = model.model.layers[0].mlp.experts
    seen = []
    forward = ue.ExpertsForward(experts, lambda *a: seen.append("own") or a[0], True)
    monkeypatch.setattr(ue, "tall_tiles_apply", lambda *a: True)
    monkeypatch.setattr(ue, "part_rows", lambda *a: seen.append("tall") or a[4].repeat_interleave(2, 0))
    monkeypatch.setattr(ue, "join_rows", lambda rows, tokens, dtype: rows[:tokens])
    hidden = torch.zeros(4, model.config.hidden_size)
    index = torch.zeros(4, 2, dtype=torch.long)
    weights = torch.ones(4, 2)
    forward(hidden, index, weights)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    forward(hidden, index, weights)
    assert seen == ["tall", "own"]


def test_a_failed_apply_takes_the_forwards_away(monkeypatch):
    """An apply that fails after the forwards went on (here the write watch's install) leaves every experts module
    as it was: no forward of its own, the same logits."""
    import runtime
    from moe_models import make_moe
    from runtime.writes import WriteWatch

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    ids = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(ids).logits

    def boom(*_a, **_k):
        raise RuntimeError("injected")

    monkeypatch.setattr(WriteWatch, "install", boom)
    with pytest.raises(RuntimeError, match="injected"):
        runtime.apply(_uva_plan(model), model, device="cpu")
    assert all("forward" not in layer.mlp.experts.__dict__ for layer in model.model.layers)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


def _graphs_on_the_cpu(monkeypatch):
    """Let the layer graphs run on the CPU: a stand-in capture that re-runs the function at each replay
    (tests/test_shape_graphs.py; tests/test_experts_forward_gpu.py runs CUDA's)."""
    from runtime import shape_graphs
    from test_shape_graphs import _stand_in

    monkeypatch.setattr(importlib.import_module("runtime.apply"), "graphs_here", lambda device: True)
    monkeypatch.setattr(shape_graphs, "graphs_here", lambda device: True)
    monkeypatch.setattr(shape_graphs.ShapeGraphs, "_captured", _stand_in)
    monkeypatch.setattr(shape_graphs.GraphPool, "order", lambda self: None)


def _step(model, tokens: int, seed: int):
    ids = torch.randint(0, model.config.vocab_size, (tokens, 1), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        return model(ids, use_cache=False).logits


def _half_plan(model, graphs: bool = False):
    """A plan of ``model`` reading the routed experts of some of its layers through UVA, the rest resident; its
    memory counts the weights alone, or with ``graphs`` the layer graphs too."""
    import planner
    import runtime
    from planner.memory.parts import MemoryModel

    spec = runtime.describe(model)
    spec = spec.model_copy(update={"memory": spec.memory.model_copy(
        update={**WEIGHTS_ONLY, **({"graphs": None} if graphs else {})})})
    counted = MemoryModel(spec.model, spec.model.expanded(), spec.memory).graphs
    rest = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if ".experts." not in name)
    one = sum(p.numel() * p.element_size() for p in model.model.layers[0].mlp.experts.parameters())
    return planner.plan(spec, strategy="budget", backend="uva", kinds=["routed_experts"],
                        gpu_budget=rest + one + counted)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "olmoe"])
def test_experts_modules_replay_graphs_at_the_calls_the_planner_prices_as_graphed(monkeypatch, arch):
    """One rule for the runtime and the planner (schemas.expert_graphs.graphed): an experts module, resident or read
    through UVA, replays its decode calls (at most GRAPHED_MAX_TOKENS tokens, from the second call of a shape) and
    not a larger call; only the modules read through UVA take the tall tiles; the logits stay the resident model's;
    remove() lets the graphs go; with expert_graphs=False, or by default with a plan that counts no graphs
    (memory.graphs: 0), the resident modules keep their own forward."""
    import runtime
    from moe_models import make_moe
    from schemas.expert_graphs import GRAPHED_MAX_TOKENS, graphed, static_bytes

    _graphs_on_the_cpu(monkeypatch)
    model = make_moe(arch, implementation="grouped_mm")
    plan = _half_plan(model)
    layers = [layer for layer in plan.layers if layer.moe is not None]
    on_uva = [bool(layer.uva) for layer in layers]
    assert any(on_uva) and not all(on_uva)
    sizes = (1, 2, GRAPHED_MAX_TOKENS, GRAPHED_MAX_TOKENS + 1)
    want = {t: _step(model, t, t) for t in sizes}
    for off in ({"expert_graphs": False}, {}):  # asked, or as the plan counts them (none)
        with runtime.apply(plan, model, device="cpu", **off) as handle:
            assert "expert_graphs" not in handle.stats()
            forwards = _forwards(model)
            assert [f.tall for f in forwards] == [True] * sum(on_uva) and all(f.graphs is None for f in forwards)
    counted = _half_plan(model, graphs=True)
    assert counted.memory.graph_bytes > 0 and [layer.uva for layer in counted.layers] == [
        layer.uva for layer in plan.layers]
    with runtime.apply(counted, model, device="cpu") as handle:  # the plan counts them: on
        assert all(f.graphs is not None for f in _forwards(model)) and handle.stats()["expert_graphs"]
    with runtime.apply(plan, model, device="cpu", expert_graphs=True) as handle:  # (a toy's plan counts none)
        got = {t: (_step(model, t, t), _step(model, t, t)) for t in sizes}
        forwards = _forwards(model)
        replayed = {t: [any(key[0][0][0] == t for key in f.graphs.graphs) for f in forwards] for t in sizes}
        stats = handle.stats()["expert_graphs"]
        held = {id(t): t.nbytes for f in forwards for e in f.graphs.graphs.values() for t in (*e.inputs, e.output)}
    priced = {t: [graphed(layer, t) for layer in layers] for t in sizes}
    assert len(forwards) == len(layers) > 0 and replayed == priced and [f.tall for f in forwards] == on_uva
    assert priced[1] == [True] * len(layers) and priced[GRAPHED_MAX_TOKENS + 1] == [False] * len(layers)
    # one set of static tensors a shape, whatever the layers: as the plan counts them
    config = model.config
    k, counted = config.num_experts_per_tok, [static_bytes(t, config.hidden_size, config.num_experts_per_tok, 2)
                                              for t in sizes[:3]]
    assert 0 <= sum(counted) - sum(held.values()) <= sum(t * k * 2 for t in sizes[:3])  # bf16 routing weights or not
    assert stats == {"layers": len(layers), "graphs": 3 * len(layers), "failed": 0, "bytes": sum(held.values()),
                     "pool_bytes": 0}  # no CUDA pool on the CPU
    for t in sizes:
        assert all(torch.equal(g, want[t]) for g in got[t])
    assert all(not f.graphs.graphs for f in forwards)
    assert all("forward" not in layer.mlp.experts.__dict__ for layer in model.model.layers)


def _forwards(model):
    from runtime.experts_forward import ExpertsForward

    return [m.__dict__["forward"] for m in model.modules() if isinstance(m.__dict__.get("forward"), ExpertsForward)]


def test_an_experts_module_that_reads_the_routing_back_or_copies_a_tensor_is_not_graphed(monkeypatch):
    """transformers' per-expert loop (implementation ``eager``) reads the routing back, which no graph holds; a plan
    that copies a tensor of the module into a prefetch slot moves it between calls: both run as launched (a module
    read through UVA keeps its tall tiles), and the planner prices the second so (schemas.expert_graphs.graphed; the
    first is the profile's ``moe_sync``)."""
    from moe_models import make_moe
    from runtime.shape_graphs import GraphPool
    from runtime.experts_forward import ExpertsForwards
    from schemas.expert_graphs import graphed

    _graphs_on_the_cpu(monkeypatch)
    looped = make_moe("qwen3_moe", implementation="eager")
    tall = ExpertsForwards(GraphPool(torch.device("cpu")))
    tall.install(_uva_plan(looped), looped)
    assert tall.forwards and all(f.graphs is None for f in _forwards(looped))
    tall.restore()

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    plan = _uva_plan(model)
    copied = [layer.model_copy(update={"uva": [r for r in layer.uva if not r.endswith("down_proj")]})
              if layer.moe is not None else layer for layer in plan.layers]  # down_proj offloaded, not on UVA
    moved = plan.model_copy(update={"layers": copied})
    tall = ExpertsForwards(GraphPool(torch.device("cpu")))
    tall.install(moved, model)
    assert tall.forwards and all(f.graphs is None for f in _forwards(model))
    tall.restore()
    assert not any(graphed(layer, 1) for layer in copied) and all(
        graphed(layer, 1) for layer in plan.layers if layer.moe is not None)


def test_a_graphed_module_whose_tensors_move_runs_as_launched(monkeypatch):
    """A graph reads the addresses of its capture: should the module's tensors be put elsewhere while applied, its
    calls run as launched from then on (the values of the tensors it now has), with a warning."""
    import runtime
    from moe_models import make_moe

    _graphs_on_the_cpu(monkeypatch)
    model = make_moe("qwen3_moe", implementation="grouped_mm")
    with runtime.apply(_uva_plan(model), model, device="cpu", expert_graphs=True) as handle:
        _step(model, 2, 0), _step(model, 2, 0)
        experts = model.model.layers[0].mlp.experts
        forward = experts.__dict__["forward"]
        assert forward.graphs.graphs and forward.graphs.failed is None
        old = experts.down_proj.data
        experts.down_proj.data = old.clone() * 0  # elsewhere, and other values
        with torch.inference_mode():
            hidden = torch.randn(2, model.config.hidden_size, dtype=torch.bfloat16)
            index = torch.zeros(2, model.config.num_experts_per_tok, dtype=torch.long)
            weights = torch.ones(2, model.config.num_experts_per_tok, dtype=torch.bfloat16)
            out = forward(hidden, index, weights)
        assert forward.graphs.failed is not None and torch.equal(out, torch.zeros_like(out))
        experts.down_proj.data = old
        assert handle.stats()["expert_graphs"]["failed"] == 1


def test_the_static_tensors_stay_within_what_the_plan_counts_however_many_shapes(monkeypatch):
    """Decode batches of ten sizes up to 64 tokens: the pool keeps eight shapes (the ninth and tenth run as
    launched, their logits the resident model's), and their static tensors stay within the static part of the plan's
    memory.graph_bytes (planner/memory/graphs.py: 8 shapes counted at 64 tokens); the pool's own segments are
    measured on the GPU (bench/probe_graph_memory.py)."""
    import runtime
    from moe_models import make_moe
    from schemas.expert_graphs import GRAPHED_MAX_SHAPES, static_bytes

    _graphs_on_the_cpu(monkeypatch)
    model = make_moe("qwen3_moe", implementation="grouped_mm")
    plan = _half_plan(model, graphs=True)
    config = model.config
    sizes = (64, 1, 2, 3, 5, 8, 13, 21, 34, 55)
    want = {t: _step(model, t, t) for t in sizes}
    with runtime.apply(plan, model, device="cpu") as handle:
        got = {t: (_step(model, t, t), _step(model, t, t)) for t in sizes}
        stats = handle.stats()["expert_graphs"]
        held = {key[0][0][0] for key in handle._graphs.statics}
    assert held == set(sizes[:GRAPHED_MAX_SHAPES])  # the first eight shapes; 34 and 55 tokens run as launched
    counted = GRAPHED_MAX_SHAPES * static_bytes(64, config.hidden_size, config.num_experts_per_tok, 2)
    assert 0 < stats["bytes"] <= counted < plan.memory.graph_bytes
    assert all(torch.equal(g, want[t]) for t in sizes for g in got[t])
