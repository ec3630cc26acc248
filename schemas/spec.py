"""The model/memory spec: what a model's layers hold and how much GPU memory it may use.

A spec file has three top-level sections: ``model`` (required), ``memory`` and
``offload`` (optional). Layers are listed in execution order; a layer whose name
holds ``{i}`` and has ``repeat: N`` expands to N layers (``schemas.spec_layers``: a layer as written
and expanded). ``ModelSection.expanded()`` gives the expanded, fully resolved view that the planner
works on.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from schemas.dtypes import canonical_dtype, itemsize
from schemas.fields import PositiveCount, StrictModel
from schemas.sizes import Size, SizeOrAuto, SizeOrZero
from schemas.spec_layers import (REPEAT_TOKEN, Layer, LayerSpec, ParamKind, ParamOrder, ParamSpec, Tensor,
                                 storage_elements)
from schemas.spec_limits import check_bytes, check_counts
from schemas.spec_names import check_dotted_name, check_printable
from schemas.spec_ties import check_ties, drop_tied_params
from schemas.workload import Workload


class AttentionSpec(StrictModel):
    """The model's attention heads (a config.json's num_attention_heads and num_key_value_heads): tensor
    parallel splits q/k/v and o by whole heads, as engines do (planner/tp/heads.py)."""

    heads: PositiveCount = Field(description="query heads of each attention layer")
    kv_heads: PositiveCount | None = Field(default=None, description="key/value heads (default: heads)")

    @model_validator(mode="after")
    def _grouped(self) -> AttentionSpec:
        if self.kv_heads is not None and (self.kv_heads > self.heads or self.heads % self.kv_heads):
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads}): each KV head serves "
                             "a whole group of query heads")
        return self

    @property
    def kv(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads


class ModelSection(StrictModel):
    name: str = Field(min_length=1)
    dtype: str = Field(description="default dtype of every param")
    layers: list[LayerSpec] = Field(min_length=1, description="in execution order")
    attention: AttentionSpec | None = Field(
        default=None, description="attention heads, for tensor parallel (optional; needed at --tp N > 1 when "
                                  "a split depends on them)")
    param_order: ParamOrder | None = Field(
        default=None, description="the order each layer lists its params in: registration (as the module "
        "registers them and named_parameters() lists them: what describe() and --from-hf-config write; the "
        "default) or name (sorted by name: what --from-safetensors writes, as a checkpoint does not keep the "
        "module's order). vLLM's --cpu-offload-gb walks params in registration order")

    _expanded: tuple[Layer, ...] = PrivateAttr(default=())

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_printable(value, "model name")

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        return canonical_dtype(value)

    @model_validator(mode="after")
    def _expand_and_check(self) -> ModelSection:
        check_counts(self.layers)  # before expanding: a huge repeat is refused at once
        self._expanded = _expand(self)
        return self

    def expanded(self) -> tuple[Layer, ...]:
        return self._expanded


class MemorySection(StrictModel):
    """The budgets, and what the plan counts besides the weights (docs/DESIGN.md, "The whole GPU"): the KV
    cache, the activations, a workspace allowance and the experts' decode graphs, each computed from the spec and
    the workload unless given here."""

    gpu_budget: Size | None = Field(default=None, description="the GPU bytes the plan may use: weights, offload "
                                    "buffers, KV cache, activations, workspace and graphs")
    cpu_budget: Size | None = Field(default=None, description="cap on pinned host bytes")
    kv_cache: SizeOrAuto | None = Field(
        default=None, description="GPU bytes reserved for the KV cache (at least what the workload's contexts "
        "need), or auto: whatever the plan leaves of gpu_budget (default: what the workload's contexts need)")
    kv_cache_dtype: str | None = Field(default=None, description="dtype of the cached keys and values "
                                       "(default: the model's dtype)")
    kv_bytes_per_token: Size | None = Field(
        default=None, description="bytes one token of context takes in the KV cache, all layers together "
        "(default: from the attention params' shapes)")
    activations: SizeOrZero | None = Field(
        default=None, description="the activations' peak of any forward (default: from the spec's shapes and "
        "the workload, as transformers' eager modules allocate them)")
    workspace: SizeOrZero | None = Field(
        default=None, description="library workspaces (cuBLAS) (default: the hardware profile's "
        "workspace_bytes, which planner calibrate measures)")
    graphs: SizeOrZero | None = Field(
        default=None, description="the CUDA graphs of routed experts' decode calls (default: at most what they "
        "hold, from the spec's shapes: planner/memory/graphs.py; 0: none, and runtime.apply then runs without "
        "them)")

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv_dtype(cls, value: str | None) -> str | None:
        return None if value is None else canonical_dtype(value)


Backend = Literal["auto", "prefetch", "uva", "none"]
KindBackend = Literal["prefetch", "uva", "cpu"]  # how an offloaded param of a kind comes back (offload.backends);
# cpu: the host CPU computes it (routed experts only: schemas/plan_experts.py)
Strategy = Literal["auto", "budget", "group"]


class OffloadSection(StrictModel):
    backend: Backend = "auto"
    strategy: Strategy = Field(
        default="auto", description="auto (default), budget or group")
    group_size: PositiveCount | None = Field(
        default=None, description="strategy group: offload the last num_in_group of every group_size layers"
    )
    num_in_group: PositiveCount | None = None
    prefetch_step: PositiveCount | None = Field(
        default=None, description="prefetch: number of buffer slots, as vLLM's --offload-prefetch-step; default 2"
    )
    params: list[str] | None = Field(
        default=None, description="dot-separated name segments eligible for offload (default: all)"
    )
    kinds: list[ParamKind] | None = Field(
        default=None,
        description="param kinds eligible for offload (default: all); routed_experts excludes shared "
        "experts, routers and scales. With params too, a param must match both (intersection)",
    )
    prefer: list[ParamKind] | None = Field(
        default=None,
        description="strategies auto and budget: offload params of these kinds in this order, the first kind "
        "across the model before any of the next; eligible params of unlisted kinds come last",
    )

    backends: dict[ParamKind, KindBackend] | None = Field(
        default=None,
        description="per kind, the backend of its offloaded params (prefetch or uva; routed_experts also cpu: the "
        "host CPU computes them); other kinds use backend (with backend auto: auto's choice). A plan with more "
        "than one is 'mixed'",
    )

    @field_validator("params")
    @classmethod
    def _segments(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("params is empty: list at least one name segment, or leave it out")
            for item in value:
                check_dotted_name(item, "param segment")
        return value

    @field_validator("kinds", "prefer")
    @classmethod
    def _kind_list(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("the list is empty: name at least one kind, or leave it out")
            twice = sorted({k for k in value if value.count(k) > 1})
            if twice:
                raise ValueError(f"{', '.join(twice)} listed more than once")
        return value

    @model_validator(mode="after")
    def _prefer(self) -> OffloadSection:
        if self.prefer is not None:
            if self.strategy == "group":
                raise ValueError("prefer orders what strategies auto and budget offload first; strategy "
                                 "'group' does not use it (drop prefer, or use strategy auto or budget)")
            self._within_kinds("prefer", self.prefer, "")
        return self

    def _within_kinds(self, field: str, listed, why: str) -> None:
        """Every kind ``field`` lists is one that ``kinds`` (when given) makes eligible."""
        left_out = [k for k in listed if self.kinds is not None and k not in self.kinds]
        if left_out:
            raise ValueError(f"{field} names {', '.join(left_out)}, which kinds leaves out{why} "
                             f"(add it to kinds or drop it from {field})")

    @field_validator("backends")
    @classmethod
    def _backends_given(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and not value:
            raise ValueError("backends is empty: map at least one kind to prefetch or uva, or leave it out")
        return value

    @model_validator(mode="after")
    def _backends(self) -> OffloadSection:
        if self.backends is not None:
            if self.backend == "none":
                raise ValueError("backends sets how offloaded params come back, but backend 'none' offloads "
                                 "nothing (drop backends or choose another backend)")
            self._within_kinds("backends", self.backends, ", so nothing of it is offloaded")
            on_host = sorted(k for k, b in self.backends.items() if b == "cpu" and k != "routed_experts")
            if on_host:
                raise ValueError(f"backends: {', '.join(on_host)} cpu: the cpu backend computes routed experts only "
                                 "(routed_experts=cpu); give these kinds prefetch or uva")
        return self

    @model_validator(mode="after")
    def _group(self) -> OffloadSection:
        if self.strategy == "group" and self.group_size is None:
            raise ValueError("strategy 'group' needs group_size")
        if self.group_size is not None and (self.num_in_group or 1) > self.group_size:
            raise ValueError(
                f"num_in_group ({self.num_in_group}) is larger than group_size ({self.group_size})"
            )
        return self


class ParallelSection(StrictModel):
    tp: PositiveCount = Field(
        default=1, description="tensor-parallel ranks: above 1, `planner plan` writes one plan per rank into a "
        "folder (--tp overrides; docs/DESIGN.md, \"Tensor parallel\")")


class SpecFile(StrictModel):
    """A whole spec file."""

    FILE_KIND: ClassVar[str] = "spec"

    model: ModelSection
    memory: MemorySection = Field(default_factory=MemorySection)
    offload: OffloadSection = Field(default_factory=OffloadSection)
    workload: Workload | None = Field(
        default=None, description="what a forward processes, for predicted step times (default: decode, 1 token)")
    hardware: str | None = Field(
        default=None, min_length=1, description="hardware profile for predictions: a bundled name (h200) or a file")
    parallel: ParallelSection | None = Field(default=None, description="how the model is split across GPUs")


# ---------------------------------------------------------------------------
# The expanded view: concrete layers and tensors, sizes computed.


def _tensor(name: str, spec: ParamSpec, default_dtype: str) -> Tensor:
    dtype = spec.dtype or default_dtype
    shape = tuple(spec.shape)
    stride = None if spec.stride is None else tuple(spec.stride)
    nbytes = storage_elements(shape, stride) * itemsize(dtype)
    return Tensor(name, shape, dtype, stride, spec.buffer, nbytes, spec.kind)


def _entries(model: ModelSection) -> list[tuple[Tensor, ...]]:
    """Each entry's tensors. Tensors are frozen, so entries listing the same params (the same
    names and ParamSpec objects, which validation shares for the same content) share one tuple."""
    tensors: dict[tuple[str, int], Tensor] = {}
    entries: dict[tuple[Any, ...], tuple[Tensor, ...]] = {}
    out = []
    for spec in model.layers:
        key = (*spec.params, *map(id, spec.params.values()))
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = tuple(
                tensors.get((k, id(v))) or tensors.setdefault((k, id(v)), _tensor(k, v, model.dtype))
                for k, v in spec.params.items())
        out.append(entry)
    return out


def _expand(model: ModelSection) -> tuple[Layer, ...]:
    entries = _entries(model)
    check_bytes(model.layers, entries)
    layers: list[Layer] = []
    where: dict[str, int] = {}
    for pos, (spec, params) in enumerate(zip(model.layers, entries)):
        indices = range(spec.start, spec.start + spec.repeat) if spec.repeat else [None]
        names = [spec.name.replace(REPEAT_TOKEN, str(i)) if spec.repeat else spec.name for i in indices]
        for i, name in zip(indices, names):
            if name in where:
                raise ValueError(
                    f"duplicate layer name '{name}' (layers[{where[name]}] and layers[{pos}])"
                )
            where[name] = pos
            tied = ({k: v.replace(REPEAT_TOKEN, str(i)) if i is not None else v for k, v in spec.tied.items()}
                    if spec.tied else {})
            layers.append(Layer(name, len(layers), params, tied, spec.moe))
    layers = drop_tied_params(layers)  # a name listed as a param and tied too: the tie wins
    check_ties(layers)
    return tuple(layers)
