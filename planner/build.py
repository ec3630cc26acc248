"""spec -> Plan: apply overrides, decide what to offload and how (an ``Assignment``), assemble the file.

The budget and group strategies decide here; ``planner.assemble`` turns their ``Assignment``
into the plan. With ``offload.backends`` the params of the listed kinds use their own backend
(prefetch or uva) and the others ``offload.backend`` (with auto: prefetch, then UVA).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from schemas.hardware import HardwareProfile, load_hardware
from schemas.plan import Plan
from schemas.sizes import format_bytes
from schemas.spec_hash import spec_sha256
from schemas.spec import Layer, MemorySection, OffloadSection, SpecFile
from schemas.workload import DEFAULT_WORKLOAD, Workload

from planner.assemble import assemble
from planner.assemble import Assignment, ParamBackend
from schemas.buffer_pool import Signature, signature
from planner.strategy.footprint import Candidate, Cost, evaluate
from planner.errors import InfeasibleError, PlanningError
from planner.layers import build_graph, find_block_stack, layers_in_order, tied_owners
from planner.kinds import param_kind
from planner.words.names import join_names
from planner.cost.predict import predict
from planner.words import auto_notes
from planner.strategy.auto import assignment as auto_assignment
from planner.strategy.auto import decide as decide_auto
from schemas.schedule import DEFAULT_PREFETCH_STEP
from planner.layers import eligible_params, group_rule
from planner.strategy.budget import Tier, prefer_tiers, previous_state, search, single_tier
from planner.strategy.experts import host_to_try, keep_hot, link_view, prefer_host, to_host
from schemas.errors import InputError
from schemas.routing import RoutingRef, RoutingStats, spec_problems
from planner.memory.parts import MemoryModel, fill_kv, infeasible, weights_budget
from planner.words import memory_notes
from schemas.plan_memory import PlanMemory

WHY_PREFETCH = "prefetch reads each weight once per forward, UVA re-reads it on every use"


@dataclass
class _Model:
    """The spec's layers, block stack and offload candidates, plus the merged settings."""

    layers: list[Layer]
    stack: list[str]
    candidates: list[Candidate]
    total_bytes: int
    memory: MemorySection
    offload: OffloadSection
    tiers: list[Tier]  # the budget search's ladder (one tier without offload.prefer)
    shared: dict[str, set[str]] = field(default_factory=dict)  # layer -> its params other params are tied to
    host: frozenset[str] = frozenset()  # kinds the host computes (offload.backends cpu; placed as uva)
    routing: RoutingStats | None = None  # measured routing (planner plan --routing)
    routing_ref: RoutingRef | None = None

    @property
    def shares(self) -> dict[str, list[float]] | None:
        return None if self.routing is None else self.routing.shares()

    def placed(self, assignment: Assignment, profile: HardwareProfile, workload: Workload) -> Assignment:
        """A strategy's assignment with its host kinds shared between the host and the link and, with measured
        routing, the most used experts kept on the GPU (planner/strategy/experts.py)."""
        chosen = to_host(assignment, self.layers, self.host, profile, workload)
        if self.routing is None:
            return chosen

        def peak(a: Assignment) -> int:
            return assemble(self.layers, a, model_name="peak", spec_sha256="0" * 64, checked=False).summary.peak_gpu_bytes

        return keep_hot(chosen, self.layers, self.shares, self.memory.gpu_budget, self.host, profile, workload,
                        peak).assignment

    def finished(self, plan: Plan, profile: HardwareProfile, workload: Workload) -> Plan:
        """The plan with its predictions (at the measured routing rates) and the routing it was made with."""
        update: dict = {"predictions": predict(plan, profile, workload, self.shares)}
        if self.routing_ref is not None:
            update["summary"] = plan.summary.model_copy(update={"routing": self.routing_ref})
        return plan.model_copy(update=update)
    _split: dict[tuple[int, str], Candidate] = field(default_factory=dict)  # (id(candidate), base) -> its split
    _sigs: dict[Signature, Signature] = field(default_factory=dict)

    @property
    def by_kind(self) -> bool:
        """The selection used kinds (offload.kinds or offload.prefer): the plan records each param's kind."""
        return self.offload.kinds is not None or self.offload.prefer is not None

    def size(self, n: int) -> str:
        """A size for a note: schemas.sizes.format_bytes, the one formatter every strategy's words use."""
        return format_bytes(n)

    @property
    def step(self) -> int:
        """The prefetch step (number of buffer slots): the spec's, else the default."""
        return self.offload.prefetch_step or DEFAULT_PREFETCH_STEP

    def evaluate(self, chosen: list[int], base: str) -> Cost:
        candidates = self.candidates if not self.offload.backends else [self.split(c, base) for c in self.candidates]
        return evaluate(candidates, chosen, total_bytes=self.total_bytes, num_layers=len(self.layers),
                        backend=self.cost_backend(base), step=self.step)

    # -- offload.backends: a backend per kind -----------------------------------------------
    def cost_backend(self, base: str) -> str:
        """How the search costs plans whose unlisted kinds use ``base``: per candidate with offload.backends."""
        return "mixed" if self.offload.backends else base

    def split(self, c: Candidate, base: str) -> Candidate:
        """``c`` with its UVA params marked and a pool signature of its prefetched params only."""
        key = (id(c), base)
        found = self._split.get(key)
        if found is None:
            layer = self.layers[c.position]
            tensors = {t.name: t for t in layer.params}
            chosen = self.offload.backends or {}
            uva = tuple(p for p in c.params
                        if chosen.get(param_kind(layer.name, p, tensors[p].kind), base) == "uva")
            sig = signature(tensors[p] for p in c.params if p not in uva)
            found = self._split[key] = replace(c, uva=uva, signature=self._sigs.setdefault(sig, sig))
        return found

    def tiers_for(self, base: str) -> list[Tier]:
        if not self.offload.backends:
            return self.tiers

        def split(cs: tuple[Candidate | None, ...]) -> tuple[Candidate | None, ...]:
            return tuple(None if c is None else self.split(c, base) for c in cs)

        return [Tier(t.kinds, split(t.base), split(t.full), t.members) for t in self.tiers]

    def backends_text(self, base: str) -> str:
        """The per-kind backends as a reason's prefix ('' without offload.backends)."""
        if not self.offload.backends:
            return ""
        listed = ", ".join(f"{kind} {'cpu' if kind in self.host else backend}"
                           for kind, backend in self.offload.backends.items())
        return f"offload.backends: {listed}; other kinds "


@dataclass
class _Outcome:
    backend: str  # the backend of the unlisted kinds (all kinds without offload.backends), or none
    reason: str
    cost: Cost | None  # None: nothing offloaded
    notes: list[str] = field(default_factory=list)


def _merge(spec: SpecFile, memory: dict, offload: dict) -> tuple[MemorySection, OffloadSection]:
    mem = spec.memory.model_dump()
    mem.update({k: v for k, v in memory.items() if v is not None})
    off = spec.offload.model_dump(exclude_unset=True)  # an unset strategy stays unset: prefer then means budget
    off.update({k: v for k, v in offload.items() if v is not None})
    return MemorySection.model_validate(mem), OffloadSection.model_validate(off)


def _model(spec: SpecFile, memory: MemorySection, offload: OffloadSection) -> _Model:
    graph = build_graph(spec.model.expanded())
    layers = layers_in_order(graph)
    stack = find_block_stack(graph)
    shared = tied_owners(graph)
    by_name = {layer.name: layer for layer in layers}
    candidates = []
    interned: dict = {}  # one signature object per distinct param set: the pool builder groups by identity
    kinded = []  # (position, eligible tensors, their kinds), for the prefer ladder
    for name in stack:
        eligible = eligible_params(by_name[name], offload.params, shared.get(name, set()), offload.kinds)
        if eligible:
            sig = signature(eligible)
            candidates.append(Candidate(by_name[name].index, tuple(t.name for t in eligible),
                                        sum(t.nbytes for t in eligible), interned.setdefault(sig, sig)))
            if offload.prefer is not None:
                kinded.append((by_name[name].index, eligible, [param_kind(name, t.name, t.kind) for t in eligible]))
    tiers = [single_tier(candidates)] if offload.prefer is None else prefer_tiers(kinded, offload.prefer)
    total = sum(layer.nbytes for layer in layers)
    return _Model(layers, stack, candidates, total, memory, offload, tiers, shared=shared)


# ---------------------------------------------------------------------------
# Deciding what to offload and with which backend.


def _fits(cost: Cost, budget: int | None) -> bool:
    return budget is None or cost.peak_gpu_bytes <= budget


def _infeasible(what: str, m: _Model, lowest: dict[str, Cost]) -> InfeasibleError:
    gpu = m.memory.gpu_budget
    best = min(lowest.values(), key=lambda c: c.peak_gpu_bytes)
    details = "; ".join(
        f"{backend} needs at least {m.size(c.peak_gpu_bytes)} ({c.peak_gpu_bytes} bytes, "
        f"{len(c.chosen)} layers offloaded)" for backend, c in sorted(lowest.items()))
    cpu = f" within the {m.size(m.memory.cpu_budget)} cpu_budget" if m.memory.cpu_budget else ""
    return InfeasibleError(
        f"{what} fits the {m.size(gpu)} gpu_budget{cpu}: {details}; "
        f"the smallest feasible gpu_budget is {best.peak_gpu_bytes} bytes", best.peak_gpu_bytes)


def _decide_none(m: _Model) -> _Outcome:
    gpu = m.memory.gpu_budget
    if gpu is not None and m.total_bytes > gpu:
        raise InfeasibleError(
            f"backend none keeps the whole model ({m.size(m.total_bytes)}) on the GPU, which exceeds the "
            f"{m.size(gpu)} gpu_budget; the smallest feasible gpu_budget is {m.total_bytes} bytes",
            m.total_bytes)
    return _Outcome("none", "backend none requested: nothing is offloaded", None,
                    ["backend none: every param stays on the GPU"])


def _choose_backend(m: _Model, costs: dict[str, Cost]) -> _Outcome:
    """Pick among plans of the same layers: the requested backend, or auto's preference."""
    gpu = m.memory.gpu_budget
    requested = m.offload.backend
    if requested != "auto":
        cost = costs[requested]
        if not _fits(cost, gpu):
            raise _infeasible(f"no {requested} plan", m, {requested: cost})
        return _Outcome(requested, f"{m.backends_text(requested)}{requested} requested", cost)
    pf, uva = costs["prefetch"], costs["uva"]
    pool = f"with a {m.size(pf.buffer_bytes)} buffer pool"
    if gpu is None:
        return _Outcome("prefetch", f"{m.backends_text('prefetch')}auto: no gpu_budget given, prefetch {pool}; "
                                    f"{WHY_PREFETCH}", pf)
    if _fits(pf, gpu):
        return _Outcome("prefetch", f"{m.backends_text('prefetch')}auto: prefetch fits {m.size(gpu)} {pool}; "
                                    f"{WHY_PREFETCH}", pf)
    if _fits(uva, gpu):
        return _Outcome("uva", f"{m.backends_text('uva')}auto: no prefetch plan fits {m.size(gpu)} (its buffer "
                               f"pool needs {m.size(pf.buffer_bytes)}); UVA fits with no buffer pool", uva)
    raise _infeasible("no plan", m, costs)


def _params_desc(m: _Model) -> str:
    segs, kinds = m.offload.params, m.offload.kinds
    if segs is None and kinds is None:
        return "all params"
    of_kind = "" if kinds is None else " of kind " + ", ".join(kinds)
    matching = "" if segs is None else " matching " + ", ".join(segs)
    return f"the params{of_kind}{matching}"


def _decide_group(m: _Model) -> _Outcome:
    if not m.stack:
        raise PlanningError("strategy group needs a block stack (layers named <prefix>.<int>, e.g. "
                            "model.layers.{i} with repeat), and this spec has none")
    g, k = m.offload.group_size, m.offload.num_in_group or 1
    stack_index = {m.layers[c.position].name: i for i, c in enumerate(m.candidates)}
    picked = [m.stack[i] for i in group_rule(len(m.stack), g, k)]
    chosen = sorted(stack_index[name] for name in picked if name in stack_index)
    rule = f"group rule: the last {k} of every {g} block-stack layers"
    if not chosen:
        out = _Outcome("none", f"{rule} selects no layer with eligible params: nothing is offloaded", None)
        _check_budget_none(m)
        return out
    out = _choose_backend(m, {b: m.evaluate(chosen, b) for b in ("prefetch", "uva")})
    out.notes.append(f"{rule}: offloaded {_params_desc(m)} of {len(chosen)} of {len(m.stack)} layers "
                     f"({join_names(m.layers[m.candidates[i].position].name for i in chosen)})")
    return out


def _check_budget_none(m: _Model) -> None:
    gpu = m.memory.gpu_budget
    if gpu is not None and m.total_bytes > gpu:
        raise InfeasibleError(f"nothing can be offloaded and the model ({m.size(m.total_bytes)}) exceeds "
                              f"the {m.size(gpu)} gpu_budget", m.total_bytes)


def _decide_budget(m: _Model) -> _Outcome:
    gpu = m.memory.gpu_budget
    if gpu is None:
        return _Outcome("none", "no gpu_budget given: nothing is offloaded", None,
                        ["strategy budget without a gpu_budget: nothing offloaded (give --gpu-budget)"])
    if m.total_bytes <= gpu:
        return _Outcome("none", f"the whole model ({m.size(m.total_bytes)}) fits the {m.size(gpu)} gpu_budget",
                        None, [f"the whole model ({m.size(m.total_bytes)}) fits the {m.size(gpu)} gpu_budget: "
                               "nothing offloaded"])
    if not m.candidates:
        where = "no block stack" if not m.stack else f"no block-stack layer has {_params_desc(m)}"
        raise InfeasibleError(f"the model ({m.size(m.total_bytes)}) exceeds the {m.size(gpu)} gpu_budget and "
                              f"nothing can be offloaded ({where}); the smallest feasible gpu_budget is "
                              f"{m.total_bytes} bytes", m.total_bytes)
    backends = ["prefetch", "uva"] if m.offload.backend == "auto" else [m.offload.backend]
    lowest: dict[str, Cost] = {}
    start = (0, 0)
    for backend in backends:
        # below the lowest prefetch peak, UVA offloads at least what that prefetch plan offloads, so as the
        # budget grows past it params only turn from UVA to prefetch: none moves from the GPU to the host
        found = search(m.tiers_for(backend), total_bytes=m.total_bytes, num_layers=len(m.layers),
                       backend=m.cost_backend(backend), step=m.step, gpu_budget=gpu,
                       cpu_budget=m.memory.cpu_budget, start=start)
        if found.lowest_state is not None:
            start = found.lowest_state
        if found.fit is not None:
            out = _Outcome(backend, m.backends_text(backend) + _budget_reason(m, backend, found.fit, lowest),
                           found.fit)
            out.notes.append(_budget_note(m, backend, found.fit, found.state))
            out.notes += _prefer_notes(m)
            return out
        lowest[backend] = found.lowest
    raise _infeasible("no plan", m, lowest)


def _budget_reason(m: _Model, backend: str, fit: Cost, lowest: dict[str, Cost]) -> str:
    gpu = m.size(m.memory.gpu_budget)
    if m.offload.backend != "auto":
        return f"{backend} requested"
    if backend == "prefetch":
        return f"auto: prefetch fits {gpu} with a {m.size(fit.buffer_bytes)} buffer pool; {WHY_PREFETCH}"
    return (f"auto: no prefetch plan fits {gpu} (the lowest prefetch peak is "
            f"{m.size(lowest['prefetch'].peak_gpu_bytes)}); UVA fits with no buffer pool")


def _state_cost(m: _Model, state: tuple[int, int], backend: str) -> Cost:
    picked = m.tiers_for(backend)[state[0]].pick(state[1])
    return evaluate(picked, range(len(picked)), total_bytes=m.total_bytes, num_layers=len(m.layers),
                    backend=m.cost_backend(backend), step=m.step)


def _budget_note(m: _Model, backend: str, cost: Cost, state: tuple[int, int] | None) -> str:
    assert state is not None
    t, n = state
    tier = m.tiers[t]
    total = len(tier.members)
    names = join_names(m.layers[tier.full[i].position].name for i in tier.chosen(n))  # type: ignore[union-attr]
    fewer_state = previous_state(m.tiers, t, n)
    fewer = ""
    if fewer_state is not None:
        peak = m.size(_state_cost(m, fewer_state, backend).peak_gpu_bytes)
        fewer = f"; {n - 1} layers would peak at {peak}" if n > 1 or not tier.kinds else \
            f"; without {_tier_label(m, tier)} it would peak at {peak}"
    budget = f"the fewest that fit the {m.size(m.memory.gpu_budget)} gpu_budget (peak {m.size(cost.peak_gpu_bytes)}{fewer})"
    if not tier.kinds:
        return (f"budget: offloaded {_params_desc(m)} of {n} of {total} block-stack layers, spread evenly and "
                f"ending at the last one ({names}): {budget}")
    order = ", then ".join(_tier_label(m, tr) for tr in m.tiers)
    done = [f"{_tier_label(m, m.tiers[i])} of all {len(m.tiers[i].members)} block-stack layers holding it"
            for i in range(t)]
    this = (f"{_tier_label(m, tier)} of {n} of the {total} block-stack layers holding it, spread evenly and "
            f"ending at the last one ({names})")
    return f"budget by kind ({order}; among {_params_desc(m)}): offloaded {'; then '.join(done + [this])}: {budget}"


def _tier_label(m: _Model, tier: Tier) -> str:
    if len(tier.kinds) == 1 and tier.kinds[0] in (m.offload.prefer or ()):
        return tier.kinds[0]
    return f"the other kinds ({', '.join(tier.kinds)})"


def _prefer_notes(m: _Model) -> list[str]:
    present = {k for tier in m.tiers for k in tier.kinds}
    missing = [k for k in m.offload.prefer or () if k not in present]
    if not missing:
        return []
    return [f"prefer: no eligible block-stack param is of kind {', '.join(missing)}; "
            f"{'it was' if len(missing) == 1 else 'they were'} skipped"]


# ---------------------------------------------------------------------------
# The decision as a record (planner/assemble.py), for planner/assemble.py.


def _assignment(m: _Model, out: _Outcome) -> Assignment:
    where: dict[str, dict[str, ParamBackend]] = {}
    cost = out.cost
    if cost is not None:
        for c in cost.picked:
            uva = set(c.uva)
            where[m.layers[c.position].name] = {
                p: "uva" if cost.backend == "uva" or p in uva else "prefetch" for p in c.params}
    return Assignment(where, m.offload.prefetch_step, m.offload.strategy, out.reason, tuple(out.notes))


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
    strategy for the weights and buffers (the one point where the budget the strategies see is set)."""
    mem = sizes.plan_memory(workload, profile)
    m = replace(_model(spec, memory.model_copy(update={"gpu_budget": weights_budget(memory.gpu_budget, mem)}),
                       offload), host=links.host, routing=links.routing, routing_ref=links.routing_ref)
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
        out = _decide_none(m)
    elif offload.strategy == "group":
        out = _decide_group(m)
    else:
        out = _decide_budget(m)
    cpu = m.memory.cpu_budget
    if out.cost is not None and cpu is not None and out.cost.offloaded_bytes > cpu:
        raise InfeasibleError(f"the plan pins {m.size(out.cost.offloaded_bytes)} of host memory, more than the "
                              f"{m.size(cpu)} cpu_budget", None)
    result = assemble(m.layers, m.placed(_assignment(m, out), profile, workload), model_name=spec.model.name,
                      spec_sha256=spec_sha256(spec),  # hashed only for a plan: 0.3 s at 10,000 layers
                      gpu_budget=gpu_budget, cpu_budget=cpu, record_kinds=m.by_kind, memory=mem)
    return m.finished(result, profile, workload)


def _plan_auto(spec: SpecFile, m: _Model, profile: HardwareProfile, workload: Workload, mem: PlanMemory,
               gpu_budget: int | None) -> Plan:
    """strategy auto (planner/strategy/auto.py), with the best plan of the budget strategy as the runner-up."""
    decision = decide_auto(m.layers, m.shared, m.memory, m.offload, profile, workload, m.offload.prefetch_step,
                           m.total_bytes)
    names = [layer.name for layer in m.layers]

    def build(notes: list[str], m: _Model) -> Plan:
        reason = auto_notes.reason(decision, workload, profile.name, m.memory.gpu_budget, m.host)
        step = decision.slots if decision.prefetched else m.offload.prefetch_step
        chosen = m.placed(auto_assignment(decision, reason, notes, step, names), profile, workload)
        result = assemble(m.layers, chosen, model_name=spec.model.name,
                          spec_sha256=spec_sha256(spec), gpu_budget=gpu_budget,
                          cpu_budget=m.memory.cpu_budget, record_kinds=m.by_kind, memory=mem)
        return m.finished(result, profile, workload)

    notes = auto_notes.notes(decision, names, None, m.memory.gpu_budget, m.host)
    chosen = build(notes, m)
    host = host_to_try(m.offload, workload, decision.where, m.layers)
    if host:  # auto's own choice of the cpu backend: the host shares the experts auto put on UVA, if that is faster
        hybrid = replace(m, host=m.host | host)
        hybrid_notes = auto_notes.notes(decision, names, None, m.memory.gpu_budget, hybrid.host)
        alt = build(hybrid_notes, hybrid)
        if prefer_host(alt.predictions.weighted_step_ms, chosen.predictions.weighted_step_ms):
            m, notes, chosen = hybrid, hybrid_notes, alt
    runner_up = None
    for backend in ("prefetch", "uva"):
        if m.offload.backend not in ("auto", backend) or m.memory.gpu_budget is None:
            continue
        other = replace(m, offload=m.offload.model_copy(update={"strategy": "budget", "backend": backend}))
        try:
            out = _decide_budget(other)
        except (InfeasibleError, PlanningError):
            continue
        if out.cost is None:
            continue
        alt = assemble(other.layers, m.placed(_assignment(other, out), profile, workload),
                       model_name=spec.model.name, spec_sha256="0" * 64,
                       cpu_budget=m.memory.cpu_budget, checked=False, memory=mem)
        ms = predict(alt, profile, workload, m.shares).weighted_step_ms
        if runner_up is None or ms < runner_up[1]:
            runner_up = (f"strategy budget with {backend} ({format_bytes(out.cost.offloaded_bytes)} offloaded)", ms)
    if runner_up is None:
        return chosen
    # the runner-up's note goes after auto's own notes (the schedule's follow them); nothing else changes
    ours = chosen.predictions.weighted_step_ms if chosen.predictions else 0.0
    with_runner_up = auto_notes.notes(decision, names, (runner_up[0], runner_up[1], ours), m.memory.gpu_budget, m.host)
    summary_notes = with_runner_up + chosen.summary.notes[len(notes):]
    return chosen.model_copy(update={"summary": chosen.summary.model_copy(update={"notes": summary_notes})})
