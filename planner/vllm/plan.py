"""`planner plan SPEC --from-vllm "FLAGS"`: the plan vLLM would execute for these offload flags.

vLLM's rules decide (planner/vllm/select.py, on vLLM's view of each layer: planner/vllm/layout.py);
``planner.assemble`` writes the plan as for any strategy, so ``planner show``/``diff`` compare it
with auto's plan. The plan says where it came from in its first note and its backend_reason;
its strategy is ``group`` (prefetch flags) or ``budget`` (``--cpu-offload-gb``). Those notes are worded in
planner/vllm/notes.py.

The plan runs the selection as vLLM's prefetch offloader does (planner/vllm/select.py says which vLLM
was read): its buffer pool holds a buffer for every param key in each of the ``--offload-prefetch-step``
slots (``buffer_pool.every_slot``), so its peak is vLLM's; a layer alone in its slot is copied once, at
start-up, and never again (``prefetch.once``); and a layer's copy starts once the previous user of its
slot has run (vLLM before its slot-ownership fix started layer ``(j + S) % N``'s copy after layer j, which
for N not a multiple of S could overwrite a slot whose layer had not run: the notes say so).
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas.hardware import load_hardware
from schemas.hardware_profile import HardwareProfile
from schemas.plan import Plan
from schemas.spec import SpecFile
from schemas.spec_layers import Layer
from schemas.spec_hash import spec_sha256
from schemas.workload import DEFAULT_WORKLOAD, Workload

from planner.vllm import notes as vllm_notes
from planner.assemble import assemble
from planner.memory.parts import MemoryModel
from schemas.plan_memory import PlanMemory
from planner.assemble import Assignment
from planner.errors import InfeasibleError, PlanningError
from planner.strategy.infeasible import Infeasible, Need
from planner.layers import build_graph, find_block_stack, layers_in_order, tied_owners
from planner.cost.predict import predict
from planner.vllm.flags import VllmFlags, gib_text
from planner.vllm.layout import SpecParam, matches, vllm_params
from planner.vllm.select import StackLayer, layer_limits, select, split_layer


def stack_view(layers: Sequence[Layer], stack: Sequence[str]) -> list[StackLayer]:
    """The block-stack layers with vLLM's params (worked out once per distinct list of params)."""
    by_name = {layer.name: layer for layer in layers}
    made: dict[tuple, tuple] = {}
    out = []
    for name in stack:
        key = tuple((t.name, t.nbytes, t.buffer) for t in by_name[name].params)
        params = made.get(key)
        if params is None:
            params = made[key] = tuple(vllm_params(SpecParam(*k) for k in key))
        out.append(StackLayer(name, params))
    return out


def from_vllm(spec: SpecFile, flags: VllmFlags, *, gpu_budget: int | None = None, cpu_budget: int | None = None,
              hardware: HardwareProfile | str | None = None, workload: Workload | None = None) -> Plan:
    """The plan vLLM makes of ``spec`` with ``flags``. vLLM's flags replace the spec's offload and memory
    sections; ``gpu_budget``/``cpu_budget``, when given, are checked against the plan and recorded in it.
    Raises PlanningError (no block stack, a tied param selected) or InfeasibleError (over a budget)."""
    profile = hardware if isinstance(hardware, HardwareProfile) else load_hardware(hardware or spec.hardware)
    gpu, cpu = gpu_budget, cpu_budget
    graph = build_graph(spec.model.expanded())
    layers = layers_in_order(graph)
    stack = find_block_stack(graph)
    if flags.mode != "none" and not stack:
        raise PlanningError("--from-vllm: vLLM offloads only decoder layers (layers named <prefix>.<int>, e.g. "
                            "model.layers.{i} with repeat), and this spec has none")
    chosen_workload = workload or spec.workload or DEFAULT_WORKLOAD
    if chosen_workload.auto is not None:
        raise PlanningError("--from-vllm plans what vLLM's flags make for the workload's batches: batch auto, "
                            "which chooses the batch with the plan, does not apply (give the batch)")
    memory = MemoryModel(spec.model, spec.model.expanded(), spec.memory).plan_memory(chosen_workload, profile)
    view = stack_view(layers, stack)
    if spec.model.param_order == "name":
        _refuse_unknown_order(view, flags)
    plan = build(layers, stack, flags, model_name=spec.model.name, spec_sha256=spec_sha256(spec),
                 gpu_budget=None, cpu_budget=None, shared=tied_owners(graph), view=view, memory=memory)
    _check_budgets(plan, gpu, cpu)  # checked here, so the budgets are recorded without a second check
    plan = plan.model_copy(update={"summary": plan.summary.model_copy(
        update={"gpu_budget_bytes": gpu, "cpu_budget_bytes": cpu})})
    return plan.model_copy(update={"predictions": predict(plan, profile, chosen_workload)})


def build(layers: Sequence[Layer], stack: Sequence[str], flags: VllmFlags, *, model_name: str, spec_sha256: str,
          gpu_budget: int | None, cpu_budget: int | None, shared: dict[str, set[str]] | None = None,
          view: Sequence[StackLayer] | None = None, checked: bool = True, memory: PlanMemory | None = None) -> Plan:
    """The plan (without predictions) of vLLM's selection for ``flags`` over ``layers``; ``view``: the
    stack's ``stack_view``, when the caller has it; ``checked=False``: a plan only compared, never written
    (planner.assemble); ``memory``: what the plan counts besides the weights (planner.memory)."""
    chosen = select(stack_view(layers, stack) if view is None else view, flags)
    for layer, params in chosen.where().items():
        bad = sorted(set(params) & (shared or {}).get(layer, set()))
        if bad:
            raise PlanningError(f"--from-vllm: vLLM would offload {layer}.{bad[0]}, which other params are tied to; "
                                "this planner keeps such params on the GPU (narrow the selection with "
                                "--offload-params)")
    reason, notes = vllm_notes.plan_words(flags, chosen, len(stack))
    strategy = "budget" if chosen.mode == "uva" else "group"
    prefetching = chosen.mode == "prefetch"
    step = flags.prefetch_step if prefetching else None
    assignment = Assignment(chosen.where(), step, strategy, reason, tuple(notes), every_slot=prefetching,
                            fill_once=prefetching)
    plan = assemble(layers, assignment, model_name=model_name, spec_sha256=spec_sha256,
                    gpu_budget=gpu_budget, cpu_budget=cpu_budget, checked=checked, memory=memory)
    if prefetching and plan.buffer_pool is not None:
        once = [layer.name for layer in plan.layers if layer.prefetch is not None and layer.prefetch.once]
        extra = vllm_notes.runtime_note(flags.prefetch_step, plan.buffer_pool.bytes, once)
        plan = plan.model_copy(update={"summary": plan.summary.model_copy(
            update={"notes": [*plan.summary.notes, extra]})})
    return plan


def _refuse_unknown_order(view: Sequence[StackLayer], flags: VllmFlags) -> None:
    """A spec whose params are sorted by name: refused where --cpu-offload-gb's limit cuts inside a layer (vLLM's
    walk follows the module's registration order, which such a spec does not know); a limit between layers
    is the same in any order."""
    split = split_layer(view, select(view, flags), flags)
    if split is None:
        return
    at, taken = split
    before, after = layer_limits(view, flags, at)
    eligible = sum(p.nbytes for p in view[at].params
                   if not flags.cpu_offload_params or matches(p.name, flags.cpu_offload_params))
    raise PlanningError(vllm_notes.order_unknown(flags, view[at].name, taken, eligible,
                                                 None if before is None else gib_text(*before), gib_text(*after)))


def _check_budgets(plan: Plan, gpu: int | None, cpu: int | None) -> None:
    s = plan.summary
    if gpu is not None and s.peak_gpu_bytes > gpu:
        raise InfeasibleError(Infeasible("vllm_flags", gpu, cpu, s.peak_gpu_bytes, strategy="vllm",
                                         needs=(Need("vllm", s.peak_gpu_bytes),), offloaded=s.offloaded_bytes,
                                         buffer=s.buffer_bytes,
                                         non_weight=None if plan.memory is None else plan.memory.non_weight_bytes))
    if cpu is not None and s.pinned_host_bytes > cpu:
        raise InfeasibleError(Infeasible("over_cpu", gpu, cpu, None, strategy="vllm", pinned=s.pinned_host_bytes))
