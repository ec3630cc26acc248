"""strategy budget: the fewest evenly spread block-stack layers whose plan fits the budget.

The strategy is an order (planner/strategy/order.py) fed to the prefix fit (planner/strategy/fit.py).
Its order is a *ladder* of tiers. Without ``offload.prefer`` there is one tier: all eligible params
of a layer move together, and ladder step ``n`` offloads the first ``n`` candidates of a fixed
priority order (the last layer, then the others spread evenly: ``last_first``). With ``prefer``
(ranked by ``order.tier_of``), tier ``t`` moves the params of the ``t``-th kind: every layer keeps
the params of the earlier tiers offloaded (those tiers are exhausted) and the first ``n`` of the
layers holding the tier's kind, in the same priority order, offload that kind too. Every ladder step
offloads all that the steps before it offload, and the priority order never depends on the budget,
so a larger budget never moves a param from the GPU to the host.

With ``offload.backends`` a ladder step's params go to their kind's backend (the others to the
backend searched), so one ladder step may be two moves; the fit looks only at whole ladder steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from planner.errors import InfeasibleError
from schemas.kinds import name_key, param_kind
from planner.strategy.choice import Choice
from planner.cost.placement import PlacementCost
from planner.strategy.fit import Chosen, NoFit, Reckoning, Speed, choose, first_fit
from planner.strategy.infeasible import Infeasible, Need
from planner.strategy.order import Move, Order, new_move, offloaded_layers, placement, tier_of
from planner.strategy.peaks import exact_pool, lower_peaks, peaks
from planner.strategy.spread_order import last_first
from schemas.buffer_pool import Signature, signature
from schemas.spec import Layer, Tensor


@dataclass(frozen=True)
class Tier:
    """One tier of the ladder: the layers holding its kinds and, per layer, its params of those kinds."""

    kinds: tuple[str, ...]  # the kinds this tier moves; () = every eligible param at once (no prefer)
    members: tuple[int, ...]  # positions of the layers holding them, in execution order
    params: tuple[tuple[Tensor, ...], ...]  # per member: its params of this tier, in the layer's order

    @cached_property
    def priority(self) -> tuple[int, ...]:
        """Member indices in the order they are taken (planner/strategy/spread_order.py)."""
        return tuple(last_first(len(self.members)))

    def chosen(self, n: int) -> list[int]:
        """The positions of the layers that move this tier's params at ladder step n, in execution order."""
        return [self.members[j] for j in sorted(self.priority[:n])]


@dataclass(frozen=True)
class Ladder:
    tiers: tuple[Tier, ...]
    missing: tuple[str, ...] = ()  # kinds offload.prefer lists that no eligible param has

    @property
    def steps(self) -> int:
        """The ladder steps there are: every member of every tier."""
        return sum(len(t.members) for t in self.tiers)

    def state(self, count: int) -> tuple[int, int]:
        """(tier, n) of ``count`` ladder steps taken (n >= 1 beyond the first tier)."""
        for t, tier in enumerate(self.tiers):
            if count <= len(tier.members) or t == len(self.tiers) - 1:
                return t, count
            count -= len(tier.members)
        return 0, 0

    def order(self, layers: Sequence[Layer], base: str, forced: Mapping[str, str]) -> tuple[Order, list[int]]:
        """The ladder as an order of moves on ``base`` (``forced``: kind -> backend, offload.backends), and
        after each ladder step count the number of moves taken."""
        moves: list[Move] = []
        sigs: list[Signature | None] = []
        interned: dict[Signature, Signature] = {}
        made: dict[tuple, list[tuple[str, tuple[str, ...], int, Signature | None]]] = {}  # per layer like it
        ends = [0]
        for rank, tier in enumerate(self.tiers):
            for j in tier.priority:
                position, params = tier.members[j], tier.params[j]
                name = layers[position].name
                key = (name_key(name), tuple(map(id, params)))
                groups = made.get(key)
                if groups is None:
                    parts: dict[str, list[Tensor]] = {}
                    for t in params:
                        backend = forced.get(param_kind(name, t.name, t.kind), base) if forced else base
                        parts.setdefault(backend, []).append(t)
                    groups = made[key] = []
                    for backend in ("uva", "prefetch"):
                        group = parts.get(backend)
                        if group:
                            sig = signature(group) if backend == "prefetch" else None
                            groups.append((backend, tuple(t.name for t in group), sum(t.nbytes for t in group),
                                           None if sig is None else interned.setdefault(sig, sig)))
                for backend, names, nbytes, sig in groups:
                    moves.append(new_move((position, names, nbytes, backend, 0.0, tier.kinds, rank, False)))
                    sigs.append(sig)
                ends.append(len(moves))
        return Order(tuple(moves), tuple(sigs), 0), ends


def ladder(layers: Sequence[Layer], candidates: Sequence[tuple[int, Sequence[Tensor]]],
           prefer: Sequence[str] | None) -> Ladder:
    """The ladder over ``candidates`` (position, eligible params) of the block stack: one tier without prefer;
    with it one tier per preferred kind present, in order, then one for the other kinds."""
    if prefer is None:
        return Ladder((Tier((), tuple(p for p, _ in candidates), tuple(tuple(ts) for _, ts in candidates)),))
    rest = len(prefer)
    kinded = [(p, ts, [tier_of(param_kind(layers[p].name, t.name, t.kind), prefer) for t in ts])
              for p, ts in candidates]
    present = sorted({r for _, _, rs in kinded for r in rs})
    tiers = []
    for r in present:
        members = [(p, tuple(t for t, q in zip(ts, rs) if q == r)) for p, ts, rs in kinded if r in rs]
        if r < rest:
            kinds: tuple[str, ...] = (prefer[r],)
        else:
            kinds = tuple(sorted({param_kind(layers[p].name, t.name, t.kind)
                                  for p, ts, rs in kinded for t, q in zip(ts, rs) if q == rest}))
        tiers.append(Tier(kinds, tuple(p for p, _ in members), tuple(ts for _, ts in members)))
    missing = tuple(k for k in prefer if prefer.index(k) not in present)
    return Ladder(tuple(tiers), missing)


class _Path:
    """The ladder on one backend: its steps (ladder step counts) and their reckoning."""

    def __init__(self, layers: Sequence[Layer], lad: Ladder, base: str, forced: Mapping[str, str],
                 total_bytes: int, slots: int):
        self.layers, self.total, self.slots = layers, total_bytes, slots
        self.order, self.ends = lad.order(layers, base, forced)
        self._upper = peaks(self.order, total_bytes, slots)
        self._lower = lower_peaks(self.order, total_bytes, slots)
        self._layers = offloaded_layers(self.order)
        self._exact: dict[int, int] = {}
        self._ms: dict[int, float] = {}
        self._placed: dict[int, dict[int, dict[str, str]]] = {}

    @property
    def reckoning(self) -> Reckoning[int]:
        """Made on each use: a path holding its own bound methods would be a reference cycle (planner/build.py's
        plan runs with the cycle collector paused, and what a cycle holds would wait for it)."""
        return Reckoning(peak=self.peak, pinned=self.pinned, upper=self.upper, lower=self.lower)

    def upper(self, count: int) -> int:
        return self._upper[self.ends[count]][0]

    def lower(self, count: int) -> int:
        return self._lower[self.ends[count]]

    def pinned(self, count: int) -> int:
        return self._upper[self.ends[count]][1]

    def placed(self, count: int) -> dict[int, dict[str, str]]:
        """The placement of ``count`` ladder steps (made once: its readers never change it)."""
        found = self._placed.get(count)
        if found is None:
            found = self._placed[count] = placement(self.order, self.ends[count])
        return found

    def pool(self, count: int) -> int:
        if count not in self._exact:
            self._exact[count] = exact_pool(self.layers, self.placed(count), self.slots)
        return self._exact[count]

    def peak(self, count: int) -> tuple[int, int]:
        pinned = self.pinned(count)
        return self.total - pinned + self.pool(count), pinned

    def step_ms(self, count: int, cost: PlacementCost) -> float:
        if count not in self._ms:
            self._ms[count] = cost.step_ms(self.placed(count), self.slots)
        return self._ms[count]

    @cached_property
    def _firsts(self) -> tuple[tuple[int, frozenset[str]], ...] | None:
        """Per prefetched layer, the params of its first prefetch move; None when the order prefetches the
        last layer (``PlacementCost.refill_floor`` does not hold then) or nothing."""
        last = len(self.layers) - 1
        out: dict[int, frozenset[str]] = {}
        for move in self.order.moves:
            if move.backend == "prefetch":
                if move.position == last:
                    return None
                out.setdefault(move.position, frozenset(move.params))
        return tuple(out.items()) or None

    def floor(self, count: int, cost: PlacementCost) -> float:
        """Under the predicted step of ``count`` ladder steps and of every later one on this backend."""
        placed = self.placed(count)
        low = cost.lower_ms(placed)
        if self._firsts is None:
            return low
        last = max((p for p, params in placed.items() if "prefetch" in params.values()), default=None)
        return low if last is None else max(low, cost.refill_floor(last, self._firsts))

    def need(self, backend: str, count: int, peak: int) -> Need:
        return Need(backend, peak, self._layers[self.ends[count]])


def peak_at(layers: Sequence[Layer], lad: Ladder, count: int, *, base: str, forced: Mapping[str, str],
            total_bytes: int, slots: int) -> int:
    """The exact peak of ``count`` ladder steps on ``base`` (the words' "one fewer would peak at")."""
    return _Path(layers, lad, base, forced, total_bytes, slots).peak(count)[0]


def decide(layers: Sequence[Layer], lad: Ladder, *, total_bytes: int, gpu_budget: int | None,
           cpu_budget: int | None, requested: str, forced: Mapping[str, str], slots: int,
           cost: PlacementCost) -> Choice:
    """The budget strategy's plan (raises InfeasibleError when no ladder step fits the budgets).

    ``requested``: prefetch, uva or auto. The path is the ladder, each ladder step on each backend
    (prefetch before UVA: the same params, the higher peak first), and ``fit.choose`` takes its step by
    predicted time (``cost``): the first that fits and that no step offloading more beats at no higher
    peak. So a larger budget never moves a param from the GPU to the host nor predicts a slower step."""
    if gpu_budget is None:
        return Choice("budget", "none", "no_budget")
    if total_bytes <= gpu_budget:
        return Choice("budget", "none", "fits")
    backends = ["prefetch", "uva"] if requested == "auto" else [requested]
    paths = {b: _Path(layers, lad, b, forced, total_bytes, slots) for b in backends}
    steps = [(count, b) for count in range(lad.steps + 1) for b in backends]
    reckon = Reckoning(peak=lambda st: paths[st[1]].peak(st[0]), pinned=lambda st: paths[st[1]].pinned(st[0]),
                       upper=lambda st: paths[st[1]].upper(st[0]), lower=lambda st: paths[st[1]].lower(st[0]))
    floors: dict[int, float] = {}

    def floor(st: tuple[int, str]) -> float:
        """Under every step from this ladder count on: the lower of the backends' lower bounds there."""
        if st[0] not in floors:
            floors[st[0]] = min(paths[b].floor(st[0], cost) for b in backends)
        return floors[st[0]]

    speed = Speed(step_ms=lambda st: paths[st[1]].step_ms(st[0], cost), floor=floor, moves=lambda st: st[0])
    found = choose(steps, reckon, gpu_budget, cpu_budget, speed)
    if isinstance(found, Chosen):
        return _choice(paths, found, requested, cost, gpu_budget)
    needs = []
    for backend, path in paths.items():  # per backend, its lowest peak within the CPU budget
        lowest = first_fit(range(lad.steps + 1), path.reckoning, 0, cpu_budget)
        assert isinstance(lowest, NoFit)
        needs.append(path.need(backend, lowest.lowest, lowest.peak))
    raise InfeasibleError(Infeasible("no_plan", gpu_budget, cpu_budget, min(n.peak for n in needs),
                                     strategy="budget", needs=tuple(needs)))


def _choice(paths: dict[str, _Path], found: Chosen, requested: str, cost: PlacementCost, gpu_budget: int) -> Choice:
    count, backend = found.step
    path = paths[backend]
    pinned = path.pinned(count)
    ms = path.step_ms(count, cost)
    other = [b for b in paths if b != backend]
    other_ms = paths[other[0]].step_ms(count, cost) if other else None
    other_peak = paths[other[0]].peak(count)[0] if other else None
    if requested != "auto":
        why = "requested"
    elif backend == "prefetch":
        why = "prefetch_faster"
    else:
        why = "uva_faster" if other_peak is not None and other_peak <= gpu_budget else "uva_fits"
    return Choice("budget", backend, why, path.placed(count), found.peak, found.peak - (path.total - pinned), pinned,
                  path.slots, alternative=other_peak, count=count,
                  fewer_peak=path.peak(count - 1)[0] if count > 0 else None, step_ms=ms, other_ms=other_ms,
                  passed=found.passed)
