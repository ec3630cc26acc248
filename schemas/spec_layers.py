"""A spec's layers: as written (``LayerSpec``, its ``ParamSpec``s and ``MoeSpec``) and as the planner sees
them once expanded (``Layer``, ``Tensor``: concrete names, sizes computed; ``schemas.spec`` expands them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, get_args

from pydantic import Field, StrictBool, field_validator, model_validator

from schemas.dtypes import canonical_dtype
from schemas.fields import Count, PositiveCount, StrictModel
from schemas.shard import Shard
from schemas.spec_cache import Memo, content_key
from schemas.spec_names import check_dotted_name, check_dotted_names, check_printable

REPEAT_TOKEN = "{i}"

# What a param is, for selection by kind (rules in schemas/kinds.py and docs/DESIGN.md, "Kinds").
ParamKind = Literal["attention", "dense_mlp", "shared_experts", "routed_experts", "router", "norm", "scale",
                    "embedding", "other"]
PARAM_KINDS: tuple[str, ...] = get_args(ParamKind)
ParamOrder = Literal["registration", "name"]

_VALID_PARAMS = Memo()  # content_key(input) -> the ParamSpec validated from it


class ParamSpec(StrictModel):
    """One tensor of a layer: a shape list, or ``{shape, dtype, stride, buffer}``."""

    shape: list[Count]
    dtype: str | None = Field(default=None, description="defaults to model.dtype")
    stride: list[Count] | None = Field(
        default=None, description="element strides, for tensors that are not contiguous"
    )
    buffer: StrictBool = Field(default=False, description="a registered buffer rather than a parameter")
    kind: ParamKind | None = Field(
        default=None, description="what the param is, for offload.kinds/prefer (default: from its name)"
    )
    shard: Shard | None = Field(
        default=None, description="how tensor parallelism splits it (schemas/shard.py; default: from its kind)"
    )

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str | None) -> str | None:
        return None if value is None else canonical_dtype(value)

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        """The JSON Schema accepts the shape-list shorthand too, as validation does."""
        ref = handler(core_schema)
        target = handler.resolve_ref_schema(ref)
        mapping = dict(target)
        target.clear()
        target["anyOf"] = [
            {"type": "array", "items": {"type": "integer", "minimum": 0}, "description": "the shape"},
            mapping,
        ]
        return ref

    @model_validator(mode="after")
    def _stride_rank(self) -> ParamSpec:
        if self.stride is not None and len(self.stride) != len(self.shape):
            raise ValueError(
                f"stride has {len(self.stride)} entries but shape has {len(self.shape)}"
            )
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _shape_list(cls, value: Any, handler: Any) -> Any:
        """The shape-list shorthand as ``{shape: [...]}``. Input of content already validated is not
        validated again (schemas/spec_cache.py: it gives the same, frozen ParamSpec). Defined last,
        so it wraps the other validators."""
        key = content_key(value)
        if key is not None:
            known = _VALID_PARAMS.get(key)
            if known is not None:
                return known
        if isinstance(value, (list, tuple)):
            value = {"shape": list(value)}
        out = handler(value)
        if key is not None:
            _VALID_PARAMS.put(key, out)
        return out


class MoeSpec(StrictModel):
    """A mixture-of-experts layer: its routed experts and how many each token uses."""

    experts: PositiveCount = Field(description="routed experts in the layer")
    top_k: PositiveCount = Field(description="experts each token is routed to")

    @model_validator(mode="after")
    def _k_within(self) -> MoeSpec:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) is larger than experts ({self.experts})")
        return self


def moe_shape(moe: MoeSpec | None) -> tuple[int, int] | None:
    """(experts, top_k) of an MoE layer, the cost model's key for its routing; None for a dense layer."""
    return (moe.experts, moe.top_k) if moe is not None else None


class LayerSpec(StrictModel):
    """A module in execution order, or a template of ``repeat`` modules named with ``{i}``."""

    name: str
    repeat: PositiveCount | None = Field(default=None, description="expand {i} in name to start..start+repeat-1")
    start: Count = Field(default=0, description="first value of {i} (with repeat)")
    params: dict[str, ParamSpec] = Field(default_factory=dict)
    tied: dict[str, str] = Field(
        default_factory=dict,
        description="param name -> full name of the param whose storage it shares",
    )
    moe: MoeSpec | None = Field(default=None, description="routed experts and top-k, for the cost model")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        check_printable(value, "layer name")
        return check_dotted_name(value.replace(REPEAT_TOKEN, "0"), "layer name") and value

    @field_validator("params")
    @classmethod
    def _param_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_dotted_names(value, "param name")
        return value

    @field_validator("tied")
    @classmethod
    def _tied_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, target in value.items():
            check_dotted_name(key, "tied param name")
            check_printable(target, f"tied param {key!r}: target")
            check_dotted_name(target.replace(REPEAT_TOKEN, "0"), f"tied param {key!r}: target")
        return value

    @model_validator(mode="after")
    def _repeat_and_token(self) -> LayerSpec:
        has_token = REPEAT_TOKEN in self.name
        if self.repeat is not None and not has_token:
            raise ValueError(f"layer '{self.name}' has repeat but its name has no {REPEAT_TOKEN}")
        if has_token and self.repeat is None:
            raise ValueError(f"layer '{self.name}' has {REPEAT_TOKEN} in its name but no repeat")
        if self.start and self.repeat is None:
            raise ValueError(f"layer '{self.name}' has start but no repeat")
        return self



# ---------------------------------------------------------------------------
# The expanded view: concrete layers and tensors, sizes computed.


@dataclass(frozen=True)
class Tensor:
    name: str  # relative to its layer
    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...] | None
    buffer: bool
    nbytes: int
    kind: str | None = None  # the spec's explicit kind, if any


@dataclass(frozen=True)
class Layer:
    name: str
    index: int
    params: tuple[Tensor, ...]
    tied: dict[str, str] = field(default_factory=dict)  # relative name -> full name of owner
    moe: MoeSpec | None = None

    @cached_property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.params)


def storage_elements(shape: tuple[int, ...], stride: tuple[int, ...] | None) -> int:
    """Elements a tensor's storage must span: numel when contiguous, else the strided extent."""
    if stride is None or any(s == 0 for s in shape):
        return math.prod(shape)
    return 1 + sum((size - 1) * st for size, st in zip(shape, stride))
