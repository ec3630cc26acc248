"""strategy auto, deciding: every layer's eligible params, the orders of moves (planner/strategy/auto_order.py),
the one order kept, its path (planner/strategy/auto_slots.py) and the step of it that the budget takes
(``fit.choose``), as an Assignment plus the facts its notes are written from.

Which order: without ``offload.prefer`` several orders are weighed (``candidate_prefers``). Each is
predicted at a fixed grid of budgets spread between the lowest peak any of them reaches and the whole
model (the fastest of its first steps that fit there with each slot count), and the one whose plans predict
the step closest to the fastest order's at every grid budget (the least worst ratio, then the least mean;
an order within ``AVERAGE_TIE`` of the least worst whose mean is lower by more than that kept instead;
orders within ``NEAR`` of the kept one's worst told apart on a grid ``CLOSER`` times as fine) is kept for every
budget. The grids never depend on the budget asked for, so neither does the order: a larger budget takes a
step no later on the same path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from heapq import heapify, heappop, heappush

from planner.assemble import Assignment
from planner.cost.placement import PlacementCost
from planner.errors import InfeasibleError
from planner.layers import eligible_params
from planner.strategy.auto_order import (GREEDY_MOST_LAYERS, GREEDY_SLOTS, Tiers, build_order, candidate_prefers, greedy_order,
                                         large_kinds, like)
from planner.strategy.auto_slots import AutoPath, Step
from planner.strategy.experts import trial_offload
from planner.strategy.fit import Chosen, NoFit
from planner.strategy.infeasible import Infeasible, Need
from planner.strategy.order import Order, by_name
from schemas.hardware import HardwareProfile
from schemas.spec import Layer, MemorySection, OffloadSection
from schemas.workload import Workload

GREEDY = "greedy"  # the key of auto_order.greedy_order's order among the orders weighed
GRID = 8  # budgets the orders are weighed at (between the lowest peak and the whole model, ends left out)
# with the greedy order among them: its path is of no tier's shape and its slow spots fell between 8 budgets (the
# Llama-3-8B shape at decode with the 2026-12-02 profile: kept on 8 budgets, 1.63x the attention-first order's step
# at 13.55 GB on a sweep of 201; bench/results/search-2026-12-02b/); 16 budgets see them
GREEDY_GRID = 16
# orders whose worst ratios over the grid lie within NEAR of the kept one's are told apart on a grid CLOSER times as
# fine (the Llama-3-70B prefill: two orders at 1.028 and 1.029 over 16 budgets, 1.069 and 1.029 over 201; the table
# of bench/bench_search.py 33 -> 34 of 36, no other cell moved, 2026-12-03)
NEAR = 0.005
CLOSER = 4
# an order whose worst ratio is at most this share above the least worst is kept instead where its mean ratio over
# the grid is lower by more than this: one grid budget must not choose the order for all the others (deepseek-v2-lite
# prefill with moe_block_cpu_us 1,245: the least worst order, 1.576, was 1.24-1.58x the fastest at every budget of
# the grid; the order at 1.620 was within 1.08 of the fastest at every budget but the one nearest the whole model,
# and auto's plan at 25% predicted 713.7 ms where that order's gave 483.0; docs/BENCHMARKS.md, 2026-12-04)
AVERAGE_TIE = 0.10


@dataclass(frozen=True)
class SlotOption:
    slots: int
    taken: int  # the first step with this many slots that fits the budget
    step_ms: float  # its predicted weighted step


@dataclass(frozen=True)
class RunnerUp:
    """The budget strategy's plan at the same budget, set beside auto's: its backend, bytes and predicted step."""

    backend: str
    offloaded_bytes: int
    step_ms: float
    ours_ms: float  # auto's plan's predicted step


@dataclass(frozen=True)
class Weighed:
    """The orders weighed: how many, and the kept one's worst ratio to the fastest order over the grid."""

    orders: int
    worst: float  # >= 1.0


@dataclass(frozen=True)
class AutoDecision:
    where: dict[str, dict[str, str]]
    order: Order
    taken: int
    peak_bound: int  # the plan's peak
    slots: int  # buffer slots of the plan
    all_uva: bool = False  # every eligible param on UVA
    searched: bool = False  # the slot count was chosen (no prefetch_step given)
    step_ms: float | None = None  # the chosen step's predicted weighted step
    options: tuple[SlotOption, ...] = ()  # at this budget, the other slot counts that fit
    prefer: tuple[str, ...] = ()  # the tiers of the order kept: kinds whose moves come first
    first: tuple[str, ...] = ()  # and kinds whose prefetch moves come before the others' (auto_order.build_order)
    span: int | None = None  # the position of the layer prefetched spanning the slots (its unique moves)
    runner_up: RunnerUp | None = None  # the budget strategy's best plan at this budget (planner/build.py)
    passed: int = 0  # steps that fit before the chosen one but that a step moving more beats
    weighed: Weighed | None = None  # the orders weighed (None: offload.prefer gave the order)
    given_prefer: bool = False  # offload.prefer gave the tiers
    greedy: bool = False  # the order kept is auto_order.greedy_order's (no tiers: by marginal cost per byte freed)

    def moves_by(self, backend: str) -> list:
        """The moves taken on ``backend`` as the order has them (a spanned layer's moves are its "uva" ones)."""
        return [m for m in self.order.moves[:self.taken] if m.backend == backend]

    def spanned(self, move) -> bool:
        """Is ``move`` one the plan prefetches spanning the slots instead of reading it through UVA?"""
        return self.span is not None and move.position == self.span and move.unique

    def in_place(self) -> list:
        """The moves read in place through UVA in the plan (the order's UVA moves less the spanned ones)."""
        return [m for m in self.moves_by("uva") if not self.spanned(m)]

    @property
    def prefetched(self) -> int:
        return len({m.position for m in self.moves_by("prefetch")})


def decide(layers: Sequence[Layer], shared: Mapping[str, set[str]], memory: MemorySection, offload: OffloadSection,
           hw: HardwareProfile, workload: Workload, step: int | None, total_bytes: int,
           cost: PlacementCost, whole: frozenset[str] = frozenset(),
           trial: frozenset[str] = frozenset()) -> AutoDecision:
    """The auto plan's placement (raises InfeasibleError when no step fits the budgets).

    ``step``: the slot count the spec gives (offload.prefetch_step), else None: chosen by cost; ``whole``: kinds
    a layer moves as one unit (auto_order.build_order); ``trial``: kinds auto tries on the host
    (``experts.host_to_try``; ``cost`` prices them so): the orders are weighed also with those kinds held to
    UVA, where the host can share them."""
    eligible = {layer.index: eligible_params(layer, offload.params, shared.get(layer.name, set()), offload.kinds)
                for layer in layers}
    only = offload.backend if offload.backend in ("prefetch", "uva") else None
    given = offload.prefer is not None
    if memory.gpu_budget is not None and total_bytes <= memory.gpu_budget:
        order = build_order(layers, eligible, hw, workload, step, dict(offload.backends or {}), only,
                            tuple(offload.prefer or ()), whole=whole)
        return AutoDecision({}, order, 0, total_bytes, step or 1, searched=step is None,
                            prefer=tuple(offload.prefer or ()), given_prefer=given)
    likes = like(layers, eligible)  # the layers by description, for every order
    variants = [offload] + ([trial_offload(offload, trial)] if trial else [])
    tiers: list[Tiers] = ([(tuple(offload.prefer or ()), ())] if given
                          else candidate_prefers(layers, eligible, likeness=likes))
    paths: dict[tuple[Tiers, int], AutoPath] = {}
    seen: set[tuple] = set()
    # the orders made so far, where a later one could repeat one (the trial's, the greedy order)
    track = len(variants) > 1 or (not given and len(layers) <= GREEDY_MOST_LAYERS)
    for v, chosen in enumerate(variants):
        forced = dict(chosen.backends or {})
        units = whole | trial if v else whole  # the trial's kinds move a layer's experts module as one unit
        uva = (build_order(layers, eligible, hw, workload, step, forced, "uva", (), whole=units, likeness=likes)
               if only is None else None)
        if uva is not None and any(sig is not None for sig in uva.signatures):
            uva = None  # a kind held to prefetch (offload.backends): no plan reads every param in place
        for t in tiers:
            order = build_order(layers, eligible, hw, workload, step, forced, only, *t, whole=units, likeness=likes)
            if v and tuple(order.moves) in seen:
                continue  # holding the trial's kinds to UVA changed nothing in this order
            if track:
                seen.add(tuple(order.moves))
            paths[(t, v)] = AutoPath(layers, order, total_bytes, cost, step, uva)
        if not given and len(layers) <= GREEDY_MOST_LAYERS:  # and one by marginal predicted cost per byte freed
            large = large_kinds(tiers)
            base = build_order(layers, eligible, hw, workload, step, forced, only, (), large, whole=units,
                               likeness=likes)
            greedy = greedy_order(layers, base, cost, total_bytes, len(large), step or GREEDY_SLOTS)
            if greedy is not None and tuple(greedy.moves) not in seen:
                seen.add(tuple(greedy.moves))
                paths[(GREEDY, v)] = AutoPath(layers, greedy, total_bytes, cost, step, uva)
    grid = GREEDY_GRID if any(key == GREEDY for key, _ in paths) else GRID
    kept, weighed = (_keep(paths, memory.cpu_budget, total_bytes, grid) if len(paths) > 1
                     else (next(iter(paths)), None))
    greedy = kept[0] == GREEDY
    prefer, first = ((), ()) if greedy else kept[0]
    path = paths[kept]
    found = path.choose(memory.gpu_budget, memory.cpu_budget)
    if isinstance(found, NoFit):
        raise InfeasibleError(Infeasible("no_plan", memory.gpu_budget, memory.cpu_budget, found.peak, strategy="auto",
                                         needs=(Need("auto", found.peak),), movable=bool(path.order.moves)))
    assert isinstance(found, Chosen)
    st: Step = found.step
    order = path.uva if st.all_uva else path.order
    assert order is not None
    options = ()
    if step is None and memory.gpu_budget is not None and not st.all_uva and any(
            m.backend == "prefetch" for m in order.moves[:st.taken]):
        options = tuple(_options(path, memory.gpu_budget, memory.cpu_budget, st.slots))
    return AutoDecision(by_name(layers, path.placed(st)), order, st.taken, found.peak, st.slots, all_uva=st.all_uva,
                        searched=step is None, step_ms=path.step_ms(st), options=options, prefer=prefer,
                        first=first, span=st.span, passed=found.passed, weighed=weighed, given_prefer=given,
                        greedy=greedy)


def budget_grid(floor: int, total_bytes: int, points: int) -> list[int]:
    """``points`` budgets spread evenly between ``floor`` and the whole model, both ends left out."""
    return [floor + (total_bytes - floor) * k // (points + 1) for k in range(1, points + 1)]


def _keep(paths: Mapping, cpu_budget: int | None, total_bytes: int, points: int = GRID) -> tuple:
    """The order to keep for every budget: predicted at ``points`` budgets between the lowest peak any order
    reaches and the whole model, the least worst (then mean) ratio to the fastest order at each; only orders
    that reach that lowest peak are kept, so keeping one never makes a budget infeasible. Orders whose worst
    ratios lie within ``NEAR`` of the least are told apart on a grid ``CLOSER`` times as fine (``_least_worst``),
    unless that least is within ``NEAR`` of the fastest order everywhere (nothing to gain, and a finer grid costs).

    An order's estimate at a budget (``_estimate``) is simulated only where it can matter: each stands for a bound
    no more than it (``_Estimate``) until asked for; the fastest order's at each budget is found among those whose
    bound is below the fastest so far, and the kept order is the least by its ratios with the bounds standing in for
    the estimates not made (a ratio of a bound is no more than the order's: division and sums round monotonically),
    made until its own are all exact: then no other order's ratios can come out less."""
    lowest = {p: path.lowest_peak(cpu_budget) for p, path in paths.items()}  # nothing fits 0 bytes: the lowest peak
    floor = min(lowest.values())
    grid = budget_grid(floor, total_bytes, points)
    rows = {p: [_Estimate(path, budget, cpu_budget) for budget in grid] for p, path in paths.items()}
    best = [_fastest([row[i] for row in rows.values()]) for i in range(len(grid))]
    index = {p: k for k, p in enumerate(paths)}
    reach = [p for p in paths if lowest[p] == floor]
    if not all(0 < b < float("inf") for b in best):  # a ratio of a bound would not bound the ratio: all exact
        for row in rows.values():
            for e in row:
                e.exact()

    def ratios(p) -> list[float]:
        return [m / b if b > 0 else 1.0 for m, b in zip((e.low for e in rows[p]), best)]

    while True:
        keep = min(reach, key=lambda p: (max(ratios(p)), sum(ratios(p)), index[p]))
        bounded = [e for e in rows[keep] if not e.known]
        if not bounded:
            break
        if not [e.tighten() for e in bounded].count(True):
            for e in bounded:
                e.exact()
    worst = max(ratios(keep))

    def mean(p) -> float:
        return sum(ratios(p)) / len(grid)

    # an order nearly as good at its worst budget and far better on average is kept instead (AVERAGE_TIE)
    close = [p for p in reach if p != keep and max(ratios(p)) <= worst * (1 + AVERAGE_TIE)]  # bounds first
    for p in close:
        for e in rows[p]:
            e.exact()
    close = [p for p in close if max(ratios(p)) <= worst * (1 + AVERAGE_TIE) and mean(p) < mean(keep) - AVERAGE_TIE]
    if close:
        keep = min(close, key=lambda p: (mean(p), max(ratios(p)), index[p]))
        worst = max(ratios(keep))
    near = []  # the orders this grid cannot tell from the kept one (their worst ratios within NEAR of its, their mean
    # not AVERAGE_TIE above it), where the kept one is not within NEAR of the fastest at every budget already
    for p in reach if worst > 1 + NEAR else ():
        if p != keep and max(ratios(p)) <= worst * (1 + NEAR):  # a bound first, then the ratio itself
            for e in rows[p]:
                e.exact()
            if max(ratios(p)) <= worst * (1 + NEAR) and mean(p) <= mean(keep) + AVERAGE_TIE:
                near.append(p)
    if near:
        fine = _least_worst(paths, [keep, *near], cpu_budget, floor, total_bytes, CLOSER * points)
        keep = min([keep, *near], key=lambda p: (fine[p], index[p]))
    return keep, Weighed(len(paths), max(ratios(keep)))


def _least_worst(paths: Mapping, tied: Sequence, cpu_budget: int | None, floor: int, total_bytes: int,
                 points: int) -> dict:
    """Each of the ``tied`` orders' worst ratio to the fastest order over ``points`` budgets from ``floor`` to the
    whole model (a finer grid, where ``_keep``'s could not tell them apart)."""
    grid = budget_grid(floor, total_bytes, points)
    rows = {p: [_Estimate(path, budget, cpu_budget) for budget in grid] for p, path in paths.items()}
    best = [_fastest([row[i] for row in rows.values()]) for i in range(len(grid))]
    return {p: max(rows[p][i].exact() / b if 0 < b < float("inf") else 1.0 for i, b in enumerate(best))
            for p in tied}


def _fastest(estimates: Sequence[_Estimate]) -> float:
    """The least of ``estimates``, made only where its bound is below the least found so far."""
    best = float("inf")
    heap = [(e.low, k, e) for k, e in enumerate(estimates)]
    heapify(heap)
    while heap:
        low, k, e = heappop(heap)
        if low >= best:
            break
        if e.tighten():
            heappush(heap, (e.low, k, e))
        else:
            best = min(best, e.exact())
    return best


class _Estimate:
    """``_estimate(path, budget, cpu_budget)``, made when asked for (``exact``). Until then ``low`` is a bound no more
    than it: the path's step with nothing offloaded where that is one (``AutoPath.resident_floor``), then (once
    ``tighten``-ed) the least of its steps' ``least_ms``; ``known``: ``low`` is the estimate."""

    def __init__(self, path: AutoPath, budget: int, cpu_budget: int | None):
        self.path, self.budget, self.cpu_budget = path, budget, cpu_budget
        self.ranked: list[tuple[float, int, Step]] | None = None
        resident = path.resident_floor()
        self.low, self.known = (resident, False) if resident is not None else (0.0, False)
        if resident is None:
            self.tighten()

    def tighten(self) -> bool:
        """Bound the estimate by its steps' ``least_ms``; False when it was already."""
        if self.ranked is not None:
            return False
        self.ranked = _ranked(self.path, self.budget, self.cpu_budget)
        self.low = self.ranked[0][0] if self.ranked else float("inf")
        self.known = not self.ranked
        return True

    def exact(self) -> float:
        self.tighten()
        if not self.known:
            assert self.ranked is not None
            self.low, self.known = _least_step(self.path, self.ranked), True
        return self.low


def _estimate(path: AutoPath, budget: int, cpu_budget: int | None) -> float:
    """A cheap stand-in for the step ``choose`` takes at ``budget``: the fastest of the first steps that fit with
    each slot count (and the all-UVA step, when it fits); infinite when none fits."""
    return _least_step(path, _ranked(path, budget, cpu_budget))


def _ranked(path: AutoPath, budget: int, cpu_budget: int | None) -> list[tuple[float, int, Step]]:
    """``_estimate``'s steps at ``budget``, each with a bound under its step (``least_ms``), by that bound."""
    found = [path.first_with(slots, budget, cpu_budget) for slots in path.counts]
    found += [st for st in [path.all_uva_step] if st is not None and path.within(st, budget, cpu_budget)]
    return sorted((path.least_ms(st), i, st) for i, st in enumerate(found) if st is not None)


def _least_step(path: AutoPath, ranked: Sequence[tuple[float, int, Step]]) -> float:
    """The least step of ``ranked`` (``_ranked``): simulated in the order of their bounds until the bound reaches
    the fastest found, so the steps that cannot beat it are never simulated."""
    best = float("inf")
    for least, _, st in ranked:
        if least >= best:
            break
        ms = path.step_ms(st)
        if ms < best:
            best = ms
    return best


def _options(path: AutoPath, gpu_budget: int, cpu_budget: int | None, chosen: int) -> list[SlotOption]:
    """For each other slot count the path knows, the first step with that many slots that fits, and its step."""
    out = []
    for slots in path.counts:
        if slots == chosen:
            continue
        st = path.first_with(slots, gpu_budget, cpu_budget)
        if st is not None:
            out.append(SlotOption(slots, st.taken, path.step_ms(st)))
    return out


def assignment(decision: AutoDecision, reason: str, notes: Sequence[str], step: int | None,
               layer_names: Sequence[str] = ()) -> Assignment:
    span = frozenset() if decision.span is None else frozenset({layer_names[decision.span]})
    return Assignment(decision.where, step, "auto", reason, tuple(notes), span)

