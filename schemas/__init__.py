"""File formats of the offload planner: the model/memory spec and the plan (pure data)."""

from schemas.errors import InputError
from schemas.io import dump_model, load_plan, load_spec
from schemas.plan import BufferKey, BufferPool, Plan, PlanLayer, PlanParam, Prefetch, Summary
from schemas.sizes import format_bytes, parse_size
from schemas.spec import Layer, LayerSpec, MemorySection, ModelSection, OffloadSection, ParamSpec, SpecFile, Tensor

__all__ = [
    "BufferKey", "BufferPool", "InputError", "Layer", "LayerSpec", "MemorySection", "ModelSection",
    "OffloadSection", "ParamSpec", "Plan", "PlanLayer", "PlanParam", "Prefetch", "SpecFile",
    "Summary", "Tensor", "dump_model", "format_bytes", "load_plan", "load_spec", "parse_size",
]
