"""strategy auto, the buffer slots: how many slots each prefix of the order of moves uses.

One slot less frees a slot's bytes (a shorter prefix fits, so more params stay resident) at a
possible stall: with fewer slots a copy can start only later. So the slot count is chosen by
predicted time, but as a fixed *path* through (slots, prefix) pairs whose prefixes never shrink:
the plan for a budget is the first pair on the path that fits, so a larger budget takes a pair
no later on the path, and no param moves from the GPU to the host because the budget grew.

The path uses 1 slot up to a switch prefix ``m_2``, 2 slots up to ``m_3``, and so on: ``m_S`` is
the shortest prefix at which ``S`` slots predict a faster step than the path with fewer slots at
the same peak (found by bisection: more slots pay off once enough layers are prefetched for
copies to queue up). A slot count is tried only while the one before it paid off, up to the order's
``slots``. After the last prefetch move the path lowers the slot count again before it takes the
moves that follow (they cost more per byte than copying: an LM head read through UVA at prefill),
so the smallest budgets still fit; each of those later prefixes may raise it again where more slots
predict a faster step (the LM head on UVA frees room for a second slot). A pair with as many slots as prefetched layers (its pool holds every
prefetched layer: no memory saved) is never on the path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.auto import Order, peaks, prefetched_layers


@dataclass(frozen=True)
class SlotPath:
    steps: tuple[tuple[int, int], ...]  # (slots, moves taken), in path order
    tables: dict[int, list[tuple[int, int]]]  # slots -> (peak bound, pinned bytes) per prefix
    switches: dict[int, int]  # slots -> the first prefix that uses them (1 -> 0)

    def peak(self, slots: int, taken: int) -> tuple[int, int]:
        return self.tables[slots][taken]


def fixed_path(order: Order, total_bytes: int, slots: int) -> SlotPath:
    """The path of a given slot count (offload.prefetch_step)."""
    n = len(order.moves)
    return SlotPath(tuple((slots, i) for i in range(n + 1)), {slots: peaks(order, total_bytes, slots)}, {slots: 0})


def slot_path(order: Order, total_bytes: int, step_ms: Callable[[int, int], float]) -> SlotPath:
    """The path for ``order``; ``step_ms(taken, slots)``: the predicted step of that pair."""
    n = len(order.moves)
    tables = {1: peaks(order, total_bytes, 1)}
    layers = prefetched_layers(order)
    switches = {1: 0}
    current = [1] * (n + 1)  # slots per prefix so far

    def first_fit(budget: int) -> tuple[int, int]:
        for taken in range(n + 1):
            s = current[taken]
            if tables[s][taken][0] <= budget:
                return s, taken
        return current[n], n

    last = max((i + 1 for i, m in enumerate(order.moves) if m.backend == "prefetch"), default=0)
    for s in range(2, order.slots + 1):
        tables[s] = peaks(order, total_bytes, s)
        lo = max(switches[s - 1], next((i for i in range(last + 1) if layers[i] > s), last + 1))
        if lo > last:
            break

        def pays(taken: int) -> bool:
            other = first_fit(tables[s][taken][0])
            return step_ms(taken, s) < step_ms(other[1], other[0])

        if not pays(last):
            break
        hi = last  # pays(hi); find the first prefix in [lo, hi] that pays, as if paying were monotone
        while lo < hi:
            mid = (lo + hi) // 2
            if pays(mid):
                hi = mid
            else:
                lo = mid + 1
        switches[s] = hi
        for taken in range(hi, last + 1):
            current[taken] = s
    steps = [(current[i], i) for i in range(last + 1)]
    steps += [(s, last) for s in range(current[last] - 1, 0, -1)]
    for taken in range(last + 1, n + 1):
        steps += [(s, taken) for s in reversed(_tail_slots(taken, current[last], layers[taken], step_ms))]
    return SlotPath(tuple(steps), tables, switches)


def _tail_slots(taken: int, most: int, prefetched: int, step_ms: Callable[[int, int], float]) -> list[int]:
    """The slot counts a prefix after the last prefetch move may use, fewest first: 1, then each count up to
    ``most`` that predicts a faster step than every smaller one kept (a pool that holds every prefetched
    layer is never one). Listed on the path from the most slots down, so the largest budget that fits takes
    the fastest; the moves taken never shrink along the path, which keeps plans stable as the budget grows."""
    kept = [1]
    best = step_ms(taken, 1) if most > 1 else 0.0
    for s in range(2, min(most, prefetched - 1) + 1):
        t = step_ms(taken, s)
        if t < best:
            kept.append(s)
            best = t
    return kept
