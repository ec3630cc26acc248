"""The GPU memory of the routed experts' decode graphs (runtime/shape_graphs.py), at most: the plan's
``memory.graph_bytes``.

Applied on a GPU, every experts module held as stacked tensors (transformers 5) replays its eager calls of at most
``GRAPHED_MAX_TOKENS`` tokens from CUDA graphs (schemas/expert_graphs.py), whatever the budget: resident, read
through UVA or split with the host. What they hold does not grow with the layers:

- the static inputs and output the graphs of one input shape share, for at most ``GRAPHED_MAX_SHAPES`` shapes,
  counted each at ``GRAPHED_MAX_TOKENS`` tokens (``static_bytes``);
- the pool the graphs are captured into, whose intermediates one capture after another reuses, in the segments
  PyTorch's caching allocator reserves for it alone: blocks of at most 1 MiB in segments of 2 MiB, larger ones in
  segments of 20 MiB (of their own size, rounded to 2 MiB, above 10 MiB). The pool keeps the segments of every
  capture's blocks of either size, and the largest set of a capture's blocks alive at once is the routed experts'
  activations at ``GRAPHED_MAX_TOKENS`` tokens (planner/memory/activations.py, ``work``): so enough small segments
  to hold ``work`` and, where a block at that size passes 1 MiB, enough large ones to hold it too. Measured on the
  H200 for the Qwen3-MoE shape (bench/probe_graph_memory.py, docs/BENCHMARKS.md "The layer graphs' memory"): the
  pool 26 MiB (three small segments, from the 32-token capture, and one large) and static tensors of 1.4 MB for 8
  shapes, against 28 MiB and 4.0 MiB counted.

A plan without stacked routed experts (a dense model, experts one module each) counts none.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.memory.activations import routed_bytes
from planner.memory.shapes import LayerShape
from schemas.expert_graphs import GRAPHED_MAX_SHAPES, GRAPHED_MAX_TOKENS, static_bytes

MiB = 1 << 20
SMALL_BLOCK = MiB  # the caching allocator's largest small block
SMALL_SEGMENT = 2 * MiB  # its segment for blocks of at most 1 MiB
LARGE_SEGMENT = 20 * MiB  # its segment for blocks of 1-10 MiB


def pool_bytes(work: int, largest: int) -> int:
    """The segments a graph pool reserves for captures whose blocks alive at once reach ``work`` bytes, the largest
    block ``largest``: small segments to hold them all, and large ones too where a block is above 1 MiB."""
    large = LARGE_SEGMENT * -(-work // LARGE_SEGMENT) if largest > SMALL_BLOCK else 0
    return SMALL_SEGMENT * max(1, -(-work // SMALL_SEGMENT)) + large


def graph_bytes(shapes: Sequence[LayerShape], dt: int) -> int:
    """What the decode graphs of a model of ``shapes`` may hold on the GPU, activations of ``dt`` bytes."""
    experts = [s.experts for s in shapes if s.experts is not None and s.experts.stacked]
    if not experts:
        return 0
    t = GRAPHED_MAX_TOKENS
    static = max(static_bytes(t, e.hidden, e.top_k, dt) for e in experts)
    work = max(routed_bytes(e, t, dt) for e in experts)
    largest = max(t * e.top_k * max(e.hidden, 2 * e.inner) * dt for e in experts)  # gathered rows, gate and up
    return GRAPHED_MAX_SHAPES * static + pool_bytes(work, largest)
