"""The prefetch buffer pool: one GPU buffer per (param, shape, dtype, stride) key and slot id.

A layer's *signature* is the tuple of ``(key, bytes)`` of the params it offloads.
``build_pool`` is the single place that decides which buffers exist; the budget
search and the plan builder both size the pool with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.spec import Tensor

PoolKey = tuple[str, tuple[int, ...], str, tuple[int, ...] | None]  # param, shape, dtype, stride
Signature = tuple[tuple[PoolKey, int], ...]


@dataclass(frozen=True)
class PoolEntry:
    key: PoolKey
    nbytes: int  # of one buffer
    slots: tuple[int, ...]


def signature(tensors: Sequence[Tensor]) -> Signature:
    return tuple(((t.name, t.shape, t.dtype, t.stride), t.nbytes) for t in tensors)


def _sort_key(entry: PoolEntry) -> tuple:
    param, shape, dtype, stride = entry.key
    return (param, shape, dtype, stride is not None, stride or ())


def build_pool(signatures: Sequence[Signature], num_slots: int) -> list[PoolEntry]:
    """Buffers for offloaded layers in order, layer j using slot j % num_slots; sorted by key.

    Layers sharing one signature object (the repeats of a template) are grouped by identity,
    so sizing a pool for a long stack costs one pass over the layers plus one per distinct signature.
    """
    by_sig: dict[int, tuple[Signature, set[int]]] = {}
    for j, sig in enumerate(signatures):
        entry = by_sig.get(id(sig))
        if entry is None:
            entry = by_sig[id(sig)] = (sig, set())
        entry[1].add(j % num_slots)
    slots_of: dict[PoolKey, tuple[int, set[int]]] = {}
    for sig, slots in by_sig.values():
        for key, nbytes in sig:
            slots_of.setdefault(key, (nbytes, set()))[1].update(slots)
    entries = [PoolEntry(key, nbytes, tuple(sorted(slots))) for key, (nbytes, slots) in slots_of.items()]
    return sorted(entries, key=_sort_key)


def pool_bytes(entries: Sequence[PoolEntry]) -> int:
    return sum(e.nbytes * len(e.slots) for e in entries)
