"""The one shape every strategy's search takes: an order of moves, fixed before the budget is known.

A *move* takes some params of one layer off the GPU, onto one backend (prefetch or uva). An *order*
is the moves in the sequence a search takes them; taking the first ``n`` moves is a *prefix*, and a
strategy's plans are prefixes of its order (planner/strategy/fit.py picks one). The budget strategy's
order is its ladder (planner/strategy/budget.py), the group strategy's the group rule's layers
(planner/strategy/group.py), auto's the moves by predicted cost (planner/strategy/auto_order.py).

``tier_of`` is the one rule of ``offload.prefer``: the preferred kinds in their order, then the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from schemas.buffer_pool import Signature
from schemas.spec import Layer


class Move(NamedTuple):  # a tuple: a search makes and hashes thousands
    position: int  # the layer's position in execution order
    params: tuple[str, ...]
    nbytes: int
    backend: str  # uva | prefetch
    ms_per_byte: float = 0.0  # auto: weighted predicted cost of the move, per byte moved
    kinds: tuple[str, ...] = ()
    tier: int = 0  # offload.prefer: the rank of its kinds (0 without prefer)
    unique: bool = False  # auto: a UVA move of units that would rather be copied, in a layer no other layer is like


# a Move from all its fields, as one tuple in field order: faster than its constructor (a search makes thousands)
new_move = partial(tuple.__new__, Move)

Split = tuple[frozenset, frozenset]  # a layer's placement: (its params read through UVA, its params copied)
NOT_MOVED: Split = (frozenset(), frozenset())


def after_move(split: Split, move: Move) -> Split:
    """A layer's placement ``split`` once ``move`` is taken: its params read through UVA, or copied."""
    uva, copied = split
    moved = frozenset(move.params)
    if move.backend == "uva":
        return uva | moved, copied - moved
    return uva - moved, copied | moved


@dataclass(frozen=True)
class Order:
    """The moves in the order they are taken, and what a prefix of them costs in memory."""

    moves: tuple[Move, ...]
    signatures: tuple[Signature | None, ...]  # per move: the prefetched signature (None for UVA)
    slots: int  # the most buffer slots a plan of this order may use


def tier_of(kind: str, prefer: Sequence[str] | None) -> int:
    """The rank ``offload.prefer`` gives a kind: its index in the list, else one past the last."""
    if not prefer:
        return 0
    return prefer.index(kind) if kind in prefer else len(prefer)


def placement(order: Order, taken: int) -> dict[int, dict[str, str]]:
    """Layer position -> param -> backend for the first ``taken`` moves."""
    out: dict[int, dict[str, str]] = {}
    for move in order.moves[:taken]:
        target = out.get(move.position)
        if target is None:
            out[move.position] = dict.fromkeys(move.params, move.backend)
        else:
            target.update(dict.fromkeys(move.params, move.backend))
    return out


def by_name(layers: Sequence[Layer], placed: dict[int, dict[str, str]]) -> dict[str, dict[str, str]]:
    """A placement keyed by layer name (an Assignment's ``where``)."""
    return {layers[position].name: params for position, params in placed.items()}


def prefetched_layers(order: Order) -> list[int]:
    """After taking 0, 1, ..., len(order) moves: how many layers are prefetched."""
    out, seen = [0], set()
    for move in order.moves:
        if move.backend == "prefetch":
            seen.add(move.position)
        out.append(len(seen))
    return out


def offloaded_layers(order: Order) -> list[int]:
    """After taking 0, 1, ..., len(order) moves: how many layers have a param off the GPU."""
    out, seen = [0], set()
    for move in order.moves:
        seen.add(move.position)
        out.append(len(seen))
    return out
