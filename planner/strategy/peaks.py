"""The one peak reckoning: what a prefix of an order (planner/strategy/order.py) holds on the GPU at its peak.

A plan's peak is its resident bytes (the model less the moved bytes) plus its buffer pool. The pool's
exact bytes are what the plan will carry: ``schemas.buffer_pool.build_pool`` of the prefetched layers'
signatures, as ``planner.assemble.pool_of`` builds it (``exact_pool_of``; ``exact_pool`` from a placement). Sizing it costs time linear in the prefetched layers, so
a search over the prefixes of an order reads two bounds first, each computed for every prefix in one
pass:

- ``peaks``, an upper bound: each buffer key's bytes times ``min(layers holding it, slots)`` (a key
  occupies at most one buffer per slot, and at most one per layer holding it). A prefix whose upper
  bound fits fits exactly. It never decreases along an order, so strategy auto also reads it as the
  peak of its slot path (planner/strategy/auto_slots.py).
- ``lower_peaks``, a lower bound: with ``P`` prefetched layers in ``k = min(P, slots)`` slots every slot
  holds at least the buffers of the largest layer it serves, so the pool is at least ``k`` times the
  smallest prefetched layer, and at least the prefetched bytes over the most layers one slot serves
  (``ceil(P/k)``: a slot's largest layer is at least the mean of its layers).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from itertools import compress

from planner.strategy.order import Order
from schemas.buffer_pool import Signature, build_pool, pool_bytes, signature
from schemas.schedule import num_slots
from schemas.spec import Layer


def peaks(order: Order, total_bytes: int, slots: int | None = None) -> list[tuple[int, int]]:
    """(peak upper bound, pinned bytes) after taking 0, 1, ..., len(order) moves, with ``slots`` buffer
    slots (default: the order's)."""
    most = order.slots if slots is None else slots
    pinned, pools = pools_by_slots(order, [most])
    return [(total_bytes - moved + pool, moved) for moved, pool in zip(pinned, pools[most])]


def pools_by_slots(order: Order, counts: Sequence[int]) -> tuple[list[int], dict[int, list[int]]]:
    """After taking 0, 1, ..., len(order) moves: the bytes moved, and for each slot count of ``counts`` the upper
    bound on the pool (``peaks``' less the resident bytes), from one pass over the order."""
    moved = [0]
    pools = {most: [0] for most in counts}
    pool = dict.fromkeys(counts, 0)
    offloaded = 0
    layers: set[int] = set()  # prefetched layers
    k = dict.fromkeys(counts, 0)  # per slot count, the slots in use: the prefetched layers, at most that many
    # pool key -> prefetched layers holding it, counted up to one more than the most slots (past it no count matters)
    held: dict[tuple, int] = {}
    size: dict[tuple, int] = {}  # pool key -> bytes of one buffer
    top = max(counts, default=0)
    full: set[int] = set()  # ids of signatures whose keys are each held by more layers than the most slots
    for move, sig in zip(order.moves, order.signatures):
        offloaded += move.nbytes
        moved.append(offloaded)
        if sig is not None:
            grew = []  # the slot counts whose slots in use grew: every key may use one more buffer
            if move.position not in layers:  # a layer's later moves (prefer tiers) add keys, not a layer
                layers.add(move.position)
                for most in counts:
                    if k[most] < most:
                        k[most] += 1
                        grew.append(most)
            new = id(sig) not in full
            if new:
                for key, nbytes in sig:
                    size[key] = nbytes
                    held[key] = held.get(key, 0) + 1
                if all(held[key] > top for key, _ in sig):  # each key has a buffer in every slot it may use:
                    full.add(id(sig))  # another layer of this signature adds no buffer (nor need it be counted)
            for most in counts:
                used = k[most]
                if most in grew:
                    pool[most] = sum(size[key] * min(n, used) for key, n in held.items())
                elif new:
                    pool[most] += sum(nbytes for key, nbytes in sig if held[key] <= used)
        for most in counts:
            pools[most].append(pool[most])
    return moved, pools


def lower_peaks(order: Order, total_bytes: int, slots: int) -> list[int]:
    """A lower bound on the peak after taking 0, 1, ..., len(order) moves, with ``slots`` buffer slots."""
    return lower_peaks_by_slots(order, total_bytes, [slots])[slots]


def lower_peaks_by_slots(order: Order, total_bytes: int, counts: Sequence[int]) -> dict[int, list[int]]:
    """``lower_peaks`` for each slot count of ``counts``, from one pass over the order: with ``P`` prefetched layers
    in ``k = min(P, slots)`` slots, at least ``k`` times the smallest prefetched layer (its bytes when it was first
    prefetched: a layer only grows) and the prefetched bytes over the most layers one slot serves."""
    resident, held, least, copied = [total_bytes], [0], [0], [0]  # after each prefix
    offloaded = prefetched = smallest = 0
    layers: set[int] = set()
    for move, sig in zip(order.moves, order.signatures):
        offloaded += move.nbytes
        if sig is not None:
            prefetched += move.nbytes
            if move.position not in layers:
                layers.add(move.position)
                if len(layers) == 1 or move.nbytes < smallest:
                    smallest = move.nbytes
        resident.append(total_bytes - offloaded)
        held.append(len(layers))
        least.append(smallest)
        copied.append(prefetched)
    out: dict[int, list[int]] = {}
    for s in counts:
        bounds = out[s] = []
        for r, h, m, c in zip(resident, held, least, copied):
            if not h:
                bounds.append(r)
                continue
            k = num_slots(h, s)  # the slots in use
            per_slot = -(-h // k)  # the most layers one slot serves
            bounds.append(r + max(k * m, -(-c // per_slot)))
    return out


def exact_pool(layers: Sequence[Layer], placed: Mapping[int, Mapping[str, str]], slots: int,
               span: Collection[int] = ()) -> int:
    """The bytes of the buffer pool a plan with ``placed`` (position -> param -> backend) carries, with
    ``slots`` buffer slots and the layers at ``span`` spanning them (``exact_pool_of`` the layers' signatures)."""
    made = Signatures()
    signatures = {p: made.of(layers[p], frozenset(name for name, backend in params.items() if backend == "prefetch"))
                  for p, params in placed.items()}
    return exact_pool_of(signatures, slots, span)


class Signatures:
    """A layer's pool signature by (its params, the names it copies), one object per distinct signature (as
    ``planner.assemble.signatures`` makes them), each made once."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, frozenset], Signature] = {}
        self._interned: dict[Signature, Signature] = {}

    def of(self, layer: Layer, copied: frozenset) -> Signature:
        key = (id(layer.params), copied)
        sig = self._made.get(key)
        if sig is None:
            sig = signature(t for t in layer.params if t.name in copied)
            sig = self._made[key] = self._interned.setdefault(sig, sig)
        return sig


def exact_pool_of(signatures: Mapping[int, Signature], slots: int, span: Collection[int] = ()) -> int:
    """``exact_pool`` of the layers at ``signatures`` (position -> the signature of its copied params; an empty one:
    nothing copied), as ``planner.assemble.pool_of`` builds it."""
    positions = sorted(compress(signatures, signatures.values()))  # the layers copying params, in order
    spanning = [p in span for p in positions] if span else []
    return pool_bytes(build_pool(list(map(signatures.__getitem__, positions)),
                                 num_slots(len(positions) - sum(spanning), slots), spanning))
