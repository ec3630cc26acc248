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
from schemas.dtypes import DTYPE_BYTES
from schemas.spec_layers import storage_elements

# the torch dtype of every dtype name a plan may hold (schemas.dtypes), where this torch has it
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_BYTES if hasattr(torch, name)}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(eq=False)
class TensorRef:
    """One param or buffer of the model, found once (``resolve``) and used by everything after: the module and
    attribute it lives at, the tensor object, and its name in the plan (``layer`` and ``rel``)."""

    layer: str
    rel: str  # name relative to the layer
    module: nn.Module  # the module that owns the attribute
    attr: str  # attribute name on that module
    is_buffer: bool
    tensor: torch.Tensor  # the nn.Parameter or buffer object (apply swaps its .data, never the object)

    @property
    def full(self) -> str:
        return f"{self.layer}.{self.rel}"

    @cached_property
    def local(self) -> torch.Tensor:
        """The tensor whose ``.data`` holds this rank's values: the param or buffer itself, or a DTensor
        param's local shard."""
        return local_tensor(self.tensor)


def resolve(model: nn.Module, layer: str, rel: str) -> TensorRef | None:
    """Find ``layer.rel`` as a param or buffer; None when absent."""
    path = f"{layer}.{rel}" if layer else rel
    mod_path, _, attr = path.rpartition(".")
    try:
        module = model.get_submodule(mod_path) if mod_path else model
    except AttributeError:
        return None
    return _attribute(module, layer, rel, attr)


def resolve_in(module: nn.Module, layer: str, rel: str) -> TensorRef | None:
    """``resolve`` for a param ``rel`` of ``module``, the submodule named ``layer`` (found once per layer)."""
    mod_path, _, attr = rel.rpartition(".")
    if mod_path:
        try:
            module = module.get_submodule(mod_path)
        except AttributeError:
            return None
    return _attribute(module, layer, rel, attr)


def _attribute(module: nn.Module, layer: str, rel: str, attr: str) -> TensorRef | None:
    t = module._parameters.get(attr)
    if t is not None:
        return TensorRef(layer, rel, module, attr, False, t)
    t = module._buffers.get(attr)
    if t is not None:
        return TensorRef(layer, rel, module, attr, True, t)
    return None


def span_elements(t: torch.Tensor) -> int:
    """Elements the tensor's strided extent covers (numel when contiguous), as the plan counts them."""
    return storage_elements(tuple(t.shape), tuple(t.stride()))


def storage_nbytes(t: torch.Tensor) -> int:
    """Bytes the tensor's elements span (what the plan counts), not its whole storage."""
    return span_elements(t) * t.element_size()
