"""spec -> Plan, read top to bottom: apply overrides, pick the layers that may move, let the strategy decide
(a record: planner/strategy/), put the decision into words (planner/words/), assemble the plan file
(planner/assemble.py) and predict its step (planner/cost/).

With ``offload.backends`` the params of the listed kinds use their own backend (prefetch or uva) and
the others ``offload.backend`` (with auto: prefetch, then UVA).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.hardware import HardwareProfile, load_hardware
from schemas.plan import Plan
from schemas.schedule import DEFAULT_PREFETCH_STEP
from schemas.spec import Layer, MemorySection, OffloadSection, SpecFile, Tensor
from schemas.spec_hash import spec_sha256
from schemas.workload import DEFAULT_WORKLOAD, Workload

from planner.assemble import Assignment, assemble
from planner.cost.placement import PlacementCost
from planner.cost.predict import predict
from planner.errors import InfeasibleError, PlanningError
from planner.layers import build_graph, eligible_params, find_block_stack, group_rule, layers_in_order, tied_owners
from planner.strategy import auto, budget, group
from planner.strategy.choice import Choice
from planner.strategy.infeasible import Infeasible
from planner.words import auto_notes, build_notes


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

    @property
    def by_kind(self) -> bool:
        """The selection used kinds (offload.kinds or offload.prefer): the plan records each param's kind."""
        return self.offload.kinds is not None or self.offload.prefer is not None

    @property
    def step(self) -> int:
        """The prefetch step (number of buffer slots): the spec's, else the default."""
        return self.offload.prefetch_step or DEFAULT_PREFETCH_STEP

    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    @property
    def selection(self) -> str:
        return build_notes.params_desc(self.offload.params, self.offload.kinds)


def _merge(spec: SpecFile, memory: dict, offload: dict) -> tuple[MemorySection, OffloadSection]:
    mem = spec.memory.model_dump()
    mem.update({k: v for k, v in memory.items() if v is not None})
    off = spec.offload.model_dump(exclude_unset=True)  # an unset strategy stays unset: prefer then means budget
    off.update({k: v for k, v in offload.items() if v is not None})
    return MemorySection.model_validate(mem), OffloadSection.model_validate(off)


def _model(spec: SpecFile, memory: MemorySection, offload: OffloadSection, hardware: HardwareProfile | None = None,
           workload: Workload | None = None) -> _Model:
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
    cost = PlacementCost(layers, hardware or load_hardware(spec.hardware), workload or spec.workload or DEFAULT_WORKLOAD)
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


def _decide_budget(m: _Model, requested: str | None = None) -> Choice:
    gpu = m.memory.gpu_budget
    if gpu is not None and gpu < m.total_bytes and not m.candidates:
        raise InfeasibleError(Infeasible("nothing_to_offload", gpu, m.memory.cpu_budget, m.total_bytes,
                                         total_bytes=m.total_bytes, why_nothing="no_params" if m.stack else "no_stack",
                                         selection=(_tuple(m.offload.params), _tuple(m.offload.kinds))))
    return budget.decide(m.layers, _ladder(m), total_bytes=m.total_bytes, gpu_budget=gpu,
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
    reason = build_notes.reason(c, gpu_budget=gpu, total_bytes=m.total_bytes, backends=off.backends, rule=rule)
    if c.strategy == "group":
        return reason, build_notes.group_notes(c, rule=rule, selection=m.selection, stack_len=len(m.stack),
                                               names=m.names)
    if not c.offloads:
        return reason, build_notes.none_notes(c, gpu_budget=gpu, total_bytes=m.total_bytes)
    return reason, build_notes.budget_notes(c, _ladder(m), selection=m.selection, gpu_budget=gpu or 0,
                                            prefer=off.prefer, names=m.names)


def plan(
    spec: SpecFile,
    *,
    gpu_budget: int | None = None,
    cpu_budget: int | None = None,
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
) -> Plan:
    """Plan ``spec``; keyword arguments override its memory/offload sections (None keeps the file's).

    ``backends``: kind -> prefetch or uva for the offloaded params of that kind (offload.backends).

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
        spec, {"gpu_budget": gpu_budget, "cpu_budget": cpu_budget},
        {"backend": backend, "strategy": strategy, "group_size": group_size, "num_in_group": num_in_group,
         "prefetch_step": prefetch_step, "params": params, "kinds": kinds, "prefer": prefer, "backends": backends})
    m = _model(spec, memory, offload, profile, chosen_workload)
    if offload.strategy == "auto" and offload.backend != "none":
        return _plan_auto(spec, m, profile, chosen_workload)
    if offload.backend == "none":
        choice = _decide_none(m)
    elif offload.strategy == "group":
        choice = _decide_group(m)
    else:
        choice = _decide_budget(m)
    cpu = memory.cpu_budget
    if cpu is not None and choice.offloaded_bytes > cpu:
        raise InfeasibleError(Infeasible("over_cpu", memory.gpu_budget, cpu, None, pinned=choice.offloaded_bytes))
    reason, notes = _words(m, choice)
    where = {m.layers[p].name: params for p, params in choice.placed.items()}
    assignment = Assignment(where, offload.prefetch_step, offload.strategy, reason, tuple(notes))
    return _predicted(spec, m, assignment, profile, chosen_workload)


def _predicted(spec: SpecFile, m: _Model, assignment: Assignment, profile: HardwareProfile,
               workload: Workload) -> Plan:
    result = assemble(m.layers, assignment, model_name=spec.model.name,
                      spec_sha256=spec_sha256(spec),  # hashed only for a plan: 0.3 s at 10,000 layers
                      gpu_budget=m.memory.gpu_budget, cpu_budget=m.memory.cpu_budget, record_kinds=m.by_kind)
    return result.model_copy(update={"predictions": predict(result, profile, workload)})


def _plan_auto(spec: SpecFile, m: _Model, profile: HardwareProfile, workload: Workload) -> Plan:
    """strategy auto (planner/strategy/auto.py), with the best plan of the budget strategy as the runner-up."""
    decision = auto.decide(m.layers, m.shared, m.memory, m.offload, profile, workload, m.offload.prefetch_step,
                           m.total_bytes, m.cost)
    if m.memory.gpu_budget is not None:
        choices = []
        for backend in ("prefetch", "uva"):
            if m.offload.backend not in ("auto", backend):
                continue
            try:
                choices.append(_decide_budget(m, backend))
            except (InfeasibleError, PlanningError):
                continue
        decision = auto.with_runner_up(decision, choices, m.cost)
    reason = auto_notes.reason(decision, workload, profile.name, m.memory.gpu_budget)
    notes = auto_notes.notes(decision, m.names, m.memory.gpu_budget)
    step = decision.slots if decision.prefetched else m.offload.prefetch_step
    return _predicted(spec, m, auto.assignment(decision, reason, notes, step, m.names), profile, workload)
