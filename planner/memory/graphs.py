"""The GPU memory of the routed experts' decode graphs (runtime/shape_graphs.py), at most: the plan's
``memory.graph_bytes``.

Applied on a GPU, every experts module held as stacked tensors (transformers 5) replays its eager calls of at most
``GRAPHED_MAX_TOKENS`` tokens from CUDA graphs (schemas/expert_graphs.py), whatever the budget: resident, read
through UVA or split with the host. What they hold does not grow with the layers:

- the static inputs and output the graphs of one input shape share, for at most ``GRAPHED_MAX_SHAPES`` shapes,
  counted each at ``GRAPHED_MAX_TOKENS`` tokens (``static_bytes``);
- the pool the graphs are captured into, whose intermediates one capture after another reuses: the largest
  capture's (the routed experts' activations at ``GRAPHED_MAX_TOKENS`` tokens, planner/memory/activations.py),
  in the segments PyTorch's caching allocator reserves for them: blocks above 1 MiB in segments of 20 MiB (of
  their own size, rounded to 2 MiB, above 10 MiB), smaller ones in segments of 2 MiB.

A plan without stacked routed experts (a dense model, experts one module each) counts none.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.memory.activations import routed_bytes
from planner.memory.shapes import LayerShape
from schemas.expert_graphs import GRAPHED_MAX_SHAPES, GRAPHED_MAX_TOKENS, static_bytes

MiB = 1 << 20
SMALL_SEGMENT = 2 * MiB  # the caching allocator's segment for blocks of at most 1 MiB
LARGE_SEGMENT = 20 * MiB  # its segment for blocks of 1-10 MiB


def pool_bytes(work: int) -> int:
    """The segments a graph pool reserves for a capture whose intermediates reach ``work`` bytes: one small
    segment, and large ones enough to hold them all."""
    return SMALL_SEGMENT + LARGE_SEGMENT * max(1, -(-work // LARGE_SEGMENT))


def graph_bytes(shapes: Sequence[LayerShape], dt: int) -> int:
    """What the decode graphs of a model of ``shapes`` may hold on the GPU, activations of ``dt`` bytes."""
    experts = [s.experts for s in shapes if s.experts is not None and s.experts.stacked]
    if not experts:
        return 0
    t = GRAPHED_MAX_TOKENS
    static = max(static_bytes(t, e.hidden, e.top_k, dt) for e in experts)
    return GRAPHED_MAX_SHAPES * static + pool_bytes(max(routed_bytes(e, t, dt) for e in experts))
