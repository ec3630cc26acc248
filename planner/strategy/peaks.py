"""The one peak reckoning: what a prefix of an order (planner/strategy/order.py) holds on the GPU at its peak.

A plan's peak is its resident bytes (the model less the moved bytes) plus its buffer pool. The pool's
exact bytes are what the plan will carry: ``schemas.buffer_pool.build_pool`` through
``planner.assemble.pool_of`` (``exact_pool``). Sizing it costs time linear in the prefetched layers, so
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

from planner.assemble import layers_with_prefetch, pool_of
from planner.strategy.order import Order
from schemas.buffer_pool import pool_bytes
from schemas.schedule import num_slots
from schemas.spec import Layer


def peaks(order: Order, total_bytes: int, slots: int | None = None) -> list[tuple[int, int]]:
    """(peak upper bound, pinned bytes) after taking 0, 1, ..., len(order) moves, with ``slots`` buffer
    slots (default: the order's)."""
    most = order.slots if slots is None else slots
    out = [(total_bytes, 0)]
    offloaded = pool = 0
    layers: set[int] = set()  # prefetched layers
    held: dict[tuple, int] = {}  # pool key -> prefetched layers holding it
    size: dict[tuple, int] = {}  # pool key -> bytes of one buffer
    for move, sig in zip(order.moves, order.signatures):
        offloaded += move.nbytes
        if sig is not None:
            before = min(len(layers), most)
            layers.add(move.position)  # a layer's later moves (prefer tiers) add keys, not a layer
            k = min(len(layers), most)
            for key, nbytes in sig:
                size[key] = nbytes
                held[key] = held.get(key, 0) + 1
            if k > before:  # the slot count itself grew: every key may use one more buffer
                pool = sum(size[key] * min(n, k) for key, n in held.items())
            else:
                pool += sum(nbytes for key, nbytes in sig if held[key] <= k)
        out.append((total_bytes - offloaded + pool, offloaded))
    return out


def lower_peaks(order: Order, total_bytes: int, slots: int) -> list[int]:
    """A lower bound on the peak after taking 0, 1, ..., len(order) moves, with ``slots`` buffer slots."""
    out = [total_bytes]
    offloaded = prefetched = 0
    layers: set[int] = set()
    smallest = 0  # bytes of the smallest prefetched layer when it was first prefetched (a layer only grows)
    for move, sig in zip(order.moves, order.signatures):
        offloaded += move.nbytes
        if sig is not None:
            prefetched += move.nbytes
            if move.position not in layers:
                layers.add(move.position)
                smallest = move.nbytes if len(layers) == 1 else min(smallest, move.nbytes)
        resident = total_bytes - offloaded
        if not layers:
            out.append(resident)
            continue
        k = num_slots(len(layers), slots)
        per_slot = -(-len(layers) // k)  # the most layers one slot serves
        out.append(resident + max(k * smallest, -(-prefetched // per_slot)))
    return out


def exact_pool(layers: Sequence[Layer], placed: Mapping[int, Mapping[str, str]], slots: int,
               span: Collection[int] = ()) -> int:
    """The bytes of the buffer pool a plan with ``placed`` (position -> param -> backend) carries, with
    ``slots`` buffer slots and the layers at ``span`` spanning them."""
    where = {layers[position].name: params for position, params in placed.items()}
    _, entries = pool_of(layers_with_prefetch(layers, where), where, slots, {layers[p].name for p in span})
    return pool_bytes(entries)
