"""Finding a plan's params in a module tree, and swapping the data behind them.

A param is swapped by assigning ``tensor.data``: the ``nn.Parameter`` object (and any
reference an optimizer or a tied module holds) stays the same, only its storage moves.
For a DTensor param the tensor swapped is its local shard (``TensorRef.local``, runtime/dtensor.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from runtime.dtensor import local_tensor
from schemas import Plan
from schemas.dtypes import DTYPE_BYTES
from schemas.spec_layers import storage_elements

# the torch dtype of every dtype name a plan may hold (schemas.dtypes), where this torch has it
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_BYTES if hasattr(torch, name)}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(eq=False)
class TensorRef:
    """One param or buffer the plan names: where it lives and what the plan says it is."""

    layer: str
    rel: str  # name relative to the layer
    module: nn.Module  # the module that owns the attribute
    attr: str  # attribute name on that module
    is_buffer: bool

    @property
    def full(self) -> str:
        return f"{self.layer}.{self.rel}"

    def get(self) -> torch.Tensor:
        store = self.module._buffers if self.is_buffer else self.module._parameters
        return store[self.attr]

    @cached_property
    def local(self) -> torch.Tensor:
        """The tensor whose ``.data`` holds this rank's values (resolved once): the param or buffer
        itself, or a DTensor param's local shard."""
        return local_tensor(self.get())


def resolve(model: nn.Module, layer: str, rel: str) -> TensorRef | None:
    """Find ``layer.rel`` as a param or buffer; None when absent."""
    path = f"{layer}.{rel}" if layer else rel
    mod_path, _, attr = path.rpartition(".")
    try:
        module = model.get_submodule(mod_path) if mod_path else model
    except AttributeError:
        return None
    if attr in module._parameters and module._parameters[attr] is not None:
        return TensorRef(layer, rel, module, attr, is_buffer=False)
    if attr in module._buffers and module._buffers[attr] is not None:
        return TensorRef(layer, rel, module, attr, is_buffer=True)
    return None


def plan_refs(plan: Plan, model: nn.Module) -> dict[str, TensorRef]:
    """All params and tied params of the plan, by full name (missing ones are skipped)."""
    refs: dict[str, TensorRef] = {}
    for layer in plan.layers:
        for rel in list(layer.params) + list(layer.tied):
            ref = resolve(model, layer.name, rel)
            if ref is not None:
                refs[ref.full] = ref
    return refs


def span_elements(t: torch.Tensor) -> int:
    """Elements the tensor's strided extent covers (numel when contiguous), as the plan counts them."""
    return storage_elements(tuple(t.shape), tuple(t.stride()))


def storage_nbytes(t: torch.Tensor) -> int:
    """Bytes the tensor's elements span (what the plan counts), not its whole storage."""
    return span_elements(t) * t.element_size()


def split_owner(plan: Plan, full: str) -> tuple[str | None, str]:
    """A full param name as (the plan layer holding it, name relative to that layer)."""
    best = None
    for layer in plan.layers:
        if full.startswith(layer.name + ".") and (best is None or len(layer.name) > len(best)):
            best = layer.name
    return best, (full[len(best) + 1:] if best else full)
