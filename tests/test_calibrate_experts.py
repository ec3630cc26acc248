"""``planner calibrate``'s grouped expert figures (runtime/calibrate/experts.py ``moe_experts``): the routing it times."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("tokens", [16, 2048])
def test_calibrate_routes_uniformly_at_random(tokens):
    """``moe_experts`` times grouped expert calls under the cost model's uniform routing: each token picks 8
    distinct experts, every expert about equally often (not exactly: the rows' spread is what costs re-reads)."""
    from runtime.calibrate import _uniform_routing

    index = _uniform_routing(128, 8, tokens, torch.Generator().manual_seed(tokens))
    assert index.shape == (tokens, 8)
    assert all(len(set(row.tolist())) == 8 for row in index)
    counts = torch.bincount(index.flatten(), minlength=128).float()
    assert counts.sum() == tokens * 8
    if tokens == 2048:  # 128 rows an expert on average, spread as a binomial's (sd about 11)
        assert 80 < counts.min() and counts.max() < 180 and counts.std() > 3


def test_the_expert_compute_rate_by_rows_is_the_resident_points_from_128_rows_on():
    """``expert_tflops_rows`` from ``moe_experts``' resident timings (the H200's of 2026-12-02): flops over time from
    ``COMPUTE_ROWS`` rows an expert on (below, the module's time is its reads and fixed costs, which expert_gbps and
    the block floor hold), never falling as the rows grow."""
    from runtime.calibrate import tflops_by_rows

    expert_bytes = 3 * 2048 * 768 * 2  # a Qwen3-MoE expert in bf16
    raw = [{"rows_an_expert": 32, "tokens": 512, "resident_ms": 0.631},
           {"rows_an_expert": 128, "tokens": 2048, "resident_ms": 1.268},
           {"rows_an_expert": 512, "tokens": 8192, "resident_ms": 3.401},
           {"rows_an_expert": 2048, "tokens": 32768, "resident_ms": 14.0}]  # slower than it should: noise
    points = tflops_by_rows(raw, 8, expert_bytes)
    assert [p["tokens"] for p in points] == [128, 512, 2048]
    assert [p["tflops"] for p in points] == pytest.approx([121.9, 181.8, 181.8], abs=0.1)


@pytest.mark.parametrize("first, last, unsteady", [(55.0, 55.5, False), (46.7, 55.2, True), (55.0, 50.0, True),
                                                    (55.0, 52.3, False)])
def test_calibrate_says_when_the_link_moved_during_its_run(first, last, unsteady):
    """calibrate measures the link at its start and its end; more than 5% apart (a fresh H200 measured 46.7 GB/s
    at the start of a run whose plans then copied at 55, 2026-12-02): the user is told to run it again."""
    from runtime.calibrate import steadiness

    steady = steadiness(first, last)
    assert (steady["h2d_gbps_first"], steady["h2d_gbps_last"]) == (first, last)
    assert bool(steady["unsteady"]) is unsteady
    if unsteady:
        assert f"{first:.1f} GB/s" in steady["unsteady"] and "run calibrate again" in steady["unsteady"]


def test_calibrate_keeps_the_lower_of_each_cpu_cost_measured_at_its_start_and_end():
    """The issue costs are measured twice; a slow first minute (2,236 against 1,257 us a tiny MoE block on the
    H200's host, 2026-12-04) only adds time, so each keeps the lower; figures that are not costs stay the first's."""
    from runtime.calibrate import CPU_FIGURES, least_cpu

    first = {"launch_us": 10.7, "copy_call_us": 7.0, "moe_block_cpu_us": 2236.0, "block_cpu_us": 900.0,
             "moe_sync": False, "model_cpu_us": 0.0}
    last = {"launch_us": 7.1, "copy_call_us": 7.5, "moe_block_cpu_us": 1257.0, "block_cpu_us": 1000.0,
            "moe_sync": True, "model_cpu_us": 3.0}
    kept = least_cpu(first, last)
    assert kept == {"launch_us": 7.1, "copy_call_us": 7.0, "moe_block_cpu_us": 1257.0, "block_cpu_us": 900.0,
                    "moe_sync": False, "model_cpu_us": 0.0}
    assert least_cpu(first, {}) == first  # a second measurement without transformers: the first's figures
    assert set(CPU_FIGURES) >= {k for k in first if k != "moe_sync"}


def test_the_dense_read_rate_by_rows_is_what_the_block_leaves_after_its_floor():
    """``matmul_gbps_rows`` from the Llama-3-8B block replayed at ``DENSE_ROWS`` decode rows: the matrices' bytes over
    the time left after the block floor and the elementwise work the cost model adds beside the matmuls, so that
    the model adding them back gives the time measured."""
    from runtime.calibrate import DENSE_ROWS, read_by_rows

    block_bytes = 436_207_616  # the 8B block's seven matrices in bf16
    block_ms = {1: 0.230, 8: 0.232, 16: 0.236, 32: 0.290, 64: 0.300, 128: 0.330}
    elementwise = {rows: rows * 1e-4 for rows in DENSE_ROWS}
    points = read_by_rows(block_bytes, block_ms, 60.0, elementwise)
    assert [p.tokens for p in points] == list(DENSE_ROWS)
    for p in points:
        reads_ms = block_bytes / p.gbps / 1e6
        assert reads_ms + 0.060 + elementwise[p.tokens] == pytest.approx(block_ms[p.tokens], rel=1e-6)
    assert points[3].gbps < points[0].gbps  # 32 rows read slower than one


def test_calibrate_replays_a_real_block_by_rows_on_any_device():
    """``block_reads`` builds the transformers block of the shape it is given and times it at every row count (here
    a tiny shape on the CPU with the wall clock): one positive rate a row count."""
    pytest.importorskip("transformers")
    import time

    from runtime.calibrate import DENSE_ROWS, block_reads

    def wall(fn):
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3 + 1.0  # above the floor given, whatever the CPU's speed

    figures = block_reads(torch.device("cpu"), 10.0, 1.0, 1000.0, shape=(64, 128, 4, 2, 16), timer=wall)
    assert [p.tokens for p in figures["matmul_gbps_rows"]] == list(DENSE_ROWS)
    assert all(p.gbps > 0 for p in figures["matmul_gbps_rows"])
    assert sorted(figures["raw_block_ms"]) == list(DENSE_ROWS)


def test_a_replayed_block_is_the_models_difference_between_two_depths(monkeypatch):
    """``block_reads`` times the whole model at ``REPLAY_BLOCKS`` depths and takes a block as the difference over
    the blocks between (so the block pays the mask the model builds under capture, and the embedding and head
    cancel): a fake model whose time is 3 ms outside its blocks plus (0.5 + 0.01 rows) ms a block gives exactly that
    a block, whatever the outside costs."""
    import runtime.calibrate.block as block
    from runtime.calibrate import DENSE_ROWS, REPLAY_BLOCKS, block_reads

    class Fake(torch.nn.Module):
        def __init__(self, depth: int) -> None:
            super().__init__()
            self.depth = depth

        def forward(self, ids, use_cache=False):
            return 3.0 + self.depth * (0.5 + 0.01 * ids.shape[0])

    monkeypatch.setattr(block, "tiny_llama", lambda depth, config: Fake(depth))
    figures = block_reads(torch.device("cpu"), 10.0, 0.0, 1000.0, timer=lambda fn: float(fn()))
    for rows in DENSE_ROWS:
        assert figures["raw_block_ms"][rows] == pytest.approx(0.5 + 0.01 * rows)
        assert sorted(figures["raw_block_depth_ms"][rows]) == sorted(REPLAY_BLOCKS)
    rates = [p.gbps for p in figures["matmul_gbps_rows"]]
    assert rates == sorted(rates, reverse=True)  # more rows, more time a block, a slower read


def test_the_forward_outside_its_blocks_is_the_tiny_models_intercept():
    """``model_cpu_us``: the tiny Llama's forward at its fewer blocks less those blocks at the per-block figure of
    the two depths (never below 0: a timing whose depths disagree gives nothing, not a negative cost)."""
    from runtime.calibrate import TINY_BLOCKS, _per_block_us
    from runtime.calibrate.cpu import model_cpu_us

    few, many = TINY_BLOCKS
    times = {few: 2.3 + few * 0.5, many: 2.3 + many * 0.5}  # ms: 2.3 outside, 0.5 a block
    block = _per_block_us(times)
    assert block == pytest.approx(500.0)
    assert model_cpu_us(times, block) == pytest.approx(2300.0)
    assert model_cpu_us({few: 1.0, many: 30.0}, 2000.0) == 0.0
