"""A narrow weight read through UVA (``uva_passes_narrow``): the GPU's matmul tiles a narrow matrix's rows finer, so
it re-reads the weight more often than the wide weight's curve says (the H200: 1,024 x 4,096 at 2,048 rows 15.5
reads against 7.9). calibrate measures the narrow weight's curve; the cost model prices weights of at most
``NARROW_UVA``'s outputs by it, others by ``uva_passes``, and every weight by ``uva_passes`` without it."""

from __future__ import annotations

import pytest

from planner.cost.layer import layer_times
from schemas.hardware import load_hardware
from schemas.hardware_profile import NARROW_UVA, UvaPoint
from test_cost_model import HW, _layer

NARROW = [UvaPoint(tokens=1, passes=1.0), UvaPoint(tokens=16, passes=1.0), UvaPoint(tokens=256, passes=4.0),
          UvaPoint(tokens=4096, passes=32.0)]


def test_the_narrow_curve_prices_weights_of_at_most_its_outputs():
    hw = HW.model_copy(update={"uva_passes_narrow": NARROW})
    assert hw.passes(256, NARROW_UVA[0]) == 4.0 and hw.passes(256, 512) == 4.0
    assert hw.passes(256, NARROW_UVA[0] + 1) == 2.0 and hw.passes(256) == 2.0  # wide, or outputs unknown
    assert HW.passes(256, 512) == 2.0  # no narrow curve: the wide one for every weight


def test_a_narrow_weight_on_uva_is_read_by_the_narrow_curve():
    hw = HW.model_copy(update={"uva_passes_narrow": NARROW})
    params = {"self_attn.k_proj.weight": [1024, 100], "self_attn.q_proj.weight": [2048, 100]}
    layer = _layer(params, offloaded=list(params), uva=True)
    times = {t.rel: t for t in layer_times(layer.name, layer.params.items(), None, 256, hw)[0]}
    k, q = times["self_attn.k_proj.weight"], times["self_attn.q_proj.weight"]
    assert k.uva_link_ms == pytest.approx(1024 * 100 * 2 * 4.0 / 0.5e9 * 1e3)  # 4 reads at 0.5 GB/s
    assert q.uva_link_ms == pytest.approx(2048 * 100 * 2 * 2.0 / 0.5e9 * 1e3)  # the wide curve: 2
    plain = {t.rel: t for t in layer_times(layer.name, layer.params.items(), None, 256, HW)[0]}
    assert plain["self_attn.k_proj.weight"].uva_link_ms == pytest.approx(k.uva_link_ms / 2)


def test_the_bundled_profile_prices_a_narrow_weight_by_its_own_curve():
    """The bundled H200 profile carries calibrate's narrow curve (2026-12-03): at a 2,048-token prefill a weight of
    1,024 outputs (Llama's key and value projections) is read about 16 times through UVA, one of 4,096 outputs about
    8 times (the wide curve)."""
    hw = load_hardware("h200")
    assert hw.uva_passes_narrow is not None
    assert hw.passes(2048, 1024) == pytest.approx(16.0, rel=0.05)
    assert hw.passes(2048, 4096) == pytest.approx(8.0, rel=0.05)


def test_calibrate_reads_passes_from_times():
    pytest.importorskip("torch")
    from runtime.calibrate.link import passes_by_rows

    nbytes, gbps, fixed = 8_000_000, 50.0, 0.07  # 8 MB at 50 GB/s: 0.16 ms a read, beside 0.07 ms a call
    ms = {1: fixed + 0.16, 64: fixed + 0.15, 2048: fixed + 0.16 * 15.5}
    got = passes_by_rows(ms, nbytes, fixed, gbps)
    assert [p.tokens for p in got] == [1, 64, 2048]
    assert [p.passes for p in got] == [1.0, 1.0, 15.5]  # at least one read
    ms[64] = fixed + 0.16 * 3
    ms[256] = fixed + 0.16 * 2  # a dip: the timing's noise
    rising = passes_by_rows(ms, nbytes, fixed, gbps, rising=True)
    assert [p.passes for p in rising] == [1.0, 3.0, 3.0, 15.5]
