"""``strategy: auto``: which params leave the GPU, and by which backend, for the lowest predicted
step time of the declared workload under the budgets.

Deciding is a fixed order of moves, computed from the model, the workload and the hardware profile
(never from the budget), and the plan of that order a budget takes (planner/strategy/auto_slots.py,
planner/strategy/fit.py):

1. *Units*: a layer's eligible params of one kind (tied targets never move); routed experts param by
   param (a layer's experts in parts: the runtime moves each param on its own). Any layer may hold
   units, not only a detected block stack: an embedding or an LM head is a unit too.
2. Each unit's cost of being read in place through UVA (its predicted kernel time over the link
   less its time from GPU memory, weighted over the workload) is set against the cost of copying
   it once a forward (its bytes over the pinned host-to-GPU link). Cheaper on UVA: a UVA move
   (an embedding lookup reads T rows; routed experts at small batches read only the experts
   they touch). Otherwise its layer is a prefetch candidate.
3. A layer's prefetch-candidate units of one tier (below) are prefetched in one move, and only if
   more layers than there are slots share its buffer signature: a layer unlike the others would need
   buffers of its own and save nothing. Other units fall back to UVA at their UVA cost (marked
   ``unique``); the path may instead prefetch the largest such layer spanning the slots
   (``span_candidate``).
4. The order: by tier (``offload.prefer``: the preferred kinds first, in their order), then moves by
   cost per byte, cheapest first (UVA moves at their own cost; prefetch moves at the link's cost per
   byte, taken in van der Corput order over the candidate layers so that every prefix is spread
   evenly over the stack). A tier of one kind makes that kind's units of a layer a move of their own:
   with ``prefer: [dense_mlp]`` a layer's MLP is prefetched before, and apart from, its attention.
5. Without ``offload.prefer`` auto weighs several orders (``candidate_prefers``: no tiers, or one large
   kind's prefetch moves first, each with and without the embedding kind's moves before all others)
   and one greedy order (``greedy_order``: the same moves taken by marginal predicted cost per byte
   freed), and keeps one for every budget (planner/strategy/auto.py), so that a larger budget takes a
   plan of the same order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from schemas.buffer_pool import Signature, signature
from schemas.kinds import name_key, param_kind
from planner.cost.layer import gpu_and_uva_ms
from planner.strategy.order import NOT_MOVED, Move, Order, Split, after_move, new_move, placement, tier_of
from planner.strategy.peaks import Signatures, exact_pool_of
from planner.cost.placement import PlacementCost
from planner.strategy.spread_order import van_der_corput
from schemas.hardware import HardwareProfile
from schemas.spec import Layer, Tensor
from schemas.spec_layers import moe_shape
from schemas.workload import Workload


MAX_SLOTS = 4  # the most buffer slots auto considers (one copy stream: more help only before runs)
Tiers = tuple[tuple[str, ...], tuple[str, ...]]  # (prefer, first): the tiers of an order (``build_order``)
SPLIT = frozenset({"routed_experts"})  # kinds whose params are units of their own (a layer's experts in parts)


def _weighted(workload: Workload) -> list[tuple[int, float]]:
    items = workload.items()
    total = sum(item.weight for _, item in items)
    return [(item.rows, item.weight / total) for _, item in items]


_Unit = tuple[str, tuple[Tensor, ...], tuple[str, ...], int, float]  # kind, params, their names, bytes, ms per byte


def _units(layer: Layer, params: Sequence[Tensor], moe: tuple[int, int] | None, whole: frozenset[str],
           tokens: list[tuple[int, float]], hw: HardwareProfile, cost_cache: dict[tuple, float]) -> list[_Unit]:
    """A layer's units (its eligible params of one kind; routed experts param by param unless ``whole``), each
    with its bytes and its weighted UVA cost per byte (``cost_cache``: per (layer name key, param, moe))."""
    by_kind: dict[str, list[Tensor]] = {}
    for t in params:
        by_kind.setdefault(param_kind(layer.name, t.name, t.kind), []).append(t)
    head = name_key(layer.name)
    units: list[tuple[str, list[Tensor]]] = []
    for kind, group in by_kind.items():
        units += [(kind, [t]) for t in group] if kind in SPLIT and kind not in whole else [(kind, group)]
    out: list[_Unit] = []
    for kind, group in units:
        nbytes = sum(t.nbytes for t in group)
        if nbytes == 0:
            continue
        extra = 0.0
        for t in group:
            key = (head, t, moe)
            found = cost_cache.get(key)
            if found is None:
                found = 0.0
                for count, share in tokens:
                    gpu, uva = gpu_and_uva_ms(layer.name, t, count, hw, moe)
                    found += share * (uva - gpu)
                cost_cache[key] = found
            extra += found
        out.append((kind, tuple(group), tuple(t.name for t in group), nbytes, max(extra, 0.0) / nbytes))
    return out


class Likeness(NamedTuple):
    """The eligible layers by description (``like``): per distinct description (the layer's name up to numbers, its
    MoE, its params and the eligible ones) one of its layers and its eligible params, and per eligible layer in
    order its position and the index of its description. ``build_order`` describes each once."""

    layers: tuple[tuple[Layer, Sequence[Tensor]], ...]
    at: tuple[tuple[int, int], ...]
    counts: tuple[int, ...]  # per description, its layers


def like(layers: Sequence[Layer], eligible: Mapping[int, Sequence[Tensor]]) -> Likeness:
    """``eligible``'s layers by description (made once for the orders of one search)."""
    index: dict[tuple, int] = {}
    first: list[tuple[Layer, Sequence[Tensor]]] = []
    at = []
    for position, params in eligible.items():
        layer = layers[position]
        moe = moe_shape(layer.moe)
        key = (name_key(layer.name), moe, id(layer.params), tuple(map(id, params)))
        i = index.get(key)
        if i is None:
            i = index[key] = len(first)
            first.append((layer, params))
        at.append((position, i))
    counts = [0] * len(first)
    for _, i in at:
        counts[i] += 1
    return Likeness(tuple(first), tuple(at), tuple(counts))


def build_order(layers: Sequence[Layer], eligible: Mapping[int, Sequence[Tensor]], hw: HardwareProfile,
                workload: Workload, slots: int | None, forced: Mapping[str, str] | None = None,
                only: str | None = None, prefer: Sequence[str] | None = None,
                first: Sequence[str] = (), whole: frozenset[str] = frozenset(),
                likeness: Likeness | None = None) -> Order:
    """The fixed order of moves for these layers (``eligible``: position -> params that may move).

    ``forced``: kind -> backend for the kinds whose backend is given (offload.backends); ``only``:
    every unit on this backend (offload.backend prefetch or uva); ``slots``: the most buffer slots
    a plan may use (a layer is prefetched only if more layers share its signature; None: up to
    MAX_SLOTS, fewer when no signature is shared by more layers than that); ``prefer``: kinds
    whose moves come first, in this order (offload.prefer), the other kinds after them; ``first``:
    kinds whose prefetch moves come before the other kinds' prefetch moves (UVA moves keep their place
    by cost), a layer's units of those kinds prefetched apart from its others; ``whole``: kinds a layer
    moves as one unit even where ``SPLIT`` parts them (the host computes an experts module whole);
    ``likeness``: ``like(layers, eligible)``, when made already."""
    apart = len(first) + 1
    link_ms_per_byte = 1.0 / (hw.h2d_gbps * 1e6)
    kinds = _Kinds(hw, workload, forced or {}, only, prefer, first, whole, link_ms_per_byte)
    likes = likeness if likeness is not None else like(layers, eligible)
    # the layers like one another share one description, made once
    described = [kinds.describe(layer, params) for layer, params in likes.layers]
    # prefetch candidates: per tier, layers whose prefetched signature more than `slots` layers share
    count: dict[tuple[int, int], int] = {}
    for d, n in zip(described, likes.counts):
        for tier, (_, _, sig) in d.parts.items():
            count[(tier, id(sig))] = count.get((tier, id(sig)), 0) + n
    if slots is None:
        slots = max(1, min(MAX_SLOTS, max(count.values(), default=2) - 1))
    # merged by prefer's tier, then cost per byte, then first's tier; prefetch moves keep their spread order among
    # themselves (a stable sort: each key's moves in the order made, UVA moves, the fallbacks, then the prefetches)
    buckets: dict[tuple, list[tuple[Move, Signature | None]]] = {}
    # a NaN cost equals no key, as sorting compares them: then one list, sorted
    nan = any(unit[3] != unit[3] for d in described for units in (d.uva, *d.fallback.values()) for unit in units)

    def bucket(tier: int, ms_per_byte: float) -> list[tuple[Move, Signature | None]]:
        return buckets.setdefault((0, 0.0, 0) if nan else (tier // apart, ms_per_byte, tier % apart), [])

    uva = [[(unit, bucket(unit[5], unit[3])) for unit in d.uva] for d in described]
    fallback = [[(unit + (count[(tier, id(d.parts[tier][2]))] == 1,), bucket(unit[5], unit[3]))
                 for tier, units in d.fallback.items() if count[(tier, id(d.parts[tier][2]))] <= slots
                 for unit in units] for d in described]  # those of the tiers not prefetched, unique when alone
    prefetched = [[tier for tier, (_, _, sig) in d.parts.items() if count[(tier, id(sig))] > slots]
                  for d in described]
    for position, i in likes.at:
        for unit, into in uva[i]:
            into.append((new_move((position, *unit, False)), None))
    for position, i in likes.at:
        for unit, into in fallback[i]:
            into.append((new_move((position, *unit)), None))
    candidates: dict[int, list[int]] = {}
    for position, i in likes.at:
        for tier in prefetched[i]:
            candidates.setdefault(tier, []).append(position)
    of = dict(likes.at)
    for tier in sorted(candidates):
        mine = sorted(candidates[tier])
        into = bucket(tier, link_ms_per_byte)
        for rank in van_der_corput(len(mine)):
            position = mine[rank]
            d = described[of[position]]
            names, nbytes, sig = d.parts[tier]
            into.append((new_move((position, names, nbytes, "prefetch", link_ms_per_byte, d.kinds[tier], tier, False)),
                         sig))
    if nan:
        ordered = sorted(buckets[(0, 0.0, 0)],
                         key=lambda pair: (pair[0].tier // apart, pair[0].ms_per_byte, pair[0].tier % apart))
    else:
        ordered = [pair for k in sorted(buckets) for pair in buckets[k]]
    return Order(tuple(m for m, _ in ordered), tuple(sig for _, sig in ordered), slots)


class _Described:
    """What one description of a layer (``like``) gives every layer of it, but for its position: its units on UVA
    (Move's fields after the position, but ``unique``), per tier its units on UVA if it is not prefetched, and per
    tier its prefetched params in the layer's order (names, bytes, signature) and their kinds."""

    def __init__(self) -> None:
        self.uva: list[tuple] = []
        self.fallback: dict[int, list[tuple]] = {}
        self.parts: dict[int, tuple[tuple[str, ...], int, Signature]] = {}
        self.kinds: dict[int, tuple[str, ...]] = {}


class _Kinds:
    """``build_order``'s rules for one call: a layer's units (``_units``), each on UVA or prefetched by its kind, made
    once per description; the signatures one object each."""

    def __init__(self, hw: HardwareProfile, workload: Workload, forced: Mapping[str, str], only: str | None,
                 prefer: Sequence[str] | None, first: Sequence[str], whole: frozenset[str], link_ms_per_byte: float):
        self.hw, self.forced, self.only, self.prefer, self.first, self.whole = hw, forced, only, prefer, first, whole
        self.tokens = _weighted(workload)
        self.link_ms_per_byte = link_ms_per_byte
        self.cost_cache: dict[tuple, float] = {}
        self.made: dict[tuple, list[_Unit]] = {}  # a layer's units, made once for the layers like it
        self.interned: dict[Signature, Signature] = {}
        # a layer's prefetched params in the layer's own order (the pool key order of its signature), and their
        # signature, made once per distinct (layer params, prefetched params)
        self.sorted_parts: dict[tuple, tuple[tuple[str, ...], int, Signature]] = {}

    def describe(self, layer: Layer, params: Sequence[Tensor]) -> _Described:
        moe = moe_shape(layer.moe)
        key = (name_key(layer.name), moe, tuple(map(id, params)))
        units = self.made.get(key)
        if units is None:
            units = self.made[key] = _units(layer, params, moe, self.whole, self.tokens, self.hw, self.cost_cache)
        apart = len(self.first) + 1
        out = _Described()
        groups: dict[int, list[Tensor]] = {}
        kinds: dict[int, set[str]] = {}
        for kind, group, names, nbytes, ms_per_byte in units:
            tier = tier_of(kind, self.prefer) * apart + tier_of(kind, self.first)
            unit = (names, nbytes, "uva", ms_per_byte, (kind,), tier)
            want = self.forced.get(kind, self.only)
            if want == "uva" or (want is None and ms_per_byte < self.link_ms_per_byte):
                out.uva.append(unit)
            else:
                groups.setdefault(tier, []).extend(group)
                kinds.setdefault(tier, set()).add(kind)
                if want is None:
                    out.fallback.setdefault(tier, []).append(unit)
        for tier, group in groups.items():
            out.parts[tier] = self._part(layer.params, group)
            out.kinds[tier] = tuple(sorted(kinds[tier]))
        return out

    def _part(self, params: Sequence[Tensor], group: Sequence[Tensor]) -> tuple[tuple[str, ...], int, Signature]:
        key = (id(params), tuple(map(id, group)))
        found = self.sorted_parts.get(key)
        if found is None:
            rank = {t.name: i for i, t in enumerate(params)}
            ordered = sorted(group, key=lambda t: rank[t.name])
            sig = signature(ordered)
            found = self.sorted_parts[key] = (tuple(t.name for t in ordered), sum(t.nbytes for t in ordered),
                                              self.interned.setdefault(sig, sig))
        return found


def where(order: Order, taken: int, layers: Sequence[Layer], span: int | None = None) -> dict[str, dict[str, str]]:
    """Layer name -> param -> backend for the first ``taken`` moves (``span``: see ``span_placement``)."""
    return {layers[position].name: params for position, params in span_placement(order, taken, span).items()}


def span_candidate(order: Order, taken: int) -> int | None:
    """The layer the first ``taken`` moves may prefetch spanning the slots instead of reading it through
    UVA: of the layers whose units would rather be copied but that no other layer is like (``Move.unique``),
    the one with the most bytes moved; None when there is none or nothing else is prefetched."""
    if not any(m.backend == "prefetch" for m in order.moves[:taken]):
        return None
    moved: dict[int, int] = {}
    for m in order.moves[:taken]:
        if m.unique:
            moved[m.position] = moved.get(m.position, 0) + m.nbytes
    return max(moved, key=lambda p: (moved[p], -p)) if moved else None


def span_placement(order: Order, taken: int, span: int | None) -> dict[int, dict[str, str]]:
    """``placement``, with the ``unique`` moves of layer ``span`` prefetched (spanning the slots) instead of on UVA."""
    out = placement(order, taken)
    if span is not None:
        for m in order.moves[:taken]:
            if m.position == span and m.unique:
                out[span].update(dict.fromkeys(m.params, "prefetch"))
    return out


def large_kinds(tiers: Sequence[Tiers]) -> tuple[str, ...]:
    """The kinds ``candidate_prefers``' orders prefetch first: the greedy order's streams of their own."""
    return tuple(dict.fromkeys(k for _, first in tiers for k in first))


def candidate_prefers(layers: Sequence[Layer], eligible: Mapping[int, Sequence[Tensor]],
                      share: float = 0.1, likeness: Likeness | None = None) -> list[Tiers]:
    """The (prefer, first) tiers of the orders auto weighs: none; each kind holding at least ``share`` of the
    eligible bytes prefetched first (a layer's MLP before, and apart from, its attention); and both with the
    embedding kind's moves (an embedding, an LM head) before all others (``likeness``: ``like(layers, eligible)``,
    when made already: each description's kinds are read once)."""
    likes = likeness if likeness is not None else like(layers, eligible)
    by_kind: dict[str, int] = {}
    total = 0
    embedding = False
    for (layer, params), count in zip(likes.layers, likes.counts):
        for t in params:
            kind = param_kind(layer.name, t.name, t.kind)
            total += t.nbytes * count
            if kind == "embedding":
                embedding = True
            else:
                by_kind[kind] = by_kind.get(kind, 0) + t.nbytes * count
    large = sorted((k for k, n in by_kind.items() if total and n >= share * total), key=lambda k: (-by_kind[k], k))
    firsts: list[tuple[str, ...]] = [()] + [(k,) for k in large]
    out: list[Tiers] = [((), f) for f in firsts]
    if embedding:
        out += [(("embedding",), f) for f in firsts]
    return out


GREEDY_STEPS = 64  # a step of the greedy order moves at least 1/GREEDY_STEPS of the movable bytes
GREEDY_MOST_LAYERS = 128  # no greedy order for more layers: each step simulates a forward per stream (+0.1 s at 128)
GREEDY_SLOTS = 1  # the slot count the greedy order prices its steps with
LINK_WEIGHT = 0.5  # a millisecond of the copy stream's busy time, against a millisecond of the step (greedy_order)


def greedy_order(layers: Sequence[Layer], base: Order, cost: PlacementCost, total_bytes: int, apart: int,
                 slots: int = GREEDY_SLOTS, link_weight: float = LINK_WEIGHT) -> Order | None:
    """``base``'s moves in the order of least marginal predicted cost per byte freed, or None (fewer than two
    streams, or more than ``GREEDY_MOST_LAYERS`` layers: the 1,000-layer stacks of issue 18 get none).

    ``base``: ``build_order`` with the large kinds as tiers of their own (``first``; ``apart``: how many, so
    that a tier below ``apart`` holds one large kind). Its moves form *streams*, each kept in ``base``'s
    order: per large kind, its layers' prefetch moves (spread: van der Corput; a layer's small kinds, its
    norms, with its move of the largest kind, as the tiered orders copy them with the kinds not first);
    per kind, its UVA moves (cheapest per byte first); and *whole layers*: a layer's prefetch moves not yet
    taken, every tier together. From nothing moved, each step takes the next *chunk*
    of the stream whose chunk raises the predicted step least per byte of GPU memory it frees. A chunk
    holds at least 1/``GREEDY_STEPS`` of the movable bytes (so the order is a few dozen steps, each one
    simulated forward per stream), and runs on until it frees some: the bytes moved less the pool's
    growth, the pool sized exactly with ``slots`` buffer slots. A chunk's price is the growth of ``cost``'s
    predicted weighted step with ``slots`` slots, or ``link_weight`` times the growth of the copy stream's
    busy time where that is more: a copy that hides behind compute costs no step time yet, but it takes
    link time that later copies would hide in (without it the first chunks, all free, would go to
    whichever kind comes first, not to the one that frees the most bytes for the link time).

    So a move is priced where it is taken: a layer's copy costs little while the link has room and its
    bytes over the link once the link is full, where a fixed order of tiers prices every copy at the
    link's cost per byte; the order interleaves the streams (Llama-3-8B at decode: the LM head read
    through UVA after the attention copies the link hides, before the ones that fill it). It stays one
    nested order, computed before any budget is known: one more order ``auto.decide`` weighs, kept only
    where it is closest to the fastest order over the budgets (``auto._keep``)."""
    if len(layers) > GREEDY_MOST_LAYERS or not base.moves:
        return None
    streams: dict[tuple, list[list[int]]] = {}  # (tier, backend, UVA kinds) -> groups of indices into base.moves
    by_layer: dict[int, list[int]] = {}  # a layer's prefetch moves
    small: dict[int, list[int]] = {}  # and those of its small kinds
    for i, m in enumerate(base.moves):
        if m.backend == "prefetch":
            by_layer.setdefault(m.position, []).append(i)
            if m.tier >= apart:
                small.setdefault(m.position, []).append(i)
    for i, m in enumerate(base.moves):
        if m.backend == "uva":
            streams.setdefault((m.tier, m.backend, m.kinds), []).append([i])
        elif m.tier < apart:  # a layer's small kinds go with its largest kind (as in the tiered orders' last tier)
            streams.setdefault((m.tier, m.backend), []).append([i] + (small.get(m.position, []) if m.tier == 0 else []))
    if small or any(len(ix) > 1 for ix in by_layer.values()):
        streams[("layers",)] = list(by_layer.values())
    if len(streams) < 2:
        return None
    return _greedy(layers, base, list(streams.values()), cost, total_bytes, slots, link_weight)


def _greedy(layers: Sequence[Layer], base: Order, queues: list[list[list[int]]], cost: PlacementCost,
            total_bytes: int, slots: int, link_weight: float) -> Order | None:
    """``greedy_order``'s steps over its streams (``queues``: per stream, its groups of moves in order)."""
    moves = base.moves
    heads = [0] * len(queues)  # per stream: its first group not yet taken
    grain = max(1, sum(m.nbytes for m in moves) // GREEDY_STEPS)
    made = Signatures()
    shares = [share for _, share, _, _ in cost.tokens]
    split: dict[int, Split] = {}  # the placement so far
    sigs: dict[int, object] = {}  # and its prefetched layers' signatures
    done: set[int] = set()
    taken: list[int] = []

    def place(placed: dict[int, Split], chunk: Sequence[int]) -> None:
        for i in chunk:
            m = moves[i]
            placed[m.position] = after_move(placed.get(m.position, NOT_MOVED), m)

    def peak(placed: Mapping[int, Split], touched: set[int], freed: int) -> int:
        mine = dict(sigs)
        for p in touched:
            copied = placed[p][1]
            if copied:
                mine[p] = made.of(layers[p], copied)
        return total_bytes - freed + (exact_pool_of(mine, slots) if mine else 0)  # type: ignore[arg-type]

    def busy(works: Mapping[int, Sequence]) -> float:
        """The copy stream's weighted busy time (ms) with the layers at ``works`` doing that work."""
        return sum(share * work.copy_ms for ws in works.values() for share, work in zip(shares, ws) if work.copy_bytes)

    def step_ms(placed: Mapping[int, Split], works: Mapping[int, Sequence], cutoff: float = math.inf) -> float | None:
        """The predicted weighted step with ``slots`` slots (None: sure to be no less than ``cutoff``)."""
        return cost.placed_step_ms(works, sorted(p for p, (_, copied) in placed.items() if copied), slots, (), cutoff)

    moved, now_peak = 0, total_bytes
    now_ms, now_busy = step_ms({}, {}), 0.0
    assert now_ms is not None
    last = 0  # the stream last advanced: priced first, its chunk likely the one to beat
    while True:
        best = None
        for q in sorted(range(len(queues)), key=lambda q: q != last):
            queue = queues[q]
            chunk: list[int] = []
            nbytes, used, at = 0, heads[q], now_peak
            placed = dict(split)
            touched: set[int] = set()
            while used < len(queue) and (nbytes < grain or at >= now_peak):
                new = [i for i in queue[used] if i not in done]
                used += 1
                if not new:
                    continue
                chunk += new
                nbytes += sum(moves[i].nbytes for i in new)
                place(placed, new)
                touched.update(moves[i].position for i in new)
                if nbytes >= grain:
                    at = peak(placed, touched, moved + nbytes)
            if not chunk:
                heads[q] = used  # every move of this stream is taken
                continue
            if at >= now_peak:
                at = peak(placed, touched, moved + nbytes)
                if at >= now_peak:
                    continue  # the rest of this stream frees nothing: its pool grows as much
            freed = now_peak - at
            works = {p: cost.layer_works(p, sp) for p, sp in placed.items()}
            link = busy(works)
            # a chunk's price: the step's growth, or link_weight of the link time it takes where that is more
            floor = link_weight * (link - now_busy) / freed
            if best is not None and floor >= best[0]:
                continue
            ms = step_ms(placed, works, math.inf if best is None else now_ms + best[0] * freed)
            if ms is None:
                continue  # its step grows more than the best chunk's price allows
            score = max(ms - now_ms, link_weight * (link - now_busy)) / freed
            if best is None or score < best[0]:
                best = (score, q, chunk, placed, touched, nbytes, ms, link, at, used)
        if best is None:
            break
        _, last, chunk, split, touched, nbytes, now_ms, now_busy, now_peak, heads[last] = best
        for p in touched:
            if split[p][1]:
                sigs[p] = made.of(layers[p], split[p][1])
            else:
                sigs.pop(p, None)
        moved += nbytes
        done.update(chunk)
        taken += chunk
    order = taken + [i for i in range(len(moves)) if i not in done]  # moves that never free memory: last
    if order == list(range(len(moves))):
        return None
    return Order(tuple(moves[i] for i in order), tuple(base.signatures[i] for i in order), base.slots)
