"""spec -> Plan, read top to bottom: apply overrides, pick the layers that may move, let the strategy decide
(a record: planner/strategy/), put the decision into words (planner/words/), assemble the plan file
(planner/assemble.py) and predict its step (planner/cost/).

With ``offload.backends`` the params of the listed kinds use their own backend (prefetch or uva) and
the others ``offload.backend`` (with auto: prefetch, then UVA).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from schemas.errors import InputError
from schemas.expert_graphs import graphs_on
from schemas.hardware import HardwareProfile, load_hardware
from schemas.io import gc_paused
from schemas.plan import Plan
from schemas.plan_memory import PlanMemory
from schemas.routing import MIN_CHOICES_PER_EXPERT, RoutingRef, RoutingStats, spec_problems
from schemas.schedule import DEFAULT_PREFETCH_STEP
from schemas.spec import Layer, MemorySection, OffloadSection, SpecFile, Tensor
from schemas.spec_hash import spec_sha256
from schemas.workload import DEFAULT_WORKLOAD, Workload

from planner.assemble import Assignment, assemble
from planner.cost.placement import PlacementCost
from planner.cost.predict import prediction_rows, predict, weighted_step_ms
from planner.errors import InfeasibleError, PlanningError
from planner.layers import build_graph, eligible_params, find_block_stack, group_rule, layers_in_order, tied_owners
from planner.memory.parts import MemoryModel, fill_kv, infeasible, weights_budget
from planner.strategy import auto, budget, group
from planner.strategy.auto import RunnerUp
from planner.strategy.choice import Choice
from planner.strategy.experts import host_to_try, keep_hot, link_view, to_host
from planner.strategy.infeasible import Infeasible
from planner.words import auto_notes, build_notes, experts_notes, memory_notes
from planner.words.selection import params_desc


@dataclass(frozen=True)
class _Model:
    """The spec's layers, its block stack and the stack layers' eligible params, plus the merged settings."""

    layers: list[Layer]
    stack: list[str]
    shared: dict[str, set[str]]  # layer -> its params other params are tied to
    candidates: list[tuple[int, tuple[Tensor, ...]]]  # (position, eligible params) of the stack layers with any
    total_bytes: int
    memory: MemorySection
    offload: OffloadSection
    cost: PlacementCost  # the predicted step of a placement, for the hardware and workload planned for
    host: frozenset[str] = frozenset()  # kinds the host computes (offload.backends cpu; placed as uva)
    host_optional: bool = False  # auto's trial of the host: only where it is faster (strategy/experts.py)
    routing: RoutingStats | None = None  # measured routing (planner plan --routing)
    routing_ref: RoutingRef | None = None

    @property
    def shares(self) -> dict[str, list[float]] | None:
        return None if self.routing is None else self.routing.shares()

    def placed(self, assignment: Assignment, profile: HardwareProfile, workload: Workload) -> Assignment:
        """A strategy's assignment with its host kinds shared between the host and the link and, with measured
        routing, the most used experts kept on the GPU (planner/strategy/experts.py)."""
        graphs = self.cost.graphs
        chosen = to_host(assignment, self.layers, self.host, profile, workload, self.host_optional, graphs)
        if self.routing is None:
            return chosen

        def peak(a: Assignment) -> int:
            return assemble(self.layers, a, model_name="peak", spec_sha256="0" * 64, checked=False).summary.peak_gpu_bytes

        host = frozenset() if self.host_optional else self.host  # the trial's host keeps the layers it took
        return keep_hot(chosen, self.layers, self.shares, self.memory.gpu_budget, host, profile, workload,
                        peak, graphs).assignment

    def finished(self, plan: Plan, profile: HardwareProfile, workload: Workload) -> Plan:
        """The plan with its predictions (at the measured routing rates) and the routing it was made with."""
        update: dict = {"predictions": predict(plan, profile, workload, self.shares)}
        if self.routing_ref is not None:
            update["summary"] = plan.summary.model_copy(update={"routing": self.routing_ref})
        return plan.model_copy(update=update)

    @property
    def search_cost(self) -> PlacementCost:
        """The placement cost a search walks: with the host's kinds (placed as UVA) priced as the plan runs them."""
        if not self.host:
            return self.cost
        return PlacementCost(self.layers, *self.cost.given, host=frozenset(self.host), optional=self.host_optional,
                             graphs=self.cost.graphs)

    @property
    def by_kind(self) -> bool:
        """The plan records each param's kind: the selection used kinds (offload.kinds or offload.prefer), or the
        spec gives a param its kind (the search priced it by that kind, so the plan's prediction must too)."""
        return self.offload.kinds is not None or self.offload.prefer is not None or self.explicit_kinds

    @property
    def explicit_kinds(self) -> bool:
        return any(t.kind is not None for layer in self.layers for t in layer.params)

    @property
    def step(self) -> int:
        """The prefetch step (number of buffer slots): the spec's, else the default."""
        return self.offload.prefetch_step or DEFAULT_PREFETCH_STEP

    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    @property
    def selection(self) -> str:
        return params_desc(self.offload.params, self.offload.kinds)


def _merge(spec: SpecFile, memory: dict, offload: dict) -> tuple[MemorySection, OffloadSection]:
    mem = spec.memory.model_dump()
    mem.update({k: v for k, v in memory.items() if v is not None})
    off = spec.offload.model_dump(exclude_unset=True)  # an unset strategy stays unset: prefer then means budget
    off.update({k: v for k, v in offload.items() if v is not None})
    return MemorySection.model_validate(mem), OffloadSection.model_validate(off)


def _model(spec: SpecFile, memory: MemorySection, offload: OffloadSection, hardware: HardwareProfile | None = None,
           workload: Workload | None = None, graphs: bool = True) -> _Model:
    """The spec read for a strategy; ``graphs``: the plan runs with the layer graphs (its placement cost prices so)."""
    graph = build_graph(spec.model.expanded())
    layers = layers_in_order(graph)
    stack = find_block_stack(graph)
    shared = tied_owners(graph)
    by_name = {layer.name: layer for layer in layers}
    candidates = []
    for name in stack:
        eligible = eligible_params(by_name[name], offload.params, shared.get(name, set()), offload.kinds)
        if eligible:
            candidates.append((by_name[name].index, eligible))
    total = sum(layer.nbytes for layer in layers)
    cost = PlacementCost(layers, hardware or load_hardware(spec.hardware),
                         workload or spec.workload or DEFAULT_WORKLOAD, graphs=graphs)
    return _Model(layers, stack, shared, candidates, total, memory, offload, cost)


# ---------------------------------------------------------------------------
# Deciding: one strategy, one record.


def _decide_none(m: _Model) -> Choice:
    gpu = m.memory.gpu_budget
    if gpu is not None and m.total_bytes > gpu:
        raise InfeasibleError(Infeasible("backend_none", gpu, m.memory.cpu_budget, m.total_bytes,
                                         total_bytes=m.total_bytes))
    return Choice("none", "none", "backend_none")


def _decide_group(m: _Model) -> Choice:
    if not m.stack:
        raise PlanningError(build_notes.NO_STACK)
    stack_index = {m.layers[p].name: i for i, (p, _) in enumerate(m.candidates)}
    picked = [m.stack[i] for i in group_rule(len(m.stack), m.offload.group_size, m.offload.num_in_group or 1)]
    chosen = [m.candidates[i] for i in sorted(stack_index[name] for name in picked if name in stack_index)]
    return group.decide(m.layers, chosen, total_bytes=m.total_bytes, gpu_budget=m.memory.gpu_budget,
                        cpu_budget=m.memory.cpu_budget, requested=m.offload.backend,
                        forced=m.offload.backends or {}, slots=m.step, cost=m.cost)


def _decide_budget(m: _Model, requested: str | None = None, lad: budget.Ladder | None = None) -> Choice:
    gpu = m.memory.gpu_budget
    if gpu is not None and gpu < m.total_bytes and not m.candidates:
        raise InfeasibleError(Infeasible("nothing_to_offload", gpu, m.memory.cpu_budget, m.total_bytes,
                                         total_bytes=m.total_bytes, why_nothing="no_params" if m.stack else "no_stack",
                                         selection=(_tuple(m.offload.params), _tuple(m.offload.kinds))))
    return budget.decide(m.layers, lad if lad is not None else _ladder(m), total_bytes=m.total_bytes, gpu_budget=gpu,
                         cpu_budget=m.memory.cpu_budget, requested=requested or m.offload.backend,
                         forced=m.offload.backends or {}, slots=m.step, cost=m.cost)


def _ladder(m: _Model) -> budget.Ladder:
    return budget.ladder(m.layers, m.candidates, m.offload.prefer)


def _tuple(values) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


# ---------------------------------------------------------------------------
# Words: the decision's reason and notes.


def _words(m: _Model, c: Choice) -> tuple[str, list[str]]:
    gpu, off = m.memory.gpu_budget, m.offload
    rule = build_notes.group_rule(off.group_size, off.num_in_group or 1) if c.strategy == "group" else ""
    reason = build_notes.reason(c, gpu_budget=gpu, total_bytes=m.total_bytes, backends=off.backends, rule=rule,
                                host=m.host)
    if c.strategy == "group":
        return reason, build_notes.group_notes(c, rule=rule, selection=m.selection, stack_len=len(m.stack),
                                               names=m.names)
    if not c.offloads:
        return reason, build_notes.none_notes(c, gpu_budget=gpu, total_bytes=m.total_bytes)
    return reason, build_notes.budget_notes(c, _ladder(m), selection=m.selection, gpu_budget=gpu or 0,
                                            prefer=off.prefer, names=m.names)


@gc_paused()  # a plan's objects live until it is done: a collection walks them and frees next to nothing
def plan(
    spec: SpecFile,
    *,
    gpu_budget: int | None = None,
    cpu_budget: int | None = None,
    kv_cache: int | str | None = None,
    kv_cache_dtype: str | None = None,
    backend: str | None = None,
    strategy: str | None = None,
    group_size: int | None = None,
    num_in_group: int | None = None,
    prefetch_step: int | None = None,
    params: list[str] | None = None,
    kinds: list[str] | None = None,
    prefer: list[str] | None = None,
    backends: dict[str, str] | None = None,
    hardware: HardwareProfile | str | None = None,
    workload: Workload | None = None,
    routing: RoutingStats | None = None,
    routing_ref: RoutingRef | None = None,
) -> Plan:
    """Plan ``spec``; keyword arguments override its memory/offload sections (None keeps the file's).

    ``routing``: measured routing (schemas/routing.py; ``routing_ref`` names its file): the most used experts
    stay on the GPU and the predictions use the measured rates; InputError when the spec does not match it.

    ``backends``: kind -> prefetch or uva for the offloaded params of that kind (offload.backends).
    ``kv_cache`` (bytes, or "auto") and ``kv_cache_dtype`` override memory.kv_cache and memory.kv_cache_dtype.

    The gpu_budget is the whole GPU: the KV cache, the activations and the workspace the workload needs
    (planner/memory) are taken off it first, and the strategy fits weights and buffers into the rest. A
    workload with ``batch: auto`` chooses its batch with the plan (planner/memory/throughput.py).

    ``hardware`` (a profile, or a bundled name or file; default the spec's, else h200: a relative file
    there is read from the current folder, where `planner plan` passes it resolved against the spec's
    folder, ``schemas.hardware.spec_hardware``) and
    ``workload`` (default the spec's, else decode at 1 token) set the plan's predictions.

    Raises pydantic.ValidationError for invalid merged settings, InfeasibleError when nothing fits
    the budgets, PlanningError for a request that cannot apply to this spec.
    """
    profile = hardware if isinstance(hardware, HardwareProfile) else load_hardware(hardware or spec.hardware)
    chosen_workload = workload or spec.workload or DEFAULT_WORKLOAD
    memory, offload = _merge(
        spec, {"gpu_budget": gpu_budget, "cpu_budget": cpu_budget, "kv_cache": kv_cache,
               "kv_cache_dtype": kv_cache_dtype},
        {"backend": backend, "strategy": strategy, "group_size": group_size, "num_in_group": num_in_group,
         "prefetch_step": prefetch_step, "params": params, "kinds": kinds, "prefer": prefer, "backends": backends})
    offload, host = link_view(offload)
    if memory.kv_cache == "auto" and memory.gpu_budget is None:
        raise PlanningError("kv_cache auto gives the KV cache what the plan leaves of the gpu_budget: give a "
                            "gpu_budget (--gpu-budget)")
    sizes = MemoryModel(spec.model, spec.model.expanded(), memory)
    links = _Links(host, routing, routing_ref)
    if chosen_workload.auto is not None:
        from planner.memory.throughput import plan_throughput

        return plan_throughput(lambda w: _plan_for(spec, sizes, memory, offload, profile, w, links), chosen_workload)
    return _plan_for(spec, sizes, memory, offload, profile, chosen_workload, links)


@dataclass(frozen=True)
class _Links:
    """What the plan adds to a strategy's choice: kinds the host computes, measured routing and its file."""

    host: frozenset[str] | set[str]
    routing: RoutingStats | None
    routing_ref: RoutingRef | None


def _plan_for(spec: SpecFile, sizes: MemoryModel, memory: MemorySection, offload: OffloadSection,
              profile: HardwareProfile, workload: Workload, links: _Links) -> Plan:
    """The plan for ``workload`` (every batch given): the memory besides the weights off the budget, then a
    strategy for the weights and buffers (the one point where the budget the strategies see is set), priced with
    the layer graphs where the plan, with this memory section, runs with them (``graphs_on``)."""
    mem = sizes.plan_memory(workload, profile)
    m = replace(_model(spec, memory.model_copy(update={"gpu_budget": weights_budget(memory.gpu_budget, mem)}),
                       offload, profile, workload, graphs_on(mem)),
                host=frozenset(links.host), routing=links.routing, routing_ref=links.routing_ref)
    routing, routing_ref = links.routing, links.routing_ref
    if routing is not None:
        problems = spec_problems(routing, m.layers)
        if problems:
            where = routing_ref.file if routing_ref is not None else "the routing statistics"
            raise InputError(f"{where} does not match the spec {spec.model.name} (recorded on {routing.model}): "
                             + "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else ""))
    try:
        made = _decide(spec, m, profile, workload, mem, memory.gpu_budget)
    except InfeasibleError as err:
        if memory.gpu_budget is None or err.min_gpu_budget is None:
            raise
        raise infeasible(err, memory.gpu_budget, mem) from None
    notes = memory_notes.budget_note(memory.gpu_budget, mem) + memory_notes.assumed_notes(
        mem, {name: item.batch is not None for name, item in workload.items()})
    thin = routing.thin() if routing is not None else []
    if thin:
        notes.append(experts_notes.thin_routing_note(
            routing_ref.file if routing_ref is not None else "the routing statistics", [t.layer for t in thin],
            min(t.choices_per_expert for t in thin), MIN_CHOICES_PER_EXPERT))
    if mem.kv_cache == "reserved":
        notes += memory_notes.room_notes(mem)
    summary = made.summary.model_copy(update={"notes": [*made.summary.notes, *notes]})
    return fill_kv(made.model_copy(update={"summary": summary}))


def _decide(spec: SpecFile, m: _Model, profile: HardwareProfile, workload: Workload, mem: PlanMemory,
            gpu_budget: int | None) -> Plan:
    """The strategy's plan of the weights and buffers, assembled with the memory section ``mem``."""
    offload = m.offload
    if offload.strategy == "auto" and offload.backend != "none":
        return _plan_auto(spec, m, profile, workload, mem, gpu_budget)
    if offload.backend == "none":
        choice = _decide_none(m)
    elif offload.strategy == "group":
        choice = _decide_group(m)
    else:
        choice = _decide_budget(m)
    cpu = m.memory.cpu_budget
    if cpu is not None and choice.offloaded_bytes > cpu:
        raise InfeasibleError(Infeasible("over_cpu", m.memory.gpu_budget, cpu, None, pinned=choice.offloaded_bytes))
    reason, notes = _words(m, choice)
    assignment = Assignment(_where(m, choice), offload.prefetch_step, offload.strategy, reason, tuple(notes))
    result = assemble(m.layers, m.placed(assignment, profile, workload), model_name=spec.model.name,
                      spec_sha256=spec_sha256(spec),  # hashed only for a plan: 0.3 s at 10,000 layers
                      gpu_budget=gpu_budget, cpu_budget=cpu, record_kinds=m.by_kind, memory=mem)
    return m.finished(result, profile, workload)


def _where(m: _Model, c: Choice) -> dict[str, dict[str, str]]:
    return {m.layers[p].name: dict(params) for p, params in c.placed.items()}


def _plan_auto(spec: SpecFile, m: _Model, profile: HardwareProfile, workload: Workload, mem: PlanMemory,
               gpu_budget: int | None) -> Plan:
    """strategy auto (planner/strategy/auto.py), with the best plan of the budget strategy as the runner-up."""
    trial = host_to_try(m.offload, workload, m.layers, m.shared) if not m.host else frozenset()
    if trial:  # auto's own choice of the cpu backend: the host shares the experts where that is faster
        m = replace(m, host=trial, host_optional=True)
    decision = auto.decide(m.layers, m.shared, m.memory, m.offload, profile, workload, m.offload.prefetch_step,
                           m.total_bytes, m.search_cost, whole=frozenset() if trial else frozenset(m.host),
                           trial=trial)
    names = m.names
    step = decision.slots if decision.prefetched else m.offload.prefetch_step
    placed = m.placed(auto.assignment(decision, "", (), step, names), profile, workload)
    position = {layer.name: layer.index for layer in m.layers}
    host_at = frozenset(position[name] for name, split in placed.experts.items() if split.cpu or not trial)
    reason = auto_notes.reason(decision, workload, profile.name, m.memory.gpu_budget, m.host, host_at)
    notes = auto_notes.notes(decision, names, m.memory.gpu_budget, m.host, host_at)
    result = assemble(m.layers, replace(placed, reason=reason, notes=tuple(notes) + placed.notes),
                      model_name=spec.model.name, spec_sha256=spec_sha256(spec), gpu_budget=gpu_budget,
                      cpu_budget=m.memory.cpu_budget, record_kinds=m.by_kind, memory=mem)
    chosen = m.finished(result, profile, workload)
    runner_up = _runner_up(m, profile, workload)
    if runner_up is None:
        return chosen
    # the runner-up's note goes after auto's own notes (the schedule's follow them); nothing else changes
    ours = chosen.predictions.weighted_step_ms if chosen.predictions else 0.0
    with_runner_up = auto_notes.notes(replace(decision, runner_up=replace(runner_up, ours_ms=ours)), names,
                                      m.memory.gpu_budget, m.host, host_at)
    summary_notes = with_runner_up + chosen.summary.notes[len(notes):]
    return chosen.model_copy(update={"summary": chosen.summary.model_copy(update={"notes": summary_notes})})


def _runner_up(m: _Model, profile: HardwareProfile, workload: Workload) -> RunnerUp | None:
    """The fastest plan of the budget strategy at the same budget (placed as auto's, predicted at the measured
    routing rates), or None; its ``ours_ms`` is left for the caller. Each backend's plan is priced as
    ``predict`` prices it once assembled (``PlacementCost.plan_timelines``), without assembling it."""
    if m.memory.gpu_budget is None:
        return None
    best = None
    lad = _ladder(m)
    position = {layer.name: layer.index for layer in m.layers}
    for backend in ("prefetch", "uva"):
        if m.offload.backend not in ("auto", backend):
            continue
        try:
            choice = _decide_budget(m, backend, lad)
        except (InfeasibleError, PlanningError):
            continue
        if not choice.offloads:
            continue
        placed = m.placed(Assignment(_where(m, choice), m.offload.prefetch_step, "budget", "", ()), profile, workload)
        timelines = m.cost.plan_timelines({position[name]: params for name, params in placed.where.items()}, m.step,
                                          experts={position[name]: split for name, split in placed.experts.items()},
                                          shares=m.shares)
        ms = weighted_step_ms([(r.step_ms, r.weight) for r in prediction_rows(timelines, workload, profile)])
        if best is None or ms < best.step_ms:
            best = RunnerUp(choice.backend, choice.offloaded_bytes, ms, 0.0)
    return best
