"""The host link as one resource (planner/cost/link.py): prefetch copies and UVA reads share its bandwidth.

Measured on the H200: a pinned copy alone 55.4 GB/s, a UVA matmul read alone 51.3 GB/s, both at once on
two streams 53.3 GB/s together, the time of both the sum of each alone (a work-conserving link)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from conftest import EXAMPLES
from planner.cost.layer import LayerWork, layers_work
from planner.cost.link import ONE_LINK, Link, link_share
from planner.cost.timeline import Copy, simulate
from schemas.io import load_spec
from schemas.hardware import load_hardware


def w(gpu: float, copy: float = 0.0, uva: float = 0.0) -> LayerWork:
    """A layer of ``gpu`` ms of compute of which ``uva`` ms read over the link, and a ``copy`` ms copy."""
    return LayerWork(gpu_ms=gpu, cpu_ms=0.0, copy_ms=copy, copy_bytes=int(copy * 1e6), uva_link_ms=uva)


def test_a_uva_read_while_a_copy_is_in_flight_takes_turns_with_it():
    # layer 1 (2 ms, all UVA reads) runs while layer 2's 4 ms copy is on the link (issued at 0)
    t = simulate([w(1), w(2, uva=2), w(1, copy=4)], [Copy(2, 0, False)])
    # [1, 5]: both at half speed (the read needs 2 ms of link alone, the copy 3 ms more); the read is done
    # at 5, the copy's last 1 ms alone: [5, 6]; layer 2 waits for it
    assert t.layers[1].end == pytest.approx(5) and t.layers[2].copy_end == pytest.approx(6)
    assert t.layers[2].start == pytest.approx(6) and t.step_ms == pytest.approx(7)
    apart = simulate([w(1), w(2, uva=2), w(1, copy=4)], [Copy(2, 0, False)], share=1.0)  # two links
    assert apart.step_ms == pytest.approx(5) and apart.layers[1].end == pytest.approx(3)
    assert t.compute_ms == pytest.approx(4 + 2)  # the read took 2 ms longer on the compute stream


def test_a_layer_reads_its_late_kinds_after_its_other_work():
    """A layer whose every UVA param is of a kind that runs after its attention (an MLP, experts) starts reading at
    ``uva_at_ms``: a copy in flight has the link alone until then (the H200, the Qwen3-MoE shape with experts on UVA
    and attention prefetched, decode: replayed 1.11x with the reads from the layer's start, 1.02x so)."""
    late = LayerWork(gpu_ms=3, cpu_ms=0.0, copy_ms=0.0, copy_bytes=0, uva_link_ms=2, uva_at_ms=1)
    t = simulate([w(1), late, w(1, copy=2)], [Copy(2, 0, False)])
    # the copy [0, 2] alone; layer 1 runs [1, 4] and reads [2, 4], after the copy: nothing shared
    assert t.layers[2].copy_end == pytest.approx(2) and t.layers[1].end == pytest.approx(4)
    assert t.step_ms == pytest.approx(5)
    # read from the layer's start, the read [1, ...] meets the copy's last 1 ms: both at half, 1 ms later each
    early = simulate([w(1), w(3, uva=2), w(1, copy=2)], [Copy(2, 0, False)])
    assert early.layers[2].copy_end == pytest.approx(3) and early.layers[1].end == pytest.approx(5)
    assert early.step_ms == pytest.approx(6)


def test_only_late_kinds_on_uva_read_after_the_layers_other_work():
    from test_cost_model import _layer

    from planner.cost.layer import layer_work

    params = {"self_attn.q_proj.weight": [512, 512], "mlp.up_proj.weight": [2048, 512]}
    hw = load_hardware("h200")

    def work(uva: list[str], prefetch: list[str] = ()) -> LayerWork:
        layer = _layer(params, offloaded=uva + list(prefetch))
        return layer_work(layer.model_copy(update={"uva": uva}), 1, hw)

    mlp = work(["mlp.up_proj.weight"], ["self_attn.q_proj.weight"])
    assert 0 < mlp.uva_at_ms < mlp.gpu_ms and mlp.uva_link_ms > 0  # after the attention and the block's own work
    assert work(["self_attn.q_proj.weight"]).uva_at_ms == 0.0  # attention's reads begin with the layer
    assert work(["self_attn.q_proj.weight", "mlp.up_proj.weight"]).uva_at_ms == 0.0
    assert work([]).uva_at_ms == 0.0


def test_reads_with_no_copy_in_flight_are_not_slowed():
    t = simulate([w(1, copy=1), w(3, uva=3), w(1)], [Copy(0, 0, True)])
    # the copy for the next forward runs [0, 1] while layer 0 computes; layer 1 reads from 1: link idle
    assert t.layers[1].start == pytest.approx(1) and t.layers[1].end == pytest.approx(4)
    assert t.step_ms == pytest.approx(5)


def test_link_keeps_a_copy_queue_and_moves_the_copies_a_read_overlaps():
    link = Link(0.5)
    a = link.queue(0.0, 2.0)
    b = link.queue(0.0, 2.0)  # queued behind a: [2, 4]
    assert (a, b) == (0, 1)
    assert link.read(1.0, 1.0) == pytest.approx(1.0)  # 1 ms of read overlaps: 1 ms later, both of them
    assert (link.starts[a], link.ends[a]) == (0.0, pytest.approx(3.0))
    assert (link.starts[b], link.ends[b]) == (pytest.approx(3.0), pytest.approx(5.0))
    assert link.free == pytest.approx(5.0) and link.read(5.0, 3.0) == 0.0  # nothing left in flight


def test_the_share_comes_from_the_measured_concurrent_rate():
    hw = load_hardware("h200")
    assert hw.link_shared_gbps == pytest.approx(53.3)
    assert link_share(hw) == pytest.approx(0.5, abs=0.01)  # the H200: one link, taken in turns
    assert link_share(hw.model_copy(update={"link_shared_gbps": None})) == ONE_LINK  # older profiles
    assert link_share(hw.model_copy(update={"link_shared_gbps": 2 * hw.uva_gbps})) == 1.0  # two links
    assert 0.51 < link_share(hw.model_copy(update={"link_shared_gbps": 70.0})) < 1.0  # some of both at once


def test_a_user_mix_is_predicted_at_least_at_its_link_bound():
    # issue 19: UVA attention and prefetched MLPs, 136.9 ms before; its bytes need 168.9 ms on the link
    spec = load_spec(EXAMPLES / "generated" / "llama-3-8b.yaml")
    plan = planner.plan(spec, gpu_budget=8 * 10**9, strategy="budget", backend="prefetch",
                        backends={"attention": "uva", "dense_mlp": "prefetch"})
    hw = load_hardware("h200")
    work = layers_work(plan.layers, 1, hw)
    bound = sum(x.copy_ms + x.uva_link_ms for x in work)
    assert bound == pytest.approx(168.9, abs=0.1)
    assert plan.predictions.weighted_step_ms >= bound


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 5), st.floats(0, 5), st.floats(0, 1)), min_size=1, max_size=8),
       st.integers(1, 3))
def test_one_link_never_moves_more_than_its_time_allows(layers, slots):
    """With one shared link (share 0.5) a forward is never shorter than its copies and UVA reads end to end."""
    from schemas.schedule import schedule

    work = [w(gpu, copy=copy, uva=gpu * frac) for gpu, copy, frac in layers]
    positions = [i for i, x in enumerate(work) if x.copy_ms > 0]
    n = len(work)
    copies = [Copy(p, t.copy_before(n), t.previous_forward) for p, t in zip(positions, schedule(positions, n, slots))]
    t = simulate(work, copies, ONE_LINK)
    link = sum(x.copy_ms for x in work if x.copy_bytes) + sum(x.uva_link_ms for x in work)
    assert t.step_ms >= link - 1e-9
    assert t.step_ms <= simulate(work, copies, 1.0).step_ms + link + 1e-9
