"""A layer spanning the slots: the schedule, the arena, the plan check, the planner's choice, the runtime.

A spanning layer's buffers lie over the bytes of every slot (schemas/schedule.py, schemas/buffer_pool.py).
On the CPU the runtime copies synchronously at each trigger, so a copy issued too early overwrites bytes a
layer still needs: the layer then finds someone else's weights and copies again (``late_copies``). Every
runtime test here asserts no late copy and outputs equal to the unoffloaded model, bit for bit.
"""

from __future__ import annotations

import copy
import random

import pytest
from conftest import weights_only

from schemas.buffer_pool import ALIGN, PoolKey, arena_layout, build_pool, pool_bytes
from schemas.schedule import schedule


def _walk_back(positions: list[int], num_layers: int, step: int, span: set[int]) -> list[tuple[int | None, int]]:
    """The rule read literally: slots in turn over the slotted layers; a layer's copy starts just after the
    nearest earlier layer (cyclically, unrolled) that shares bytes with it."""
    slotted = [p for p in positions if p not in span]
    k = min(len(slotted), step)
    slot = {p: i % k for i, p in enumerate(slotted)}
    out = []
    n = len(positions)
    for j, p in enumerate(positions):
        for back in range(1, n + 1):
            q = positions[(j - back) % n]
            unrolled = q - (num_layers if j - back < 0 else 0)
            if p in span or q in span or slot[q] == slot[p]:
                out.append((slot.get(p), unrolled + 1))
                break
    return out


def test_schedule_is_the_walk_back_rule():
    rng = random.Random(7)
    for _ in range(400):
        num_layers = rng.randint(1, 14)
        positions = sorted(rng.sample(range(num_layers), rng.randint(1, num_layers)))
        span = set(rng.sample(positions, rng.randint(0, min(3, len(positions)))))
        step = rng.randint(1, 5)
        got = [(t.slot, t.trigger) for t in schedule(positions, num_layers, step, span)]
        assert got == _walk_back(positions, num_layers, step, span), (positions, num_layers, step, span)


def test_a_spanning_head_waits_for_the_last_block_and_the_first_blocks_wait_for_it():
    # embedding 0, blocks 1..6, norm 7, head 8: blocks and the head prefetched, two slots
    triggers = schedule([1, 2, 3, 4, 5, 6, 8], 9, 2, {8})
    head = triggers[-1]
    assert head.span and head.copy_before(9) == 7 and not head.previous_forward  # after block 6 has run
    assert [t.copy_before(9) for t in triggers[:2]] == [0, 0]  # after the head ran (the next forward's start)
    assert [t.slot for t in triggers[:6]] == [0, 1, 0, 1, 0, 1]
    assert [t.copy_before(9) for t in triggers[2:6]] == [2, 3, 4, 5]  # the slot rule, as without a span


K = PoolKey


def test_arena_lays_slots_end_to_end_and_the_span_over_them():
    a, b, head = K("a", (3, 5), "float32", None), K("b", (7,), "bfloat16", None), K("w", (100, 10), "float32", None)
    sig = ((a, 60), (b, 14))
    entries = build_pool([sig, sig, sig, ((head, 4000),)], 2, [False, False, False, True])
    assert [(e.key, e.slots, e.span) for e in entries] == [(a, (0, 1), False), (b, (0, 1), False),
                                                          (head, (), True)]
    layout = arena_layout(entries)
    offs = layout.offsets
    assert offs[(a, 0)] == 0 and offs[(b, 0)] == ALIGN and offs[(a, 1)] == 2 * ALIGN and offs[(b, 1)] == 3 * ALIGN
    assert offs[(head, None)] == 0
    assert layout.nbytes == max(4 * ALIGN, -(-4000 // ALIGN) * ALIGN) == pool_bytes(entries)
    assert all(off % ALIGN == 0 for off in offs.values())
    # without a spanning layer the pool is separate buffers, counted as their sum (unchanged)
    plain = build_pool([sig, sig, sig], 2)
    assert pool_bytes(plain) == 2 * (60 + 14)


def test_a_span_buffer_larger_than_the_slots_sets_the_arena():
    a, head = K("a", (4,), "float32", None), K("w", (1000,), "float32", None)
    entries = build_pool([((a, 16),), ((a, 16),), ((a, 16),), ((head, 4000),)], 2, [False, False, False, True])
    assert pool_bytes(entries) == -(-4000 // ALIGN) * ALIGN
    small = build_pool([((a, 4096),), ((a, 4096),), ((a, 4096),), ((head, 16),)], 2, [False, False, False, True])
    assert pool_bytes(small) == 2 * 4096  # the span costs nothing beyond the slots


# -- plans -----------------------------------------------------------------------------------------------------


def _llama_spec():
    from pathlib import Path

    from schemas.io import load_spec

    return weights_only(load_spec(Path(__file__).resolve().parent.parent / "examples" / "generated" / "llama-3-8b.yaml"))


@pytest.fixture(scope="module")
def prefill_plan():
    import planner
    from schemas.workload import Workload, WorkloadItem

    return planner.plan(_llama_spec(), gpu_budget=int(1.2e9), workload=Workload({"prefill": WorkloadItem(tokens=2048)}))


def test_auto_spans_the_lm_head_at_prefill_when_it_beats_uva(prefill_plan):
    import planner
    from schemas.workload import Workload, WorkloadItem

    plan = prefill_plan
    head = next(layer for layer in plan.layers if layer.name == "lm_head")
    assert head.prefetch is not None and head.prefetch.span and head.prefetch.slot is None and not head.uva
    assert plan.summary.peak_gpu_bytes <= 1.2e9
    # the pool is the arena: no larger than the head's buffer plus alignment, and it holds two slots
    assert plan.buffer_pool.slots == 2 and plan.buffer_pool.bytes == pool_bytes(
        [k.entry() for k in plan.buffer_pool.keys])
    assert plan.buffer_pool.bytes < head.offloaded_bytes + ALIGN
    assert any("lm_head spans the slots" in n for n in plan.summary.notes)
    assert any(n.startswith("auto: lm_head prefetched spanning the slots") for n in plan.summary.notes)
    assert not any("lm_head" in n and ("read in place" in n or "on UVA" in n) for n in plan.summary.notes)
    assert "spanning" in plan.summary.backend_reason
    # faster than the same budget with the head read through UVA (what auto did before spans)
    uva = planner.plan(_llama_spec(), gpu_budget=int(0.95e9), workload=Workload({"prefill": WorkloadItem(tokens=2048)}))
    assert next(layer for layer in uva.layers if layer.name == "lm_head").uva
    assert plan.predictions.weighted_step_ms < 0.8 * uva.predictions.weighted_step_ms


def test_a_span_plan_round_trips_and_its_tampering_is_found(prefill_plan, tmp_path):
    from pydantic import ValidationError
    from schemas.io import dump_model as dump_plan, load_plan
    from schemas.plan_check import plan_findings

    text = dump_plan(prefill_plan)
    assert "span: true" in text
    path = tmp_path / "p.yaml"
    path.write_text(text)
    assert load_plan(path) == prefill_plan
    assert not plan_findings(prefill_plan)
    i = next(i for i, layer in enumerate(prefill_plan.layers) if layer.name == "lm_head")
    data = prefill_plan.model_dump(mode="json")
    # the head as a slot instead: the pool and the schedule no longer agree with it
    data["layers"][i]["prefetch"] = {"slot": 0, "copy_before": "lm_head"}
    with pytest.raises(ValidationError) as err:
        type(prefill_plan).model_validate(data)
    assert "buffer_pool" in str(err.value)
    # both a slot and span
    data = prefill_plan.model_dump(mode="json")
    data["layers"][i]["prefetch"]["slot"] = 1
    with pytest.raises(ValidationError) as err:
        type(prefill_plan).model_validate(data)
    assert "exactly one of them" in str(err.value)
    # the pool key's span flag and the arena's bytes
    data = prefill_plan.model_dump(mode="json")
    key = next(k for k in data["buffer_pool"]["keys"] if k["span"])
    key["span"] = False
    data["buffer_pool"]["bytes"] += 512
    with pytest.raises(ValidationError) as err:
        type(prefill_plan).model_validate(data)
    assert "span" in str(err.value) and "arena" in str(err.value)


def test_plans_without_a_span_are_written_as_before(tmp_path):
    import planner

    plan = planner.plan(_llama_spec(), gpu_budget=int(8e9))
    from schemas.io import dump_model as dump_plan

    assert "span" not in dump_plan(plan)


# -- the runtime on the CPU ------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")

from hand_plans import span_plan  # noqa: E402
from test_runtime_cpu import IDS, assert_restored, model, snapshot, spec  # noqa: E402,F401 (fixtures)


CASES = [
    (range(9), 2, ("lm_head",)),  # every block, the head spanning two slots
    (range(9), 1, ("lm_head",)),
    ((1, 2, 5, 6), 3, ("lm_head",)),  # resident blocks in between
    (range(9), 2, ("model.embed_tokens",)),  # the first layer spans: its copy is primed at apply time
    ((0, 3, 4, 8), 2, ("model.embed_tokens", "lm_head")),  # two spanning layers
    ((), 2, ("lm_head",)),  # a span alone (a buffer of its own)
]


@pytest.mark.parametrize("blocks,step,span", CASES)
def test_span_plans_match_unoffloaded_with_no_late_copy(model, spec, blocks, step, span):
    from runtime.gpu_buffers import SPAN

    import runtime

    plan = span_plan(spec, blocks, step, span)
    want = copy.deepcopy(model)(IDS)
    snap = snapshot(model)
    with runtime.apply(plan, model, device="cpu", stats=True) as h:
        pool = h.offloader.pool
        assert pool.arena is not None and pool.arena.numel() == plan.buffer_pool.bytes
        for name in span:  # its params are views over the start of the arena
            layer = next(x for x in plan.layers if x.name == name)
            for rel in layer.prefetched:
                p = model.get_parameter(f"{name}.{rel}")
                assert p.data_ptr() == pool.buffer(rel, layer.params[rel], SPAN).data_ptr()
                assert pool.arena.data_ptr() <= p.data_ptr() < pool.arena.data_ptr() + pool.arena.numel()
        for _ in range(3):  # wrap-around: later forwards use what the previous one prefetched
            assert torch.equal(model(IDS), want)
        forwards = h.stats()["forwards"]
    assert len(forwards) == 3 and all(f["late_copies"] == 0 for f in forwards)
    assert_restored(model, snap)


def test_the_span_really_shares_the_slots_bytes(model, spec):
    """The head's buffer lies over the blocks' buffers of both slots (the memory it saves)."""
    import runtime

    plan = span_plan(spec, range(9), 2, ("lm_head",))
    with runtime.apply(plan, model, device="cpu") as h:
        head = model.get_parameter("lm_head.weight")
        lo, hi = head.data_ptr(), head.data_ptr() + head.numel() * head.element_size()
        arena = h.offloader.pool.arena
        assert lo == arena.data_ptr()  # the span buffers start the arena, as slot 0 does
        under = [p for i in (0, 1) for p in model.model.layers[i].parameters() if lo <= p.data_ptr() < hi]
        assert under  # some block buffers lie under the head's
        assert plan.buffer_pool.bytes == max(hi - lo, plan.buffer_pool.bytes)
    assert plan.buffer_pool.bytes < plan.summary.offloaded_bytes


def test_interrupted_forward_with_a_span_recovers(model, spec):
    import runtime

    want = copy.deepcopy(model)(IDS)
    plan = span_plan(spec, range(9), 2, ("lm_head",))
    with runtime.apply(plan, model, device="cpu"):
        layer = model.model.layers[4]
        real = layer.forward

        def boom(*a, **k):
            raise RuntimeError("interrupted")

        layer.forward = boom
        with pytest.raises(RuntimeError, match="interrupted"):
            model(IDS)
        layer.forward = real
        for _ in range(2):
            assert torch.equal(model(IDS), want)


@pytest.mark.parametrize("blocks,step,span", [CASES[0], CASES[4]])
def test_span_plans_compile_without_breaks_and_stay_exact(model, spec, blocks, step, span):
    """fullgraph=True over aliased params (the span's buffers over the slots'): exact, no late copy."""
    import runtime

    want = copy.deepcopy(model)(IDS)
    plan = span_plan(spec, blocks, step, span)
    torch._dynamo.reset()
    with runtime.apply(plan, model, device="cpu", stats=True) as h:
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        for _ in range(3):
            assert torch.equal(compiled(IDS), want)
        assert all(f["late_copies"] == 0 for f in h.stats()["forwards"])
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("blocks,step,span", [CASES[0], CASES[2], CASES[4]])
def test_gpu_span_plans_eager_and_graph_bit_identical(blocks, step, span):
    """On the GPU the copies run on the copy stream: a span's copy issued before the last user of the slots'
    bytes finished, or a slot's before the span ran, would change the output."""
    from models import LlamaConfig, make_llama
    from test_runtime_gpu import assert_exact_on_gpu

    base = make_llama(LlamaConfig(vocab=512, dim=256, layers=9, heads=4, kv_heads=2, hidden=704))
    assert_exact_on_gpu(base, lambda s: span_plan(s, blocks, step, span))


def test_vllm_export_names_the_span(prefill_plan):
    from planner.vllm.export import export

    out = export(prefill_plan)
    assert out.flags is None and any(p.part == "a layer spanning the slots" for p in out.problems)


def test_a_given_prefetch_step_may_span_too():
    """offload.prefetch_step fixes the slots; the LM head may still span them where that is faster."""
    import planner
    from schemas.workload import Workload, WorkloadItem

    prefill = Workload({"prefill": WorkloadItem(tokens=2048)})
    plan = planner.plan(_llama_spec(), gpu_budget=int(1.2e9), workload=prefill, prefetch_step=2)
    head = next(layer for layer in plan.layers if layer.name == "lm_head")
    assert plan.summary.prefetch_step == 2 and head.prefetch is not None and head.prefetch.span
    decode = planner.plan(_llama_spec(), gpu_budget=int(1.2e9), workload=Workload({"decode": WorkloadItem(tokens=1)}),
                          prefetch_step=2)
    # at decode too: read through UVA, the head's 1.05 GB would share the one host link with the blocks' copies
    # (planner/cost/link.py); with each stream at the link's full rate, UVA was cheaper here
    assert next(layer for layer in decode.layers if layer.name == "lm_head").prefetch.span
