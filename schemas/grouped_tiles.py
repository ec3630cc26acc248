"""How tall the tiles of torch's grouped matmul are: what the runtime steers and the planner prices.

torch's grouped matmul (aten/src/ATen/native/cuda/GroupMM.cu) picks its tile by a call's rows over its groups:
at most ``SHORT_TILE_ROWS``, short tiles (64 rows on sm90), above it tiles twice as tall. Each tile of an expert's
rows reads the expert's whole weight, so through UVA a tall tile halves the re-reads of an expert that sees more
rows than a short tile holds. Measured on the H200 (bench/probe_uva_paths.py, one Qwen3-MoE experts module read
through UVA at 2,048 tokens: 128 rows a group over all 128 experts): one call over all experts 35.7 ms, the same
experts in two calls of 64 (256 rows a group) 25.7 ms, the outputs bit for bit the same (2026-12-02).

The runtime gives a call in the band just below (``padded_rows``: more than half of ``SHORT_TILE_ROWS`` rows a
group, at most all of it) rows past its last group's end, which the kernel does not compute, so that it takes
tall tiles (runtime/expert_math.py); the planner counts such a call's tiles twice as tall against the calibrated
curve, which is transformers' module's calls (planner/cost/expert_reads.py ``uva_passes``)."""

from __future__ import annotations

SHORT_TILE_ROWS = 128  # the most rows a group at which torch's grouped matmul takes its short tiles


def tall_tiles(rows: int, groups: int) -> bool:
    """Whether a grouped call of ``rows`` rows over ``groups`` groups takes the tall tiles."""
    return groups > 0 and rows // groups > SHORT_TILE_ROWS


def padded_rows(rows: int, groups: int) -> int:
    """The rows the runtime gives a grouped call of ``rows`` real rows over ``groups`` groups: just enough more for
    the tall tiles where the call has more than half the short tile's rows a group and would take the short ones
    (at most twice its rows), else ``rows``."""
    if groups <= 0 or tall_tiles(rows, groups) or rows // groups <= SHORT_TILE_ROWS // 2:
        return rows
    return (SHORT_TILE_ROWS + 1) * groups
