"""How many times a grouped expert matmul reads its UVA experts' weights, for uniform or measured routing.

A grouped kernel cuts each expert's rows into tiles and each tile reads the expert's whole weight: an expert
seeing r rows is read about ``ceil(r / TILE_ROWS)`` times, less what L2 catches when its tiles run together.
Measured on the H200 (bench/probe_expert_passes.py, Qwen3-MoE's experts through UVA, 2,048 tokens whose experts
follow 1/(e+1)^s): the expert reads the times imply, 192 / 188 / 210 / 224 for s = 0 / 0.5 / 1.0 / 1.5, against
``Σ ceil(r_e / 128)`` of the same routings 187 / 183 / 204 / 218 (within 3%), where the calibrated curve read at
each expert's own rows gave 15-21% too few at s = 1.0 and 1.5 and the curve at the mean rows far fewer.

So: under uniform routing, the calibrated curve (``expert_passes`` at the rows a touched expert sees) times the
touched experts, as calibrate measured it; under measured routing (expert e picked by a token with chance q_e),
the expected tile reads of that routing scaled by what the curve gives uniform routing at the same tokens over
its own tile reads (the L2's share at that size: 1.0 at 128 rows an expert, about half at 2,048)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from schemas.grouped_tiles import padded_rows, tall_tiles
from schemas.hardware_profile import HardwareProfile

TILE_ROWS = 128  # rows a tile of the grouped kernel takes (torch's grouped_mm on the H200 at 2,048 tokens)


def _tail(n: float, q: float, above: float) -> float:
    """P(r > above) for r ~ Binomial(n, q): the normal approximation with a continuity correction."""
    mean, var = n * q, n * q * (1.0 - q)
    if var <= 0.0:
        return 1.0 if mean > above else 0.0
    z = (above + 0.5 - mean) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def tiles(q: Sequence[float], tokens: float, tile_rows: int = TILE_ROWS) -> float:
    """Expected ``Σ_e ceil(r_e / tile_rows)`` when ``tokens`` tokens each pick expert e with chance ``q[e]``."""
    return _tiles(tuple(q), float(tokens), tile_rows)


@lru_cache(maxsize=1 << 12)
def _tiles(q: tuple[float, ...], tokens: float, tile_rows: int) -> float:
    total = 0.0
    for x in q:
        x = min(max(x, 0.0), 1.0)
        if x <= 0.0:
            continue
        total += 1.0 - (1.0 - x) ** tokens  # read at least once when touched
        mean, sd = tokens * x, math.sqrt(tokens * x * (1.0 - x))
        j = 1
        while j * tile_rows <= mean + 8.0 * sd + 1.0:
            total += _tail(tokens, x, j * tile_rows)
            j += 1
    return total


def touched_by(q: Sequence[float], tokens: float) -> tuple[float, float]:
    """(experts expected to be touched, rows they see in all) at ``tokens`` tokens when expert ``e`` is picked by
    a token with chance ``q[e]`` (measured routing)."""
    return sum(1.0 - (1.0 - min(x, 1.0)) ** tokens for x in q), tokens * sum(q)


def touched_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts hit by ``tokens`` tokens routed uniformly to ``top_k`` of ``experts``."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def uniform_reads(moe: tuple[int, int], tokens: float, hw: HardwareProfile) -> float:
    """Expected expert reads (in experts' weights, summed) of a grouped matmul over ``moe``'s (experts, top-k)
    experts at ``tokens`` tokens routed uniformly: the touched experts at the calibrated curve's passes."""
    experts, top_k = moe
    touched = touched_experts(experts, top_k, tokens)
    return touched * hw.expert_passes(tokens * top_k / max(touched, 1e-9))


def measured_reads(q: Sequence[float], moe: tuple[int, int], tokens: float, hw: HardwareProfile,
                   tile_rows: int = TILE_ROWS) -> float:
    """The same for the experts whose chances of being picked are ``q`` (all of a layer's, or one part's) in a
    layer of ``moe``: their tile reads (tiles of ``tile_rows``), times the curve's share of the tile reads under
    uniform routing (its calls' own tiles, of ``TILE_ROWS``)."""
    experts, top_k = moe
    flat = tiles((top_k / experts,) * experts, tokens)
    return tiles(q, tokens, tile_rows) * uniform_reads(moe, tokens, hw) / max(flat, 1e-9)


def is_uniform(q: Sequence[float]) -> bool:
    """Whether every expert in ``q`` is as likely as the others (the curve applies as calibrated)."""
    return not q or max(q) - min(q) <= 1e-12


def taller_tiles(moe: tuple[int, int], tokens: float, group: int) -> bool:
    """Whether the runtime's grouped call over ``group`` of the layer's experts (all of them: a layer with experts on
    UVA, runtime/experts_forward.py; fewer: a split layer's part), every pair of ``tokens`` tokens among its rows and
    padded as the runtime pads it, takes tiles twice as tall as the calibrated curve's call over all of them
    (transformers' module, unpadded) does: schemas/grouped_tiles.py. A 2,048-token prefill at top-8 of 128: the
    curve's call 128 rows a group, short tiles; the runtime's padded past it, and a part of 78 at 210: tall (H200:
    split layers 17-28 ms against 28-35 through the module, 2026-12-02)."""
    experts, top_k = moe
    pairs = int(tokens * top_k)
    return 0 < group <= experts and tall_tiles(padded_rows(pairs, group), group) and not tall_tiles(pairs, experts)


def uva_passes(q: Sequence[float] | None, moe: tuple[int, int], tokens: float, touched: float, rows: float,
               hw: HardwareProfile, group: int | None = None) -> float:
    """Reads of each of the ``touched`` UVA experts whose chances are ``q`` (None: uniform routing), each seeing
    ``rows`` rows on average, in a layer of ``moe``: the calibrated curve at those rows where routing is uniform,
    else the tiles of the measured routing (``measured_reads``). ``group``: the experts of the runtime's grouped call
    that reads them (None: transformers' module's own call, as the curve was calibrated). Where its tiles are twice
    as tall as the curve's (``taller_tiles``): the routing's tiles of twice ``TILE_ROWS`` at the full tokens (uniform
    routing's where ``q`` is None or uniform), times the share of its short tiles that the curve reads at this size
    under uniform routing (``uniform_reads`` over ``tiles``: the L2's catch, as ``measured_reads`` scales), and at
    least once. Not the curve at half the rows: calibrate's curve has no point between 32 and 128 rows an expert,
    and its line between them (1.16 passes at 64, where the dense curve's own point says 1.02) priced the H200's
    padded prefills 1.13-1.19x a layer (docs/BENCHMARKS.md, 2026-12-03)."""
    if group is not None and taller_tiles(moe, tokens, group):
        # tiles twice as tall, counted at the full tokens, times the share of its tiles the curve reads at this size
        experts, top_k = moe
        q = (top_k / experts,) * experts if q is None or is_uniform(q) else q
        reads = measured_reads(q, moe, tokens, hw, 2 * TILE_ROWS) / max(touched_by(q, tokens)[0], 1e-9)
        return max(1.0, reads)  # each touched expert read once at least
    if q is None or is_uniform(q):
        return hw.expert_passes(rows)
    return measured_reads(q, moe, tokens, hw) / max(touched, 1e-9)
