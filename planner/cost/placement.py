"""The predicted step of a placement (layer -> param -> prefetch|uva, and a slot count) without
assembling a plan: the same per-layer costs (planner/cost/layer.py) and the same simulated forward
(planner/cost/timeline.py) as ``planner.cost.predict``, so strategy auto can compare many candidate plans.

Layers with equal names up to their numbers, equal params and equal ties share their per-param
times (a 1,000-layer stack of one block is costed once per workload).

With ``host`` (kinds the host computes: the cpu backend, placed as UVA params), a layer whose params of those
kinds read through UVA are one experts module is priced as the plan will run it: the host and the link sharing
its experts with the split of least predicted time (planner/cost/host_split.py, planner/cost/host_experts.py);
``optional`` (auto's trial of the host): only where that split gives the host some experts, the layer otherwise
read through UVA as without ``host``.

``graphs``: the plan runs with the layer graphs (``schemas.expert_graphs.graphs_on`` of the memory section the
plan gets: planner/build.py), as ``predict`` then prices it; one cost prices for one setting, so its caches hold
that setting's figures alone.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import accumulate
from operator import attrgetter

from schemas.kinds import name_key, param_kind
from planner.cost.block import Sequences, sequences_of
from planner.cost.host_experts import split_work
from planner.cost.host_split import HOST_MARGIN, balanced, whole_split
from planner.cost.layer import LayerWork, layer_times, model_cpu_ms, placed_work, profile_for
from planner.cost.link import link_share
from planner.cost.timeline import Timeline, simulate
from schemas.hardware_profile import HardwareProfile
from schemas.plan_content import PlanLayer, PlanParam
from schemas.plan_experts import ExpertSplit
from schemas.schedule import unrolled_triggers
from schemas.spec_layers import Layer, moe_shape
from schemas.workload import Workload


_GPU, _CPU, _HOST, _SYNCED = (attrgetter(f) for f in ("gpu_ms", "cpu_ms", "host_ms", "synced_gpu_ms"))


class PlacementCost:
    """Predicted weighted step time of placements of ``layers`` on ``hw`` for ``workload`` (``graphs``: with the
    layer graphs, the module docstring)."""

    def __init__(self, layers: Sequence[Layer], hw: HardwareProfile, workload: Workload,
                 host: frozenset[str] = frozenset(), optional: bool = False, graphs: bool = True):
        self.layers, self.host, self.optional, self.graphs = layers, host, optional, graphs
        self.given = (hw, workload)  # the profile and workload it prices for
        items = workload.items()
        total = sum(item.weight for _, item in items)
        self.tokens = [(item.rows, item.weight / total, item.mode, sequences_of(item, name)) for name, item in items]
        self._hw = {mode: profile_for(hw, mode) for _, _, mode, _ in self.tokens}
        self._link = link_share(hw)
        self._cpu_start = [model_cpu_ms(self._hw[mode]) for _, _, mode, _ in self.tokens]  # per item (simulate)
        owner = {f"{layer.name}.{t.name}": t for layer in layers for t in layer.params} if any(
            layer.tied for layer in layers) else {}
        classes: dict[tuple, int] = {}
        listed: dict[tuple, int] = {}  # the class of layers listing the same params object, untied: found at once
        self._class: list[int] = []
        self._params: list[list[tuple[str, PlanParam]]] = []
        for layer in layers:
            moe = moe_shape(layer.moe)
            same = None if layer.tied else (name_key(layer.name), id(layer.params), moe)
            found = listed.get(same) if same is not None else None
            if found is None:
                tied = tuple((rel, owner[target]) for rel, target in layer.tied.items())
                key = (name_key(layer.name), layer.params, tied, moe)
                found = classes.get(key)
                if found is None:
                    found = classes[key] = len(self._params)
                    self._params.append([(t.name, _param(t, t.kind)) for t in layer.params]
                                        + [(rel, _param(t, None)) for rel, t in tied])
                if same is not None:
                    listed[same] = found
            self._class.append(found)
        self._times: dict[tuple, tuple] = {}
        self._work: dict[tuple, LayerWork] = {}
        self._sets: dict[tuple, tuple[frozenset, frozenset]] = {}  # a layer's placement -> (uva, copied) names
        self._none: dict[tuple, list[LayerWork]] = {}
        self._by_position: dict[int, dict[int, LayerWork]] = {}  # per workload item: ``_resident`` by position
        self._sums: dict[tuple, tuple[float, float]] = {}  # per workload item: the resident (GPU, CPU) ms
        self._resident_ms: float | None = None  # the weighted step with nothing offloaded
        self._before: dict[tuple, tuple[list[float], list[float]]] = {}  # per item: resident GPU, CPU ms before each layer
        self._host_splits: dict[tuple, ExpertSplit | None] = {}  # (class, UVA params) -> the host's split, if any
        self._host_units: dict[int, frozenset[str]] = {}  # class -> its params of the host's kinds
        self._least: dict[tuple, tuple[list[float], list[float]]] = {}  # per item: least GPU, CPU ms of each layer
        self._placed_works: dict[tuple, tuple[LayerWork, ...]] = {}  # (class, (UVA, copied params)) -> layer_works

    def _layer_work(self, position: int, tokens: int, mode: str, seqs: Sequences, on_uva: frozenset,
                    copied: frozenset) -> LayerWork:
        cls = self._class[position]
        key = (cls, tokens, mode, seqs, on_uva, copied)
        work = self._work.get(key)
        if work is None:
            hw = self._hw[mode]
            times = self._times.get((cls, tokens, mode, seqs))
            if times is None:
                times = self._times[(cls, tokens, mode, seqs)] = self._layer_times(position, tokens, mode, seqs)
            split = self._host_split(position, on_uva) if self.host else None
            if split is None:
                work = self._work[key] = placed_work(*times, on_uva, copied, hw)
            else:
                work = self._work[key] = split_work(self._split_layer(position, split, on_uva, copied), tokens, hw,
                                                    None, seqs, self.graphs)
        return work

    def _host_split(self, position: int, on_uva: frozenset) -> ExpertSplit | None:
        """The split of the layer's experts between the host and the link when ``on_uva`` holds one experts module
        of the host's kinds (the same ``balanced`` split the plan gets: planner/strategy/experts.py)."""
        key = (self._class[position], on_uva)
        if key not in self._host_splits:
            layer = self.layers[position]
            whole = whole_split(layer, on_uva, self.host)
            split = None if whole is None else balanced(layer, whole, *self.given,
                                                        margin=HOST_MARGIN if self.optional else 0.0,
                                                        graphs=self.graphs)
            self._host_splits[key] = None if split is None or (self.optional and not split.cpu) else split
        return self._host_splits[key]

    def _split_layer(self, position: int, split: ExpertSplit, on_uva: frozenset, copied: frozenset) -> PlanLayer:
        """The layer as its plan holds it: its experts split, its other offloaded params read or copied."""
        layer = self.layers[position]
        params = dict(self._params[self._class[position]])
        moved = on_uva | copied | set(split.params)
        return PlanLayer.model_construct(name=layer.name, params=params, moe=layer.moe, experts=split,
                                         offloaded=[p for p in params if p in moved],
                                         uva=[p for p in params if p in on_uva and p not in split.params])

    def step_ms(self, where: Mapping[int, Mapping[str, str]], slots: int, span: Collection[int] = ()) -> float:
        """Weighted predicted step (ms) with ``where``: position -> param -> backend; ``slots`` buffer slots;
        ``span``: the positions of prefetched layers that span the slots."""
        found = self.split_step_ms({position: self._split(params) for position, params in where.items()}, slots, span)
        assert found is not None
        return found

    def split_step_ms(self, placed: Mapping[int, tuple[frozenset, frozenset]], slots: int,
                      span: Collection[int] = (), cutoff: float = math.inf) -> float | None:
        """``step_ms`` of a placement given as position -> (params read through UVA, params copied); None when the
        step is sure to be no faster than ``cutoff`` (``placed_step_ms``)."""
        prefetched = sorted(p for p, (_, copied) in placed.items() if copied)
        return self.placed_step_ms({i: self.layer_works(i, split) for i, split in placed.items()}, prefetched, slots,
                                   span, cutoff)

    def layer_works(self, position: int, split: tuple[frozenset, frozenset]) -> tuple[LayerWork, ...]:
        """Per workload item, the work of layer ``position`` with (its params read through UVA, its params copied)."""
        key = (self._class[position], split)
        found = self._placed_works.get(key)
        if found is None:
            found = self._placed_works[key] = tuple(self._layer_work(position, tokens, mode, seqs, *split)
                                                    for tokens, _, mode, seqs in self.tokens)
        return found

    def placed_step_ms(self, works: Mapping[int, Sequence[LayerWork]], prefetched: Sequence[int], slots: int,
                       span: Collection[int] = (), cutoff: float = math.inf) -> float | None:
        """The weighted step with the layers at ``works`` doing that work (per workload item: ``layer_works``) and
        the others resident; ``prefetched``: the sorted positions of the layers copying params. None when the step is
        sure to be no faster than ``cutoff``: when the same forward with every copy free (no stall, no UVA read
        sharing the link) is not (``without_copies_ms``). (Every clock of ``simulate`` is a sum or a max of earlier
        clocks and the layers' own times, so a copy's wait only makes it later, also as rounded.)"""
        forwards = [self.forward(k, [(i, mine[k]) for i, mine in works.items()]) for k in range(len(self.tokens))]
        if cutoff < math.inf and self.without_copies_ms(forwards) >= cutoff:
            return None
        return self.forward_step_ms(forwards, prefetched, slots, span)

    def forward(self, k: int, moved: Iterable[tuple[int, LayerWork]]) -> list[LayerWork]:
        """The forward of workload item ``k``: every layer's work, resident but for ``moved`` (position, its work;
        the last of a position wins)."""
        out = self._by_item(k).copy()
        out.update(moved)
        return list(out.values())

    def _by_item(self, k: int) -> dict[int, LayerWork]:
        """Workload item ``k``'s resident work by position."""
        resident = self._by_position.get(k)
        if resident is None:
            tokens, _, mode, seqs = self.tokens[k]
            resident = self._by_position[k] = dict(enumerate(self._resident(tokens, mode, seqs)))
        return resident

    def without_copies_ms(self, forwards: Sequence[Sequence[LayerWork]]) -> float:
        """The weighted step of ``forwards`` (per workload item, ``forward``) with no copies: under the step with
        any copies."""
        least = 0.0
        for k, ((_, weight, _, _), work) in enumerate(zip(self.tokens, forwards)):
            least += weight * self._without_copies(work, self._cpu_start[k])
        return least

    def forward_step_ms(self, forwards: Sequence[Sequence[LayerWork]], prefetched: Sequence[int], slots: int,
                        span: Collection[int] = ()) -> float:
        """The weighted step of ``forwards`` (per workload item, ``forward``) copying the layers at ``prefetched``
        (sorted) into ``slots`` slots, those at ``span`` spanning them."""
        copies = self._copies(prefetched, slots, span)
        total = 0.0
        for k, ((_, weight, _, _), work) in enumerate(zip(self.tokens, forwards)):
            total += weight * simulate(work, copies, self._link, self._cpu_start[k]).step_ms
        return total

    def plan_timelines(self, where: Mapping[int, Mapping[str, str]], slots: int, span: Collection[int] = (),
                       experts: Mapping[int, ExpertSplit] | None = None,
                       shares: Mapping[str, Sequence[float]] | None = None) -> list[Timeline]:
        """Per workload item, the forward ``planner.cost.predict`` simulates for the plan that places ``where``
        (position -> param -> backend) with ``slots`` buffer slots (``span``: the positions of the layers spanning
        them) and ``experts`` (position -> that layer's experts split, planner/strategy/experts.py), made without
        assembling the plan; ``shares``: layer name -> each expert's measured chance, for every MoE layer it names (split
        or whole, as ``predict`` prices them). The splits are given, so this cost has no ``host`` of its own."""
        assert not self.host
        placed = {p: self._split(params) for p, params in where.items()}
        copies = self._copies(sorted(p for p, (_, copied) in placed.items() if copied), slots, span)
        none: tuple[frozenset, frozenset] = (frozenset(), frozenset())
        split_layers = {p: self._split_layer(p, split, *placed.get(p, none)) for p, split in (experts or {}).items()}
        routed = [p for p, layer in enumerate(self.layers)  # whole MoE layers with a measured routing of their own
                  if layer.moe is not None and p not in split_layers and layer.name in (shares or {})]
        out = []
        for k, (tokens, _, mode, seqs) in enumerate(self.tokens):
            moved = [(p, self._layer_work(p, tokens, mode, seqs, uva, copied)) for p, (uva, copied) in placed.items()]
            moved += [(p, self._routed_work(p, tokens, mode, seqs, *placed.get(p, none), shares[self.layers[p].name]))
                      for p in routed]
            moved += [(p, split_work(layer, tokens, self._hw[mode], (shares or {}).get(layer.name), seqs,
                                     self.graphs))
                      for p, layer in split_layers.items()]  # a split layer's work wins over its placement's
            out.append(simulate(self.forward(k, moved), copies, self._link, self._cpu_start[k]))
        return out

    def _layer_times(self, position: int, tokens: int, mode: str, seqs: Sequences,
                     shares: Sequence[float] | None = None) -> tuple:
        """``layer_times`` of the layer at ``position`` (its class's params; ``shares``: its measured routing)."""
        layer = self.layers[position]
        return layer_times(layer.name, self._params[self._class[position]], moe_shape(layer.moe), tokens,
                           self._hw[mode], seqs, shares, graphs=self.graphs)

    def _routed_work(self, position: int, tokens: int, mode: str, seqs: Sequences, on_uva: frozenset,
                     copied: frozenset, shares: Sequence[float]) -> LayerWork:
        """A whole MoE layer's work at its measured routing (``predict`` prices it so; not shared by its class)."""
        return placed_work(*self._layer_times(position, tokens, mode, seqs, shares), on_uva, copied, self._hw[mode])

    def _copies(self, prefetched: Sequence[int], slots: int, span: Collection[int]) -> list[tuple[int, int, bool]]:
        """The copies of a forward prefetching the layers at ``prefetched`` (sorted) into ``slots`` slots, as
        ``simulate`` takes them: Copy's fields as plain tuples (a tuple is made several times faster)."""
        n = len(self.layers)
        return [(p, t % n, t < 0) for p, t in zip(prefetched, unrolled_triggers(prefetched, n, slots, span))]

    def _without_copies(self, work: Sequence[LayerWork], cpu_start: float = 0.0) -> float:
        """``simulate(work, (), cpu_start=cpu_start).step_ms``, the step of a forward of ``work`` with no copies. Where
        no layer waits mid-layer and none has a host part, that forward is ``gpu[x] = max(gpu[x-1] + g[x], C[x])``
        (``C``: the CPU's issue times summed from ``cpu_start``, where the first layer starts; no UVA read shares the
        link with a copy; the stream is never behind the CPU after a layer): walked here on those two numbers alone,
        the same sums and comparisons, so the same value."""
        n = len(work)
        if list(map(_SYNCED, work)).count(None) != n or any(map(_HOST, work)):
            return simulate(work, (), self._link, cpu_start).step_ms
        gpu = cpu_start
        issued_by = accumulate(map(_CPU, work), initial=cpu_start)
        next(issued_by)  # the start itself: the first layer's issue ends at cpu_start + its CPU time
        for g, issued in zip(map(_GPU, work), issued_by):
            gpu += g
            if issued > gpu:
                gpu = issued
        return gpu

    def _split(self, params: Mapping[str, str]) -> tuple[frozenset, frozenset]:
        """A layer's placement as (params read through UVA, params copied), made once per distinct placement."""
        key = tuple(params.items())
        sets = self._sets.get(key)
        if sets is None:
            sets = self._sets[key] = (frozenset(p for p, b in params.items() if b == "uva"),
                                      frozenset(p for p, b in params.items() if b == "prefetch"))
        return sets

    def lower_ms(self, where: Mapping[int, Mapping[str, str]]) -> float:
        """A lower bound on ``step_ms(where, slots, span)`` for any slots and spans: per workload the busiest of
        the compute stream, the copy stream and the CPU, each at least the sum of its layers' work (the step
        of any forward ends after all three); and the step with nothing offloaded (a layer's work only grows
        when its params move, and the forward's end never comes earlier for more work). Adding a move never
        lowers it (a UVA read is no faster than a GPU read, a copy adds link time), so along an order it
        never decreases."""
        if self.host:
            return self._lower_with_host(where)
        total = 0.0
        for tokens, share, mode, seqs in self.tokens:
            resident = self._resident(tokens, mode, seqs)
            sums = self._sums.get((tokens, mode, seqs))
            if sums is None:
                sums = self._sums[(tokens, mode, seqs)] = (sum(w.gpu_ms for w in resident),
                                                            sum(w.cpu_ms for w in resident))
            gpu, cpu = sums
            copy = 0.0
            for i, params in where.items():
                uva, copied = self._split(params)
                work = self._layer_work(i, tokens, mode, seqs, uva, copied)
                gpu += work.gpu_ms - resident[i].gpu_ms
                cpu += work.cpu_ms - resident[i].cpu_ms
                copy += work.copy_ms if work.copy_bytes else 0.0
            total += share * max(gpu, cpu, copy)
        return max(total, self.resident_ms)

    @property
    def resident_ms(self) -> float:
        """The weighted step with nothing offloaded."""
        if self._resident_ms is None:
            self._resident_ms = self.step_ms({}, 1)
        return self._resident_ms

    def resident_floor(self, moved: Iterable[tuple[int, tuple[frozenset, frozenset]]]) -> float | None:
        """``resident_ms`` where it is under the step (``forward_step_ms``) of every placement whose moved layers are
        placed as in ``moved`` (position, (params read through UVA, params copied))), else None. It is where each such
        layer's work is at least its resident work on the compute stream and the CPU and no layer, moved or not,
        waits mid-layer or has a host part: then every clock of ``simulate`` is a sum or a max of terms no smaller
        than the resident forward's (a copy's wait and a shared read only add), also as rounded."""
        if self.host:
            return None
        resident = [self._by_item(k) for k in range(len(self.tokens))]
        if any(w.synced_gpu_ms is not None or w.host_ms for works in resident for w in works.values()):
            return None
        classes = self._class
        for p, split in {(classes[p], id(split)): (p, split) for p, split in moved}.values():
            for k, w in enumerate(self.layer_works(p, split)):
                r = resident[k][p]
                if w.synced_gpu_ms is not None or w.host_ms or w.gpu_ms < r.gpu_ms or w.cpu_ms < r.cpu_ms:
                    return None
        return self.resident_ms

    def _lower_with_host(self, where: Mapping[int, Mapping[str, str]]) -> float:
        """``lower_ms`` where the host may compute experts: each layer's part is the least of its placement as
        given and of it with its params of the host's kinds moved to the host (any later step of a path has one
        of the two, or more moved besides), and the stream's part of a host layer runs until its join; no
        floor at the resident step (the host is not assumed slower than the GPU's own memory)."""
        total = 0.0
        for tokens, share, mode, seqs in self.tokens:
            key = (tokens, mode, seqs)
            least = self._least.get(key)
            if least is None:
                none: frozenset[str] = frozenset()
                parts = [self._least_of(i, tokens, mode, seqs, none, none) for i in range(len(self.layers))]
                least = self._least[key] = ([g for g, _, _ in parts], [c for _, c, _ in parts])
            gpu, cpu = sum(least[0]), sum(least[1])
            copy = 0.0
            for i, params in where.items():
                g, c, k = self._least_of(i, tokens, mode, seqs, *self._split(params))
                gpu += g - least[0][i]
                cpu += c - least[1][i]
                copy += k
            total += share * max(gpu, cpu, copy)
        return total

    def _least_of(self, i: int, tokens: int, mode: str, seqs: Sequences, uva: frozenset,
                  copied: frozenset) -> tuple[float, float, float]:
        """(compute stream, CPU, copy stream) least ms of layer ``i`` placed so or with its host kinds on the host."""
        options = [self._layer_work(i, tokens, mode, seqs, uva, copied)]
        units = self._units(i)
        if units and not units <= uva:
            options.append(self._layer_work(i, tokens, mode, seqs, uva | units, copied - units))
        return (min(w.gpu_ms - w.beside_ms + w.joined_ms if w.host_ms else w.gpu_ms for w in options),
                min(w.cpu_ms for w in options), min(w.copy_ms if w.copy_bytes else 0.0 for w in options))

    def _units(self, i: int) -> frozenset[str]:
        """Layer ``i``'s params of the host's kinds (empty unless they are one experts module)."""
        cls = self._class[i]
        if cls not in self._host_units:
            layer = self.layers[i]
            names = frozenset(t.name for t in layer.params if param_kind(layer.name, t.name, t.kind) in self.host)
            self._host_units[cls] = names if whole_split(layer, names, self.host) is not None else frozenset()
        return self._host_units[cls]

    def refill_floor(self, last: int, firsts: Sequence[tuple[int, frozenset[str]]]) -> float:
        """A lower bound on ``step_ms(where, slots)`` for every placement (no span) whose last prefetched layer is at
        ``last`` or later but is not the model's last layer, and whose prefetched layers each copy at least the
        params of one of ``firsts`` (position, params).

        Why: the slot of the last prefetched layer is refilled for the next forward right after it has run
        (its next user is one of the forward's first prefetched layers: planner/cost/timeline.py's
        ``previous_forward`` copies, schemas/schedule.py), so that copy is issued once every layer up to ``last``
        has been issued by the CPU and has run on the compute stream, each no faster than resident, and the forward
        ends with the join of the copy stream: the step is at least the busier of the resident GPU and CPU time up
        to ``last``, plus the least copy."""
        total = 0.0
        for tokens, weight, mode, seqs in self.tokens:
            key = (tokens, mode, seqs)
            before = self._before.get(key)
            if before is None:
                resident = self._resident(tokens, mode, seqs)
                before = self._before[key] = (list(accumulate((w.gpu_ms for w in resident), initial=0.0)),
                                              list(accumulate((w.cpu_ms for w in resident), initial=0.0)))
            none: frozenset[str] = frozenset()
            least = min(self._layer_work(p, tokens, mode, seqs, none, copied).copy_ms for p, copied in firsts)
            total += weight * (max(before[0][last + 1], before[1][last + 1]) + least)
        return total

    def _resident(self, tokens: int, mode: str, seqs: Sequences) -> list[LayerWork]:
        """Every layer's work at ``tokens`` in ``mode`` with nothing offloaded (computed once per token count)."""
        work = self._none.get((tokens, mode, seqs))
        if work is None:
            none = frozenset()
            work = self._none[(tokens, mode, seqs)] = [self._layer_work(i, tokens, mode, seqs, none, none)
                                                       for i in range(len(self.layers))]
        return work


def _param(t, kind: str | None) -> PlanParam:
    return PlanParam.model_construct(shape=list(t.shape), dtype=t.dtype, bytes=t.nbytes, kind=kind)
