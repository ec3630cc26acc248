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

Those later prefixes may also prefetch the layer they would read through UVA (an LM head) spanning the
slots (schemas/schedule.py): its buffers lie over the slots' bytes, so it costs only what it holds
beyond them. Each such option is a triple (slots, moves taken, spanning layer); at one prefix the path
keeps the options no option of lower peak beats, listed fastest first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from planner.strategy.auto_order import span_candidate
from planner.strategy.order import Order, prefetched_layers
from planner.strategy.peaks import peaks


Step = tuple[int, int, "int | None"]  # (slots, moves taken, position of the layer spanning the slots or None)


@dataclass(frozen=True)
class SlotPath:
    steps: tuple[Step, ...]  # in path order
    tables: dict[int, list[tuple[int, int]]]  # slots -> (peak bound, pinned bytes) per prefix
    switches: dict[int, int]  # slots -> the first prefix that uses them (1 -> 0)
    span_peaks: dict[Step, tuple[int, int]] = field(default_factory=dict)  # (peak, pinned) of steps with a span

    def peak(self, slots: int, taken: int, span: int | None = None) -> tuple[int, int]:
        if span is not None:
            return self.span_peaks[(slots, taken, span)]
        return self.tables[slots][taken]


def fixed_path(order: Order, total_bytes: int, slots: int, step_ms: Callable[..., float] | None = None,
               span_pool: Callable[[int, int, int], int] | None = None) -> SlotPath:
    """The path of a given slot count (offload.prefetch_step); with ``step_ms`` and ``span_pool``, the prefixes
    after the last prefetch move may also span the slots (as in ``slot_path``)."""
    n = len(order.moves)
    tables = {slots: peaks(order, total_bytes, slots)}
    if step_ms is None or span_pool is None:
        return SlotPath(tuple((slots, i, None) for i in range(n + 1)), tables, {slots: 0})
    last = _last_prefetch(order)
    steps: list[Step] = [(slots, i, None) for i in range(last + 1)]
    return _with_tail(order, steps, last, lambda taken: range(slots, slots + 1), tables, {slots: 0}, total_bytes,
                      step_ms, span_pool)


def slot_path(order: Order, total_bytes: int, step_ms: Callable[..., float],
              span_pool: Callable[[int, int, int], int] | None = None) -> SlotPath:
    """The path for ``order``; ``step_ms(taken, slots, span=None)``: the predicted step of that pair;
    ``span_pool(taken, slots, span)``: the exact bytes of the pool (an arena) with layer ``span`` spanning
    the slots (None: no spanning options)."""
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

    last = _last_prefetch(order)
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
    steps: list[Step] = [(current[i], i, None) for i in range(last + 1)]
    steps += [(s, last, None) for s in range(current[last] - 1, 0, -1)]
    def counts(taken: int) -> range:
        """A prefix after the last prefetch move: 1 slot up to the path's, never as many as its prefetched layers."""
        return range(1, max(1, min(current[last], layers[taken] - 1)) + 1)

    return _with_tail(order, steps, last, counts, tables, switches, total_bytes, step_ms, span_pool)


def _last_prefetch(order: Order) -> int:
    """The shortest prefix holding every prefetch move of ``order``."""
    return max((i + 1 for i, m in enumerate(order.moves) if m.backend == "prefetch"), default=0)


def _with_tail(order: Order, steps: list[Step], last: int, counts: Callable[[int], range],
               tables: dict[int, list[tuple[int, int]]], switches: dict[int, int], total_bytes: int,
               step_ms: Callable[..., float], span_pool: Callable[[int, int, int], int] | None) -> SlotPath:
    """The path ``steps`` (up to prefix ``last``) followed by the prefixes after it: at each, the options of
    ``counts(taken)`` slots, with and without the layer ``span_candidate`` names spanning them, on their
    peak/time frontier; then the steps a spanning step beats dropped."""
    tail = len(steps)
    span_peaks: dict[Step, tuple[int, int]] = {}
    for taken in range(last + 1, len(order.moves) + 1):
        options = [(tables[s][taken][0], s, None) for s in counts(taken)]
        span = span_candidate(order, taken) if span_pool is not None else None
        if span is not None:
            pinned = tables[counts(taken)[0]][taken][1]  # the moves' bytes: the same for every slot count
            for s in counts(taken):
                step = (s, taken, span)
                span_peaks[step] = (total_bytes - pinned + span_pool(taken, s, span), pinned)
                options.append((span_peaks[step][0], s, span))
        steps += [(s, taken, sp) for s, sp in reversed(_frontier(taken, options, step_ms))]
    path = SlotPath(tuple(steps), tables, switches, span_peaks)
    return _drop_dominated(path, tail, step_ms) if span_peaks else path


def _drop_dominated(path: SlotPath, tail: int, step_ms: Callable[..., float]) -> SlotPath:
    """``path`` without the steps that a later step with a spanning layer beats at no higher peak (the LM
    head spanning two slots may need less memory than keeping it resident on one slot, and be faster).
    Dropping steps keeps the path's order, so a larger budget still never takes more moves. The tail (steps
    from index ``tail``, after the last prefetch move: few) is walked whole; before it, back only while the
    steps are at least as slow as the fastest spanning step: there, earlier steps take fewer moves and are
    faster."""
    spans: list[tuple[int, float]] = []  # (peak, step) of the spanning steps after the one looked at
    dropped = set()
    for i in range(len(path.steps) - 1, 0, -1):  # the first step (nothing moved) always stays
        st = path.steps[i]
        if st[2] is not None:
            spans.append((path.peak(*st)[0], step_ms(st[1], st[0], st[2])))
            continue
        if not spans:
            continue
        t = step_ms(st[1], st[0], None)
        if i < tail and t < min(u for _, u in spans):
            break
        peak = path.peak(*st)[0]
        if any(p <= peak and u < t for p, u in spans):
            dropped.add(i)
    if not dropped:
        return path
    return replace(path, steps=tuple(st for i, st in enumerate(path.steps) if i not in dropped))


def _frontier(taken: int, options: list[tuple[int, int, int | None]], step_ms: Callable[..., float]
              ) -> list[tuple[int, int | None]]:
    """The options (peak, slots, span) a prefix after the last prefetch move may use, lowest peak first:
    the lowest, then each that predicts a faster step than every option of lower peak kept. Listed on the
    path from the highest peak down, so the largest budget that fits takes the fastest; the moves taken
    never shrink along the path, which keeps plans stable as the budget grows."""
    options = sorted(options, key=lambda o: (o[0], o[1], o[2] is not None))
    if len(options) == 1:
        return [(options[0][1], options[0][2])]
    kept = [(options[0][1], options[0][2])]
    best = step_ms(taken, options[0][1], options[0][2])
    for _, s, span in options[1:]:
        t = step_ms(taken, s, span)
        if t < best:
            kept.append((s, span))
            best = t
    return kept
