"""The layer graph: layers in execution order as a networkx DiGraph, tied params as extra edges.

Nodes are layer names (insertion order = execution order) with the attributes
``index``, ``layer`` (the expanded ``schemas.Layer``), ``params`` (its own tensors)
and ``bytes`` (their storage bytes; tied params are counted at their owner only).
Edges ``i -> i+1`` carry ``kind="next"``. A layer whose param shares storage with a
param of another layer gets an edge from itself to the owner with ``kind="tied"``;
every edge has a ``tied`` list of ``(param, owner's full name)`` pairs (empty for
plain ``next`` edges; an owner right after the tied layer keeps ``kind="next"``).
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from schemas.numbered import split_numbered
from schemas.spec import Layer


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
