"""The plan file: which params stay on the GPU, which live in host memory, and how they come back.

A plan is the planner's output and the runtime's input. It is deterministic and
meant to be read and diffed in review: every layer in execution order with all of
its params (so the runtime can check the model against it), which of them are
offloaded, and, for the prefetch backend, the buffer slot each offloaded layer
uses and the point at which its copy starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, model_validator

from schemas.prediction import Predictions
from schemas.spec import MoeSpec, ParamKind
from schemas.strict import StrictModel

PLAN_VERSION = 1

PlanBackend = Literal["prefetch", "uva", "none"]


class PlanParam(StrictModel):
    shape: list[NonNegativeInt]
    dtype: str
    bytes: NonNegativeInt
    stride: list[NonNegativeInt] | None = None
    buffer: bool = False
    kind: ParamKind | None = Field(
        default=None, description="what the param is; written when the offload selection used kinds"
    )


class Prefetch(StrictModel):
    """Where a prefetched layer's weights land and when their copy is issued."""

    slot: NonNegativeInt = Field(description="buffer slot id the layer's offloaded params use")
    copy_before: str = Field(
        description="the copy is issued on the copy stream just before this layer runs"
    )
    previous_forward: bool = Field(
        default=False,
        description="copy_before runs in the previous forward pass (wrap-around): "
        "the runtime primes these slots at apply time",
    )


class PlanLayer(StrictModel):
    name: str
    params: dict[str, PlanParam] = Field(description="every param of the layer, by name relative to it")
    tied: dict[str, str] = Field(default_factory=dict, description="param -> full name of its storage owner")
    offloaded: list[str] = Field(default_factory=list, description="params kept in host memory")
    resident_bytes: NonNegativeInt
    offloaded_bytes: NonNegativeInt
    prefetch: Prefetch | None = None
    moe: MoeSpec | None = Field(default=None, description="routed experts and top-k (from the spec)")

    @model_validator(mode="after")
    def _offloaded_known(self) -> PlanLayer:
        unknown = [p for p in self.offloaded if p not in self.params]
        if unknown:
            raise ValueError(f"layer '{self.name}' offloads unknown params: {', '.join(unknown)}")
        if self.prefetch is not None and not self.offloaded:
            raise ValueError(f"layer '{self.name}' has a prefetch entry but offloads nothing")
        return self


class BufferKey(StrictModel):
    """One kind of buffer in the pool: params with this relative name, shape and dtype share it."""

    param: str
    shape: list[NonNegativeInt]
    dtype: str
    stride: list[NonNegativeInt] | None = None
    bytes: NonNegativeInt = Field(description="bytes of one buffer")
    slots: list[NonNegativeInt] = Field(description="slot ids this key has a buffer for")


class BufferPool(StrictModel):
    slots: NonNegativeInt = Field(description="number of slot ids")
    keys: list[BufferKey]
    bytes: NonNegativeInt = Field(description="GPU bytes of all buffers")


class Summary(StrictModel):
    model: str
    backend: PlanBackend
    backend_reason: str
    strategy: Literal["budget", "group"]
    prefetch_step: NonNegativeInt | None = None
    gpu_budget_bytes: NonNegativeInt | None = None
    cpu_budget_bytes: NonNegativeInt | None = None
    total_bytes: NonNegativeInt
    resident_bytes: NonNegativeInt
    offloaded_bytes: NonNegativeInt
    buffer_bytes: NonNegativeInt
    peak_gpu_bytes: NonNegativeInt = Field(description="resident params + buffer pool")
    pinned_host_bytes: NonNegativeInt
    layers: NonNegativeInt
    offloaded_layers: NonNegativeInt
    spec_sha256: str
    notes: list[str] = Field(default_factory=list)


class Plan(StrictModel):
    plan_version: Literal[1] = PLAN_VERSION
    summary: Summary
    predictions: Predictions | None = Field(
        default=None, description="predicted step time per workload (informative, not checked on load)")
    layers: list[PlanLayer]
    buffer_pool: BufferPool | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        names = [layer.name for layer in self.layers]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate layer names: {', '.join(dup)}")
        known = set(names)
        prefetch = self.summary.backend == "prefetch"
        for layer in self.layers:
            if layer.prefetch is not None:
                if not prefetch:
                    raise ValueError(f"layer '{layer.name}' has a prefetch entry but the backend is "
                                     f"'{self.summary.backend}'")
                if layer.prefetch.copy_before not in known:
                    raise ValueError(f"layer '{layer.name}': copy_before names unknown layer "
                                     f"'{layer.prefetch.copy_before}'")
                if self.buffer_pool is None or layer.prefetch.slot >= self.buffer_pool.slots:
                    raise ValueError(f"layer '{layer.name}': slot {layer.prefetch.slot} is not in the buffer pool")
            elif prefetch and layer.offloaded:
                raise ValueError(f"layer '{layer.name}' is offloaded under prefetch but has no prefetch entry")
        offloaded = sum(layer.offloaded_bytes for layer in self.layers)
        if offloaded != self.summary.offloaded_bytes:
            raise ValueError(
                f"summary.offloaded_bytes is {self.summary.offloaded_bytes} but the layers offload {offloaded}"
            )
        return self

    def layer(self, name: str) -> PlanLayer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)
