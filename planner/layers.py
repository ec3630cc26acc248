"""The spec as the planner sees it: the layers in execution order and the ties between them, and which params of
which layers may be offloaded.

The layer graph (``LayerGraph``): the expanded layers in execution order (each runs after the one before
it), and the ties: a layer whose param shares storage with a param of another layer (its owner) holds, per
owner layer, the ``(param, owner's full name)`` pairs. Plain data: the planner walks the layers in order and
looks ties up by layer; nothing asks a graph question of them (docs/DESIGN.md, "Why no graph library").

Eligibility: a layer's own params that may be offloaded, and the group rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.kinds import expert_count_problems, param_kind
from schemas.errors import InputError
from schemas.numbered import split_numbered
from schemas.spec_layers import Layer, Tensor


def expert_problems(layer: Layer) -> list[str]:
    """The spec layer's routed-expert tensors that do not hold its ``moe``'s experts (schemas.kinds)."""
    if layer.moe is None:
        return []
    return expert_count_problems(layer.name, layer.moe.experts, ((t.name, t.shape, t.kind) for t in layer.params))


@dataclass(frozen=True)
class LayerGraph:
    layers: tuple[Layer, ...]  # in execution order
    ties: dict[str, dict[str, list[tuple[str, str]]]]  # tied layer -> owner layer -> [(param, owner's full name)]

    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]


def build_graph(layers: Sequence[Layer]) -> LayerGraph:
    problems = [p for layer in layers for p in expert_problems(layer)]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise InputError("the spec's routed experts do not match their layer's moe: " + "; ".join(problems[:3]) + more)
    owner_layer = {f"{layer.name}.{t.name}": layer.name for layer in layers for t in layer.params}
    ties: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for layer in layers:
        for rel, target in layer.tied.items():
            ties.setdefault(layer.name, {}).setdefault(owner_layer[target], []).append((rel, target))
    return LayerGraph(tuple(layers), ties)


def layers_in_order(graph: LayerGraph) -> list[Layer]:
    return list(graph.layers)


def tied_edges(graph: LayerGraph) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(tied layer, owner layer, [(param, owner param)]) for every pair of layers that a tie joins, in
    execution order of the tied layer, its owners in the order its ties name them."""
    return [(layer, owner, pairs) for layer, owners in graph.ties.items() for owner, pairs in owners.items()]


def tied_owners(graph: LayerGraph) -> dict[str, set[str]]:
    """Owner layer -> its params (relative names) that another param shares storage with."""
    owners: dict[str, set[str]] = {}
    for _, owner, pairs in tied_edges(graph):
        for _, target in pairs:
            owners.setdefault(owner, set()).add(target[len(owner) + 1:])
    return owners


def find_block_stack(graph: LayerGraph) -> list[str]:
    """The longest run of consecutive layers named ``<prefix>.<int>`` with consecutive ints.

    The first such run wins a tie; an empty list when no layer name ends in an int.
    """
    names = graph.names
    best = (0, 0)  # (start, length)
    start = 0
    last: tuple[str, int] | None = None
    for i, name in enumerate(names):
        here = split_numbered(name)
        if here is None:
            start = i + 1
        elif last is None or here != (last[0], last[1] + 1):
            start = i
        last = here
        if i + 1 - start > best[1]:
            best = (start, i + 1 - start)
    return names[best[0]:best[0] + best[1]]


def matches_segments(name: str, segment: str) -> bool:
    """True when ``segment`` occurs in the dotted ``name`` as a run of whole segments."""
    parts, want = name.split("."), segment.split(".")
    n = len(want)
    return any(parts[i:i + n] == want for i in range(len(parts) - n + 1))


def eligible_params(layer: Layer, segments: Sequence[str] | None, shared: set[str],
                    kinds: Sequence[str] | None = None) -> tuple[Tensor, ...]:
    """The layer's own params that may be offloaded (``shared``: params another param is tied to).

    A param must match one of ``segments`` and be of one of ``kinds``, each when given.
    """
    return tuple(
        t for t in layer.params
        if t.name not in shared and (segments is None or any(matches_segments(t.name, s) for s in segments))
        and (kinds is None or param_kind(layer.name, t.name, t.kind) in kinds)
    )


def group_rule(num_layers: int, group_size: int, num_in_group: int) -> list[int]:
    """vLLM's rule: stack index i is offloaded iff i % group_size >= group_size - num_in_group."""
    return [i for i in range(num_layers) if i % group_size >= group_size - num_in_group]


def longest_run(positions: Sequence[int], num_layers: int) -> int:
    """Longest run of consecutive positions (sorted) among ``num_layers``, wrapping past the end."""
    if not positions:
        return 0
    if len(positions) >= num_layers:
        return num_layers
    best = run = 1
    for a, b in zip(positions, positions[1:]):
        run = run + 1 if b == a + 1 else 1
        best = max(best, run)
    if positions[0] == 0 and positions[-1] == num_layers - 1:
        first = 1
        while first < len(positions) and positions[first] == first:
            first += 1
        best = max(best, first + run)
    return best
