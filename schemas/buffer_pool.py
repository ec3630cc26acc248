"""The prefetch buffer pool: one GPU buffer per (param, shape, dtype, stride) key and slot id.

``PoolKey`` is the one definition of a buffer's key, used by the planner, the plan file's
``buffer_pool.keys``, the plan check and the runtime. A layer's *signature* is the tuple of
``(key, bytes)`` of the params it offloads. ``build_pool`` is the single place that decides
which buffers exist: the budget search and the plan builder size the pool with it, and the
plan check rebuilds it from a plan's offloaded layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple


class PoolKey(NamedTuple):
    """Params of offloaded layers with equal keys share buffers (one per slot)."""

    param: str  # name relative to its layer
    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...] | None  # None: contiguous

    @classmethod
    def of(cls, param: str, shape: Iterable[int], dtype: str, stride: Iterable[int] | None) -> PoolKey:
        """A key from list-valued fields (as a plan file holds them)."""
        return cls(param, tuple(shape), dtype, None if stride is None else tuple(stride))

    def sort_key(self) -> tuple:
        return (self.param, self.shape, self.dtype, self.stride is not None, self.stride or ())


Signature = tuple[tuple[PoolKey, int], ...]


@dataclass(frozen=True)
class PoolEntry:
    key: PoolKey
    nbytes: int  # of one buffer
    slots: tuple[int, ...]


def signature(tensors: Iterable) -> Signature:
    """The signature of a layer offloading ``tensors`` (anything with name, shape, dtype, stride, nbytes)."""
    return tuple((PoolKey(t.name, t.shape, t.dtype, t.stride), t.nbytes) for t in tensors)


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
    return sorted(entries, key=lambda e: e.key.sort_key())


def pool_bytes(entries: Sequence[PoolEntry]) -> int:
    return sum(e.nbytes * len(e.slots) for e in entries)
