"""What a plan file holds, field by field: its layers, buffer pool and summary (``schemas.plan``: the plan, this
content checked against itself by ``schemas.plan_check``).

A plan's backend says how its offloaded params come back to the GPU. ``prefetch``: every offloaded param is
copied into a buffer slot before its layer runs; ``uva``: GPU kernels read every offloaded param in place
(``PlanLayer.uva`` lists them all); ``cpu``: the host CPU computes the routed experts it holds
(``PlanLayer.experts``, schemas/plan_experts.py); ``mixed``: more than one of these, per param (or per expert);
``none``: nothing is offloaded.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, field_validator, model_validator

from schemas.buffer_pool import PoolEntry, PoolKey
from schemas.fields import Count, StrictModel
from schemas.plan_experts import ExpertSplit
from schemas.plan_memory import PlanMemory
from schemas.prediction import Predictions
from schemas.routing import RoutingRef
from schemas.shard import Shard
from schemas.spec_layers import MoeSpec, ParamKind
from schemas.spec_names import DottedName, PrintableName, PrintableText, check_dotted_names
from schemas.throughput import Throughput

PLAN_VERSION = 2  # 2: prefetch_step is the number of buffer slots (in version 1 it was slots - 1)

PlanBackend = Literal["prefetch", "uva", "cpu", "mixed", "none"]
PREFETCHING = ("prefetch", "mixed")  # the backends with prefetched params: a buffer pool and a schedule


class PlanParam(StrictModel):
    shape: list[Count]
    dtype: str
    bytes: Count
    stride: list[Count] | None = None
    buffer: StrictBool = False
    kind: ParamKind | None = Field(
        default=None, description="what the param is; written when the offload selection used kinds"
    )
    shard: Shard | None = Field(
        default=None, description="how tensor parallelism split it (rank plans only); shape is this rank's part"
    )

    def pool_key(self, rel: str) -> PoolKey:
        """The buffer-pool key of this param, named ``rel`` in its layer."""
        return PoolKey.of(rel, self.shape, self.dtype, self.stride)


class Prefetch(StrictModel):
    """Where a prefetched layer's weights land and when their copy is issued."""

    slot: Count | None = Field(
        default=None, description="buffer slot id the layer's offloaded params use (absent when span)")
    span: StrictBool = Field(
        default=False, description="the layer's buffers lie over every slot's bytes (a layer no other is like, "
        "an LM head): its copy waits for the layer before it, and the layers after it wait for it")
    copy_before: str = Field(
        description="the copy is issued on the copy stream just before this layer runs"
    )
    previous_forward: StrictBool = Field(
        default=False,
        description="copy_before runs in the previous forward pass (wrap-around): "
        "the runtime primes these slots at apply time",
    )
    once: StrictBool = Field(
        default=False, description="the layer is its slot's only user (and no layer spans the slots): it is "
        "copied once when the plan is applied and never again, its bytes staying in the slot (what vLLM's "
        "prefetch runtime does for a slot holding one layer; plan --from-vllm)")

    @model_validator(mode="after")
    def _slot_or_span(self) -> Prefetch:
        if self.span == (self.slot is not None):
            raise ValueError("give either slot (a buffer slot id) or span: true (buffers over every slot), "
                             "exactly one of them")
        return self


class PlanLayer(StrictModel):
    name: DottedName
    params: dict[str, PlanParam] = Field(description="every param of the layer, by name relative to it")
    tied: dict[str, str] = Field(default_factory=dict, description="param -> full name of its storage owner")
    offloaded: list[str] = Field(default_factory=list, description="params kept in host memory")
    uva: list[str] = Field(default_factory=list, description="the offloaded params GPU kernels read in place "
                           "through UVA; every other offloaded param is prefetched")
    resident_bytes: Count
    offloaded_bytes: Count
    prefetch: Prefetch | None = None
    moe: MoeSpec | None = Field(default=None, description="routed experts and top-k (from the spec)")
    experts: ExpertSplit | None = Field(default=None, description="per routed expert: on the GPU, read through UVA "
                                        "or computed by the host CPU (schemas/plan_experts.py)")

    @field_validator("params")
    @classmethod
    def _param_names(cls, params: dict[str, PlanParam]) -> dict[str, PlanParam]:
        check_dotted_names(params, "param name")
        return params

    @property
    def prefetched(self) -> list[str]:
        """The offloaded params copied into a buffer slot before the layer runs (not on UVA, not split by expert)."""
        if not self.uva and self.experts is None:
            return list(self.offloaded)
        on_uva = set(self.uva) | set(self.experts.params if self.experts is not None else ())
        return [rel for rel in self.offloaded if rel not in on_uva]


class BufferKey(StrictModel):
    """One kind of buffer in the pool: params with this relative name, shape and dtype share it."""

    param: str
    shape: list[Count]
    dtype: str
    stride: list[Count] | None = None
    bytes: Count = Field(description="bytes of one buffer")
    slots: list[Count] = Field(description="slot ids this key has a buffer for")
    span: StrictBool = Field(default=False,
                             description="it also has a buffer for spanning layers, over the slots' bytes")

    @property
    def key(self) -> PoolKey:
        return PoolKey.of(self.param, self.shape, self.dtype, self.stride)

    def entry(self) -> PoolEntry:
        """This key as ``schemas.buffer_pool`` reckons it (the inverse of ``from_entry``)."""
        return PoolEntry(self.key, self.bytes, tuple(self.slots), self.span)

    @classmethod
    def from_entry(cls, e: PoolEntry) -> BufferKey:
        k = e.key
        return cls(param=k.param, shape=list(k.shape), dtype=k.dtype,
                   stride=None if k.stride is None else list(k.stride), bytes=e.nbytes, slots=list(e.slots),
                   span=e.span)


class BufferPool(StrictModel):
    slots: Count = Field(description="number of slot ids")
    every_slot: StrictBool = Field(
        default=False, description="every key has a buffer in each of the prefetch_step slots, whether a layer "
        "holding it uses that slot or not (vLLM's StaticBufferPool; plan --from-vllm); else only in the slots "
        "its layers use")
    keys: list[BufferKey]
    bytes: Count = Field(description="GPU bytes of all buffers (of the arena, when a layer spans the slots)")


class Summary(StrictModel):
    model: PrintableName
    backend: PlanBackend
    backend_reason: PrintableText
    strategy: Literal["auto", "budget", "group"]
    prefetch_step: Count | None = None
    gpu_budget_bytes: Count | None = None
    cpu_budget_bytes: Count | None = None
    total_bytes: Count
    resident_bytes: Count
    offloaded_bytes: Count
    buffer_bytes: Count
    peak_gpu_bytes: Count = Field(description="resident params + buffer pool + the memory section's KV cache, "
                                  "activations and workspace (plans without it: params and buffers alone)")
    pinned_host_bytes: Count
    layers: Count
    offloaded_layers: Count
    spec_sha256: str
    rank: Count | None = Field(default=None, description="tensor-parallel rank this plan is for")
    world_size: Count | None = Field(default=None, description="tensor-parallel ranks (with rank)")
    notes: list[PrintableText] = Field(default_factory=list)
    routing: RoutingRef | None = Field(default=None, description="the measured routing the plan was made with "
                                       "(planner plan --routing): which experts stay on the GPU, the predictions' rates")


class PlanContent(StrictModel):
    """What a plan file holds, field by field: a ``Plan`` is this content checked against itself."""

    plan_version: Literal[2] = PLAN_VERSION
    summary: Summary
    memory: PlanMemory | None = Field(
        default=None, description="what the plan counts on the GPU besides weights and buffers (absent in older "
        "plans)")
    throughput: Throughput | None = Field(
        default=None, description="the batch chosen for the most tokens per second (a workload's batch: auto)")
    predictions: Predictions | None = Field(
        default=None, description="predicted step time per workload (informative, not checked on load)")
    layers: list[PlanLayer]
    buffer_pool: BufferPool | None = None

    def layer(self, name: str) -> PlanLayer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)
