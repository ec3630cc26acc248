"""The buffer pool of a placement (layer -> param -> backend): the prefetched layers' signatures and
``schemas.buffer_pool.build_pool``. The plan assembler writes it into the plan; strategy auto sizes
candidate placements with it where the pool's upper bound is not enough (a layer spanning the slots)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from schemas.buffer_pool import PoolEntry, Signature, build_pool, signature
from schemas.schedule import num_slots
from schemas.spec import Layer


def layers_with_prefetch(layers: Sequence[Layer], where: Mapping[str, Mapping[str, str]]) -> list[Layer]:
    """The layers with a prefetched param, in execution order."""
    return [layer for layer in layers if any(b == "prefetch" for b in where.get(layer.name, {}).values())]


def signatures(prefetched: Sequence[Layer], where: Mapping[str, Mapping[str, str]]) -> list[Signature]:
    """The pool signature of each prefetched layer: its prefetched params (one object per distinct value).

    Layers listing the same params share one tuple of them (schemas/spec.py), so a signature is made
    once per distinct (params, prefetched names)."""
    interned: dict[Signature, Signature] = {}
    made: dict[tuple, Signature] = {}
    out = []
    for layer in prefetched:
        mine = where[layer.name]
        key = (id(layer.params), *(p for p, b in mine.items() if b == "prefetch"))
        sig = made.get(key)
        if sig is None:
            sig = signature(t for t in layer.params if mine.get(t.name) == "prefetch")
            sig = made[key] = interned.setdefault(sig, sig)
        out.append(sig)
    return out


def pool_of(prefetched: Sequence[Layer], where: Mapping[str, Mapping[str, str]], step: int,
            span: Collection[str] = ()) -> tuple[int, list[PoolEntry]]:
    """(slot count, pool entries) of the prefetched layers at prefetch step ``step``; ``span``: the names of
    the layers that span the slots."""
    spanning = [layer.name in span for layer in prefetched]
    slots = num_slots(len(prefetched) - sum(spanning), step)
    return slots, build_pool(signatures(prefetched, where), slots, spanning)
