"""Mixed plans in the runtime: UVA views for the ``uva`` params, the prefetch machinery for the rest.

On the CPU (``device="cpu"``) the same hooks, schedule, slot mapping and restore run with
synchronous copies; outputs are compared bit for bit with the unoffloaded model. The GPU
test (eager, CUDA graph replay, torch.compile) is marked ``gpu`` and skips without CUDA.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import planner  # noqa: E402
import runtime  # noqa: E402
from models import LlamaConfig, make_llama  # noqa: E402
from planner.assemble import assemble  # noqa: E402
from planner.assemble import Assignment  # noqa: E402
from runtime import prefetch_ops as ops  # noqa: E402
from runtime.apply import _ACTIVE  # noqa: E402
from schemas.spec_hash import spec_sha256  # noqa: E402
from test_runtime_cpu import IDS, assert_restored, model, snapshot, spec  # noqa: E402,F401 (fixtures)


def group(spec, g, k, step, backends, backend="prefetch"):
    return planner.plan(spec, strategy="group", group_size=g, num_in_group=k, prefetch_step=step, backend=backend,
                        backends=backends)


def by_hand(spec, where, step=None):
    """A plan from an Assignment: any layer (embedding, head) and any per-param mix."""
    return assemble(spec.model.expanded(), Assignment(where, step, "budget", "by hand"), model_name="tiny-llama",
                    spec_sha256=spec_sha256(spec))


ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def _block(i, attn, mlp):
    where = {f"self_attn.{p}.weight": attn for p in ATTN} | {f"mlp.{p}.weight": mlp for p in MLP}
    return {f"model.layers.{i}": {k: v for k, v in where.items() if v}}


def hand_plans(spec):
    """Mixes the planner's strategies do not make: the embedding on UVA, the head prefetched, blocks whose
    params are split, and blocks all on UVA between prefetched ones."""
    a = {"model.embed_tokens": {"weight": "uva"}} | _block(1, "prefetch", "uva") | _block(2, "uva", "uva") \
        | _block(3, None, "prefetch") | _block(7, "uva", "prefetch") | {"lm_head": {"weight": "prefetch"}}
    b = _block(0, "uva", None) | _block(4, "prefetch", "prefetch") | _block(5, "prefetch", None) \
        | _block(6, "uva", "uva") | _block(8, None, "prefetch") | {"model.norm": {"weight": "uva"}}
    return [by_hand(spec, a), by_hand(spec, a, step=1), by_hand(spec, b, step=3)]


def mixed_plans(spec):
    return [group(spec, 3, 2, 1, {"attention": "uva"}), group(spec, 2, 1, 2, {"dense_mlp": "uva"}),
            group(spec, 1, 1, 1, {"attention": "prefetch", "norm": "prefetch"}, backend="uva"),
            *hand_plans(spec)]


def test_every_plan_here_is_mixed(spec):
    for plan in mixed_plans(spec):
        assert plan.summary.backend == "mixed"
        assert any(layer.uva for layer in plan.layers) and plan.buffer_pool is not None


@pytest.mark.parametrize("which", range(6))
def test_mixed_matches_unoffloaded_and_restores(model, spec, which):
    plan = mixed_plans(spec)[which]
    want = copy.deepcopy(model)(IDS)
    snap = snapshot(model)
    with runtime.apply(plan, model, device="cpu", stats=True) as h:
        assert h.offloader.name == "mixed"
        for _ in range(3):  # wrap-around: later forwards use what the previous one prefetched
            assert torch.equal(model(IDS), want)
        forwards = h.stats()["forwards"]
    prefetched = sum(layer.params[r].bytes for layer in plan.layers for r in layer.prefetched)
    assert prefetched < plan.summary.offloaded_bytes
    assert forwards and all(f["bytes_copied"] == prefetched for f in forwards[-2:])  # UVA params are never copied
    assert all(f["late_copies"] == 0 for f in forwards)
    assert_restored(model, snap)
    assert not ops._OFFLOADERS and not _ACTIVE


def test_uva_params_read_host_memory_and_the_others_their_slot(model, spec):
    plan = hand_plans(spec)[0]
    with runtime.apply(plan, model, device="cpu") as h:
        pool = h.offloader.pool
        host = {id(o.ref.tensor): o.host for o in h.offloader.offloaded}
        for layer in plan.layers:
            for rel in layer.uva:
                p = model.get_parameter(f"{layer.name}.{rel}")
                assert p.data_ptr() == host[id(p)].data_ptr()
            for rel in layer.prefetched:
                p = model.get_parameter(f"{layer.name}.{rel}")
                assert p.data_ptr() == pool.buffer(rel, layer.params[rel], layer.prefetch.slot).data_ptr()
    # the pool has buffers for the prefetched params only
    assert {k.param for k in plan.buffer_pool.keys} == {r for layer in plan.layers for r in layer.prefetched}


def test_failure_while_pointing_at_uva_rolls_back(model, spec, monkeypatch):
    from runtime import prefetch  # the mixed offloader's module

    plan = mixed_plans(spec)[0]
    snap = snapshot(model)
    real = prefetch.read_in_place

    def half_then_fail(offloader, pairs):
        real(offloader, pairs[: len(pairs) // 2])
        raise RuntimeError("UVA view failed")

    monkeypatch.setattr(prefetch, "read_in_place", half_then_fail)
    with pytest.raises(RuntimeError, match="UVA view failed"):
        runtime.apply(plan, model, device="cpu")
    assert_restored(model, snap)
    assert not ops._OFFLOADERS and not _ACTIVE
    assert torch.equal(model(IDS), copy.deepcopy(model)(IDS))


def test_cycles_of_mixed_and_plain_plans_leave_nothing_behind(model, spec):
    plans = mixed_plans(spec)[:2] + [planner.plan(spec, strategy="group", group_size=2, num_in_group=1,
                                                  backend="uva")]
    snap = snapshot(model)
    for i in range(12):
        h = runtime.apply(plans[i % 3], model, device="cpu")
        model(IDS)
        h.remove()
    assert_restored(model, snap)
    assert not ops._OFFLOADERS and not _ACTIVE


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("which", [0, 1, 3])
def test_gpu_eager_and_graph_bit_identical_compile_within_its_own_rounding(which):
    from test_runtime_gpu import assert_exact_on_gpu

    def compiled_too(base, ids, want):
        # compile rounds differently from eager; the offloaded compiled model may differ from the
        # unoffloaded compiled one by no more than compile's own difference from eager
        reference = torch.compile(_unoffloaded, fullgraph=True)
        compiled = torch.compile(base, fullgraph=True)
        with torch.no_grad():
            ref = reference(ids)
            for _ in range(3):
                got = compiled(ids)
                own = (ref.float() - want.float()).abs().max().item()
                off = (got.float() - ref.float()).abs().max().item()
                print(f"compile vs eager {own:.5f}, offloaded compiled vs compiled {off:.5f}")
                assert off <= max(own, 1e-3), (off, own)

    base = make_llama(LlamaConfig(vocab=512, dim=256, layers=9, heads=4, kv_heads=2, hidden=704))
    _unoffloaded = copy.deepcopy(base).cuda()
    assert_exact_on_gpu(base, lambda spec: mixed_plans(spec)[which], compiled_too)
