"""The spec as the planner sees it: the layer graph, and which params of which layers may be offloaded.

The graph: layers in execution order as a networkx DiGraph, tied params as extra edges.
Nodes are layer names (insertion order = execution order) with the attributes
``index``, ``layer`` (the expanded ``schemas.Layer``), ``params`` (its own tensors)
and ``bytes`` (their storage bytes; tied params are counted at their owner only).
Edges ``i -> i+1`` carry ``kind="next"``. A layer whose param shares storage with a
param of another layer gets an edge from itself to the owner with ``kind="tied"``;
every edge has a ``tied`` list of ``(param, owner's full name)`` pairs (empty for
plain ``next`` edges; an owner right after the tied layer keeps ``kind="next"``).

Eligibility: a layer's own params that may be offloaded, and the group rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from planner.kinds import param_kind
from schemas.numbered import split_numbered
from schemas.spec import Layer, Tensor


def build_graph(layers: Sequence[Layer]) -> nx.DiGraph:
    graph = nx.DiGraph()
    owner_layer: dict[str, str] = {}
    previous = None
    for layer in layers:
        graph.add_node(layer.name, index=layer.index, layer=layer, params=layer.params, bytes=layer.nbytes)
        for t in layer.params:
            owner_layer[f"{layer.name}.{t.name}"] = layer.name
        if previous is not None:
            graph.add_edge(previous, layer.name, kind="next", tied=[])
        previous = layer.name
    for layer in layers:
        for rel, target in layer.tied.items():
            owner = owner_layer[target]
            if not graph.has_edge(layer.name, owner):
                graph.add_edge(layer.name, owner, kind="tied", tied=[])
            graph.edges[layer.name, owner]["tied"].append((rel, target))
    return graph


def layers_in_order(graph: nx.DiGraph) -> list[Layer]:
    return [data["layer"] for _, data in graph.nodes(data=True)]


def tied_edges(graph: nx.DiGraph) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(tied layer, owner layer, [(param, owner param)]) for every edge that carries ties."""
    return [(u, v, d["tied"]) for u, v, d in graph.edges(data=True) if d["tied"]]


def tied_owners(graph: nx.DiGraph) -> dict[str, set[str]]:
    """Owner layer -> its params (relative names) that another param shares storage with."""
    owners: dict[str, set[str]] = {}
    for _, owner, pairs in tied_edges(graph):
        for _, target in pairs:
            owners.setdefault(owner, set()).add(target[len(owner) + 1:])
    return owners


def find_block_stack(graph: nx.DiGraph) -> list[str]:
    """The longest run of consecutive layers named ``<prefix>.<int>`` with consecutive ints.

    The first such run wins a tie; an empty list when no layer name ends in an int.
    """
    names = list(graph.nodes)
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
