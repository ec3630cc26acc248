"""The one check of tensor names and ties over the expanded layers.

Every tensor has one full name, ``<layer>.<param>``, and each full name belongs to one
entry: a param (or buffer) of one layer, or a tied name of one layer. Layer names may nest
(``model`` and ``model.embed``), so ``model``'s ``embed.weight`` and ``model.embed``'s
``weight`` are the same name; listing it twice as two params, or tying it twice, is refused.
A name listed as a param and tied as well is the tie (``drop_tied_params``): the tie wins, and
the listed shape and dtype must be its target's. A tie points at the param that holds the storage:
not at itself, not at another tied name (no chains), and not at a name no layer lists. A tied name
takes its target's shape and dtype; it has none of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from schemas.spec_layers import Layer, Tensor


def _entry(layer: str, rel: str, tied: bool) -> str:
    return f"layer '{layer}' {'ties' if tied else 'lists'} it as {'tied param' if tied else 'param'} '{rel}'"


def _clash(layers: Sequence[Layer]) -> ValueError:
    """The first full name given twice (the slow path, run only when there is one)."""
    seen: dict[str, tuple[str, str, bool]] = {}
    for layer in layers:
        entries = [(t.name, False) for t in layer.params] + [(rel, True) for rel in layer.tied]
        for rel, tied in entries:
            full = f"{layer.name}.{rel}"
            if full in seen:
                first = _entry(*seen[full])
                return ValueError(f"layer '{layer.name}': {'tied param' if tied else 'param'} '{rel}' is the "
                                  f"tensor '{full}', and {first}; list each tensor once, as a param of one layer "
                                  "or as a tie")
            seen[full] = (layer.name, rel, tied)
    raise AssertionError("no clash found")  # pragma: no cover - called only when counts differ


def drop_tied_params(layers: Sequence[Layer]) -> list[Layer]:
    """``layers`` without the params that a tie names too (the tie wins); ValueError when such a param's
    shape or dtype is not its target's. Layers without such a param are returned as they are."""
    ties = {f"{layer.name}.{rel}": (layer.name, rel, target) for layer in layers for rel, target in layer.tied.items()}
    if not ties:
        return list(layers)
    params = {f"{layer.name}.{t.name}": t for layer in layers for t in layer.params}
    tied_params = {full for full in params if full in ties and ties[full][2] in params}
    if not tied_params:
        return list(layers)
    out = []
    for layer in layers:
        kept = tuple(t for t in layer.params if f"{layer.name}.{t.name}" not in tied_params)
        for t in layer.params:
            full = f"{layer.name}.{t.name}"
            if full in tied_params:
                _check_listed_tie(layer.name, t, ties[full], params[ties[full][2]])
        out.append(layer if len(kept) == len(layer.params) else dataclasses.replace(layer, params=kept))
    return out


def _check_listed_tie(layer: str, listed: Tensor, tie: tuple[str, str, str], target: Tensor) -> None:
    """A param that is tied too must have its target's shape and dtype (it is the same storage)."""
    for field in ("shape", "dtype"):
        mine, theirs = getattr(listed, field), getattr(target, field)
        if mine != theirs:
            show = (lambda v: list(v)) if field == "shape" else str
            tier = f"layer '{tie[0]}' ties it" if tie[0] != layer else "it is tied"
            raise ValueError(f"layer '{layer}': param '{listed.name}' has {field} {show(mine)}, but {tier} "
                             f"to '{tie[2]}', whose {field} is {show(theirs)}; a tied param shares its target's "
                             f"storage: give the {field} {show(theirs)} or drop the tie")


def _root(target: str, ties: dict[str, str]) -> str | None:
    """The name a chain of ties ends at (None for a cycle)."""
    seen = set()
    while target in ties:
        if target in seen:
            return None
        seen.add(target)
        target = ties[target]
    return target


def check_ties(layers: Sequence[Layer]) -> None:
    """ValueError, naming the layer and the param, for a full name given twice or a tie that does
    not point straight at a param."""
    owners = {f"{layer.name}.{t.name}" for layer in layers for t in layer.params}
    ties = {f"{layer.name}.{rel}": target for layer in layers for rel, target in layer.tied.items()}
    listed = sum(len(layer.params) for layer in layers)
    tied = sum(len(layer.tied) for layer in layers)
    if len(owners) != listed or len(ties) != tied or not owners.isdisjoint(ties):
        raise _clash(layers)
    for layer in layers:
        for rel, target in layer.tied.items():
            if target in owners:
                continue
            here = f"layer '{layer.name}': tied param '{rel}' points to '{target}'"
            if target == f"{layer.name}.{rel}":
                raise ValueError(f"{here}, itself; tie it to the param that holds the storage")
            if target in ties:
                root = _root(target, ties)
                hint = (f"tie it to '{root}', the param that holds the storage" if root in owners
                        else "a chain of ties must end at a param")
                raise ValueError(f"{here}, which is itself tied (to '{ties[target]}'); {hint}")
            raise ValueError(f"{here}, which is not a param of any layer")
