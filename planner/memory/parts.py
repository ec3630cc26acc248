"""The plan's memory section, and the budget the strategies get for weights and buffers.

``plan_memory`` computes, from the spec, the workload and the merged memory settings, what every forward
needs (its KV cache, its activations' peak) and the parts the plan counts: the KV cache (the largest
forward's, a reservation, or, with ``kv_cache: auto``, what the plan leaves: ``fill_kv``), the largest
activations' peak, the workspace allowance (the hardware profile's, or the spec's) and the routed experts'
decode graphs (``planner.memory.graphs``). ``build.py`` takes them off the gpu_budget before any strategy runs
(``weights_budget``): one point, whatever the strategy.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.errors import InfeasibleError, PlanningError
from planner.memory.activations import Forward, activation_peak
from planner.memory.graphs import graph_bytes
from planner.memory.kv import KvSize, kv_size
from planner.memory.shapes import LayerShape, layer_shapes
from planner.words import memory_notes as words
from schemas.dtypes import itemsize
from schemas.hardware import HardwareProfile
from schemas.fields import MAX_INT64
from schemas.plan import Plan
from schemas.plan_memory import ForwardMemory, PlanMemory
from schemas.spec import MemorySection, ModelSection
from schemas.spec_layers import Layer
from schemas.workload import Workload, batch_of

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def activation_dtype(model: ModelSection) -> str:
    """The dtype activations are computed in: the model's, unless its weights are quantized (bfloat16)."""
    return model.dtype if model.dtype in FLOAT_DTYPES else "bfloat16"


class MemoryModel:
    """A spec's shapes read once, and what its forwards need (``forward``)."""

    def __init__(self, model: ModelSection, layers: Sequence[Layer], memory: MemorySection):
        attention = model.attention
        self.shapes: list[LayerShape] = layer_shapes(layers, attention.heads if attention else None,
                                                     attention.kv if attention else None)
        self.memory = memory
        self.act_dtype = activation_dtype(model)
        self.kv_dtype = memory.kv_cache_dtype or self.act_dtype
        self.kv: KvSize = kv_size(self.shapes, itemsize(self.kv_dtype), memory.kv_bytes_per_token)
        self.graphs = memory.graphs if memory.graphs is not None else graph_bytes(self.shapes, itemsize(self.act_dtype))

    def forward(self, name: str, forward: Forward) -> ForwardMemory:
        per_token = self.kv.per_token
        if forward.context and per_token is None:
            raise PlanningError(words.kv_unknown(name, forward.context, self.kv.problem or ""))
        kv = forward.batch * forward.context * (per_token or 0)
        if self.memory.activations is not None:
            act, where = self.memory.activations, "memory.activations"
        else:
            peak = activation_peak(self.shapes, forward, itemsize(self.act_dtype), self.kv)
            act, where = peak.bytes, peak.where
        for what, n in (("KV cache", kv), ("activations", act)):
            if n > MAX_INT64:
                raise InfeasibleError(words.beyond_any_gpu(name, what, n), None)
        return ForwardMemory(workload=name, tokens=forward.tokens, batch=forward.batch, context=forward.context,
                             logits=forward.logits, kv_cache_bytes=kv, activation_bytes=act, largest=where)

    def plan_memory(self, workload: Workload, profile: HardwareProfile) -> PlanMemory:
        """The memory section of a plan for ``workload`` (every batch chosen) on ``profile``."""
        forwards = [self.forward(name, forward_of(name, item)) for name, item in workload.items()]
        need = max(f.kv_cache_bytes for f in forwards)
        given = self.memory.kv_cache
        sizing = "auto" if given == "auto" else "reserved" if isinstance(given, int) else "workload"
        if isinstance(given, int) and given < need:
            largest = max(forwards, key=lambda f: f.kv_cache_bytes)
            raise PlanningError(words.reservation_too_small(given, largest))
        kv = given if isinstance(given, int) else need
        workspace = self.memory.workspace if self.memory.workspace is not None else profile.workspace
        return PlanMemory(kv_cache_bytes=kv, activation_bytes=max(f.activation_bytes for f in forwards),
                          workspace_bytes=workspace, graph_bytes=self.graphs, kv_cache=sizing,
                          kv_cache_dtype=self.kv_dtype,
                          kv_bytes_per_token=self.kv.per_token,
                          activations="spec" if self.memory.activations is not None else "model", forwards=forwards)


def forward_of(name: str, item) -> Forward:
    """A workload item as the memory model reads it (its batch chosen)."""
    return Forward(item.rows, batch_of(name, item), item.context or 0, item.logits or "all")


def weights_budget(gpu_budget: int | None, mem: PlanMemory) -> int | None:
    """What the strategies may spend on resident weights and buffers: the gpu_budget less the other parts."""
    return None if gpu_budget is None else gpu_budget - mem.non_weight_bytes


def infeasible(err: InfeasibleError, gpu_budget: int, mem: PlanMemory) -> InfeasibleError:
    """A strategy's InfeasibleError (about the weights' share) as the whole GPU's: the part that does not fit,
    and the smallest gpu_budget with every part counted."""
    need = None if err.min_gpu_budget is None else err.min_gpu_budget + mem.non_weight_bytes
    return InfeasibleError(words.infeasible(gpu_budget, mem, need, err.message), need)


def fill_kv(plan: Plan) -> Plan:
    """With ``kv_cache: auto``: the KV cache grows into what the plan leaves of its gpu_budget (peak = budget)."""
    mem, s = plan.memory, plan.summary
    if mem is None or mem.kv_cache != "auto" or s.gpu_budget_bytes is None:
        return plan
    left = s.gpu_budget_bytes - s.peak_gpu_bytes
    if left <= 0:
        return plan
    memory = mem.model_copy(update={"kv_cache_bytes": mem.kv_cache_bytes + left})
    summary = s.model_copy(update={"peak_gpu_bytes": s.peak_gpu_bytes + left,
                                   "notes": [*s.notes, *words.room_notes(memory)]})
    return plan.model_copy(update={"memory": memory, "summary": summary})
