"""Which eager experts calls the runtime replays from CUDA graphs (runtime/shape_graphs.py): one rule that the
runtime follows and the cost model prices (planner/cost/host_experts.py, planner/cost/layer.py).

At decode an eager experts call is the host's launches, not the GPU's work: transformers' grouped experts call and
the runtime's parts issue some 46 launches, a replay 4 (measured on the H200, docs/BENCHMARKS.md 2026-12-03). The
runtime replays, with ``apply``'s ``expert_graphs`` (by default where the plan's memory counts them), an eager call of at most ``GRAPHED_MAX_TOKENS``
tokens of

- a split layer's experts (``schemas/plan_experts.py``) when GPU kernels compute all of them at that call (no cpu
  experts, or a call above ``cpu_max_tokens``);
- an experts module not split (resident, or read through UVA) whose forward reads no value back (transformers'
  ``grouped_mm`` and ``batched_mm`` experts: the runtime checks; the cost model prices the per-expert loop as
  ``moe_sync``, which no graph holds);

and in both only where nothing else of the experts module is offloaded in a way that moves its place between calls
(a tensor copied into a prefetch slot): a graph reads the addresses it was captured with. A prefill's launches are
few beside its work, so it runs as launched.

All of that only in a plan applied with the layer graphs (``graphs_on``): not one whose memory counts none (the
spec's ``memory.graphs: 0``), where every eager experts call is launched, and the cost model prices it so.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from schemas.kinds import param_kind
from schemas.plan_experts import experts_module, host_computes
from schemas.plan_memory import PlanMemory

# a schemas.plan_content.PlanLayer (that module imports schemas.plan_experts, which this one does too)
PlanLayer = Any

GRAPHED_MAX_TOKENS = 64
"""Eager experts calls of at most this many tokens are replayed from graphs: decode batches."""

GRAPHED_MAX_SHAPES = 8
"""Input shapes (token counts) an applied plan's graphs are captured for; calls of further shapes run as launched."""

ROUTING_ID_BYTES = 8  # the routing's expert ids: int64
ROUTING_WEIGHT_BYTES = 4  # its weights: float32 at most (Mixtral's router keeps them so, Qwen3-MoE's in bf16)


def graphs_on(memory: PlanMemory | None) -> bool:
    """Whether a plan whose memory section is ``memory`` runs with the layer graphs (``apply``'s default
    ``expert_graphs=None``): where its memory counts them (``graph_bytes``; the spec's ``memory.graphs: 0`` leaves
    them out, and a model without stacked routed experts has none), and in a plan without a memory section (written
    before it). The runtime applies the plan so (runtime/apply.py ``graphs_counted``), ``predict`` prices it so and
    the search prices by the memory section it gives the plan (planner/build.py)."""
    return memory is None or memory.graph_bytes > 0


def static_bytes(tokens: int, hidden: int, top_k: int, act_bytes: int) -> int:
    """The static tensors the graphs of one input shape share (runtime/shape_graphs.py), at most: an experts
    call's hidden states in and out (``2·T·hidden`` in the activations' dtype) and its routing, ``T·top_k`` expert
    ids and weights."""
    return 2 * tokens * hidden * act_bytes + tokens * top_k * (ROUTING_ID_BYTES + ROUTING_WEIGHT_BYTES)


def moved_beside(module: str, kept: Collection[str], offloaded: Iterable[str]) -> bool:
    """Whether a tensor under ``module`` (relative to its layer; '' for the layer itself) is offloaded and not in
    ``kept`` (the tensors whose place stays put while the plan is applied)."""
    prefix = f"{module}." if module else ""
    return any(rel.startswith(prefix) and rel not in kept for rel in offloaded)


def offloaded_beside(layer: PlanLayer) -> bool:
    """Whether the plan offloads a tensor of ``layer``'s split experts module besides its split params (a norm's
    weight, say): one whose place may move between calls, which a graph of the module's arithmetic must not read."""
    split = layer.experts
    return moved_beside(experts_module(split.params), split.params, layer.offloaded)


def stacked_experts(layer: str, params: Iterable[tuple[str, Any]]) -> tuple[str, ...]:
    """Of a layer's (name, param) pairs (spec tensors or plan params: ``shape`` and ``kind``), the names of those
    holding its routed experts stacked (3-D and more, expert first, as transformers 5 stores them)."""
    return tuple(rel for rel, p in params
                 if len(p.shape) >= 3 and param_kind(layer, rel, p.kind) == "routed_experts")


def module_graphed(stacked: Sequence[str], uva: Collection[str], offloaded: Collection[str]) -> bool:
    """Whether the eager decode calls of the experts module holding ``stacked`` (a layer's routed experts params,
    not split: ``stacked_experts``) replay graphs: it has some, and every offloaded tensor of the module is read
    through UVA (none copied into a prefetch slot; ``uva``, ``offloaded``: the layer's names read so, and those
    offloaded, or only those copied)."""
    return bool(stacked) and not moved_beside(experts_module(stacked), uva, offloaded)


def graphed(layer: PlanLayer, tokens: float) -> bool:
    """Whether the runtime replays ``layer``'s eager experts call of ``tokens`` tokens from a CUDA graph (the
    module docstring; for an experts module not split, as long as its forward reads nothing back)."""
    if tokens > GRAPHED_MAX_TOKENS or layer.moe is None:
        return False
    split = layer.experts
    if split is None:
        return module_graphed(stacked_experts(layer.name, layer.params.items()), layer.uva, layer.offloaded)
    if host_computes(split, tokens):
        return False  # (the host's part is not captured)
    return not offloaded_beside(layer)
