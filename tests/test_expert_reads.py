"""A grouped kernel's reads of UVA experts under skewed routing (planner/cost/expert_reads.py), against the H200's
measured times of bench/probe_expert_passes.py (bench/results/probes-h200-2026-12-02/expert-passes.json)."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT
from planner.cost.expert_reads import TILE_ROWS, is_uniform, measured_reads, tiles, uniform_reads
from schemas.hardware import load_hardware
from schemas.hardware_profile import UvaPoint

PROBE = ROOT / "bench" / "results" / "probes-h200-2026-12-02" / "expert-passes.json"


def test_tiles_count_an_experts_reads_by_its_rows():
    assert tiles([0.0, 0.0], 2048) == 0.0
    assert tiles([1.0], 1) == pytest.approx(1.0)  # one row: one tile
    assert tiles([1.0], TILE_ROWS) == pytest.approx(1.0)
    assert tiles([1.0], TILE_ROWS + 1) == pytest.approx(2.0)  # one row more than a tile: read twice
    assert tiles([1.0], 10 * TILE_ROWS) == pytest.approx(10.0)
    # two experts of 64 rows each on average, a tile each when touched
    assert tiles([0.5, 0.5], 128) == pytest.approx(2.0, rel=1e-3)
    assert is_uniform([0.25] * 4) and not is_uniform([0.5, 0.0])


def test_uniform_shares_give_the_calibrated_curve():
    hw = load_hardware("h200")
    for tokens in (1, 32, 2048, 8192):
        assert measured_reads([8 / 128] * 128, (128, 8), tokens, hw) == pytest.approx(
            uniform_reads((128, 8), tokens, hw))


def test_skewed_routing_reads_as_measured_on_the_h200():
    """Experts drawn from 1/(e+1)^s at 32 and 2,048 tokens: the predicted time (the probe's call cost and rate,
    the curve calibrate measured in that run) within 8% of the measured one for each s; the curve at each
    expert's own rows was 15-21% short at 2,048 tokens for s = 1.0 and 1.5."""
    torch = pytest.importorskip("torch")
    found = [json.loads(line) for line in PROBE.read_text().splitlines()][-1]
    hw = load_hardware("h200").model_copy(
        update={"uva_expert_passes": [UvaPoint(**p) for p in found["uva_expert_passes"]]})
    per_expert_ms = 128 * 3 * 2048 * 768 * 2 / 128 / found["uva_gbps"] / 1e6
    for row in found["skewed"]:
        law = 1.0 / torch.arange(1, 129, dtype=torch.float) ** row["s"]
        sample = torch.multinomial(law.expand(20000, 128), 8, replacement=False,
                                   generator=torch.Generator().manual_seed(5))
        q = (torch.bincount(sample.flatten(), minlength=128).double() / 20000).tolist()  # each expert's chance
        predicted = 2 * found["uva_expert_call_ms"] + per_expert_ms * measured_reads(q, (128, 8), row["tokens"], hw)
        assert predicted / row["measured_ms"] == pytest.approx(1.0, abs=0.08), row


def test_tall_tiles_count_twice_the_rows_a_tile():
    """The runtime's padded call (tall tiles, runtime/experts_forward.py): uniform routing's tiles of 256 rows at the full
    tokens, times the share of its tiles of 128 the curve reads there; a routing all but uniform reads as uniform
    does; a skewed routing's busy experts are read fewer times than in short tiles."""
    from planner.cost.expert_reads import touched_by, touched_experts, uva_passes

    hw = load_hardware("h200")
    moe, tokens = (128, 8), 2048
    uniform = [8 / 128] * 128
    hit = touched_experts(128, 8, tokens)
    share = uniform_reads(moe, tokens, hw) / tiles(uniform, tokens)
    assert share == pytest.approx(hw.expert_passes(128.0) * hit / tiles(uniform, tokens))
    want = max(1.0, tiles(uniform, tokens, 2 * TILE_ROWS) * share / hit)  # a touched expert read once at least
    assert tiles(uniform, tokens, 2 * TILE_ROWS) == pytest.approx(128, rel=1e-3)  # 128 rows each: one tall tile
    assert uva_passes(None, moe, tokens, hit, tokens * 8 / hit, hw, 128) == pytest.approx(want)
    near = [8 / 128 * (1 + 1e-6 * (e % 2 - 0.5)) for e in range(128)]
    assert not is_uniform(near)
    touched, rows = touched_by(near, tokens)
    assert uva_passes(near, moe, tokens, touched, rows / touched, hw, 128) == pytest.approx(want, rel=1e-4)
    skewed = [0.5] * 8 + [7.0 / 120] * 120  # Σ = 8: every token picks each hot expert with chance 1/2
    touched, rows = touched_by(skewed, tokens)
    tall = uva_passes(skewed, moe, tokens, touched, rows / touched, hw, 128)
    short = uva_passes(skewed, moe, tokens, touched, rows / touched, hw)  # transformers' unpadded call
    assert 1.0 < tall < short
