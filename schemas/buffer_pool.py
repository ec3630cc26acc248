"""The prefetch buffer pool: one GPU buffer per (param, shape, dtype, stride) key and slot id.

``PoolKey`` is the one definition of a buffer's key, used by the planner, the plan file's
``buffer_pool.keys``, the plan check and the runtime. A layer's *signature* is the tuple of
``(key, bytes)`` of the params it offloads. ``build_pool`` is the single place that decides
which buffers exist: the budget search and the plan builder size the pool with it, and the
plan check rebuilds it from a plan's offloaded layers.

A spanning layer (schemas/schedule.py) has one buffer per key of its own, laid over the slots'
bytes: a pool with spanning layers is one arena (``arena_layout``: the slots one after the
other, the spanning buffers from its start), and its bytes are the arena's. A pool without them
is one allocation per buffer, and its bytes are their sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import not_
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


ALIGN = 256  # byte alignment of each buffer in an arena (what cudaMalloc guarantees for an allocation)


@dataclass(frozen=True)
class PoolEntry:
    key: PoolKey
    nbytes: int  # of one buffer
    slots: tuple[int, ...]
    span: bool = False  # one more buffer, for spanning layers, laid over the slots' bytes


def signature(tensors: Iterable) -> Signature:
    """The signature of a layer offloading ``tensors`` (anything with name, shape, dtype, stride, nbytes)."""
    return tuple((PoolKey(t.name, t.shape, t.dtype, t.stride), t.nbytes) for t in tensors)


def build_pool(signatures: Sequence[Signature], num_slots: int, span: Sequence[bool] = (),
               every_slot: bool = False) -> list[PoolEntry]:
    """Buffers for offloaded layers in order; sorted by key. ``span[j]``: layer j spans the slots
    (it has a span buffer per key); the others take slot ``i % num_slots`` in turn, ``i`` counting
    only them. ``every_slot``: each key has a buffer in every one of the ``num_slots`` slots (vLLM's pool).

    Layers sharing one signature object (the repeats of a template) are grouped by identity,
    and each slot's layers are read as one slice of their identities, so sizing a pool for a long stack costs a
    few passes over the layers at C speed plus one per distinct signature and slot.
    """
    if span and any(span):
        slotted = list(compress(signatures, map(not_, span)))
        spanning = {id(sig): sig for sig in compress(signatures, span)}
    else:
        slotted, spanning = list(signatures), {}
    ids = list(map(id, slotted))
    by_sig = dict(zip(ids, slotted))  # by identity, in the order first seen
    used: dict[int, set[int]] = {sid: set() for sid in by_sig}
    for slot in range(min(num_slots, len(ids))):  # the i-th slotted layer takes slot i % num_slots
        for sid in set(ids[slot::num_slots]):
            used[sid].add(slot)
    slots_of: dict[PoolKey, tuple[int, set[int]]] = {}
    for sid, sig in by_sig.items():
        for key, nbytes in sig:
            slots_of.setdefault(key, (nbytes, set()))[1].update(used[sid])
    span_keys: set[PoolKey] = set()
    for sig in spanning.values():
        for key, nbytes in sig:
            slots_of.setdefault(key, (nbytes, set()))
            span_keys.add(key)
    entries = [PoolEntry(key, nbytes, tuple(range(num_slots)) if every_slot else tuple(sorted(slots)), key in span_keys)
               for key, (nbytes, slots) in slots_of.items()]
    return sorted(entries, key=lambda e: e.key.sort_key())


@dataclass(frozen=True)
class Layout:
    """Where each buffer of an arena pool lies: (key, slot id or None for the span buffer) -> byte offset."""

    offsets: dict[tuple[PoolKey, int | None], int]
    nbytes: int


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def arena_layout(entries: Sequence[PoolEntry]) -> Layout:
    """The arena of a pool (``entries`` sorted by key, as ``build_pool`` returns them): slot 0's buffers,
    then slot 1's, ..., each aligned to ``ALIGN``; the span buffers from offset 0, over the slots."""
    offsets: dict[tuple[PoolKey, int | None], int] = {}
    cursor = 0
    for slot in sorted({s for e in entries for s in e.slots}):
        for e in entries:
            if slot in e.slots:
                offsets[(e.key, slot)] = cursor
                cursor = _aligned(cursor + e.nbytes)
    end = cursor
    cursor = 0
    for e in entries:
        if e.span:
            offsets[(e.key, None)] = cursor
            cursor = _aligned(cursor + e.nbytes)
    return Layout(offsets, max(end, cursor))


def has_span(entries: Sequence[PoolEntry]) -> bool:
    return any(e.span for e in entries)


def pool_bytes(entries: Sequence[PoolEntry]) -> int:
    """GPU bytes of the pool: the arena's with spanning layers, else the sum of its buffers."""
    if has_span(entries):
        return arena_layout(entries).nbytes
    return sum(e.nbytes * len(e.slots) for e in entries)
