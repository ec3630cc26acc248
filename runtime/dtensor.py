"""Params of a model sharded with ``torch.distributed.tensor`` (DTensor): the local shard and its layout.

A DTensor param is an ``nn.Parameter`` whose values on this rank live in a plain tensor, its local
shard (``_local_tensor``). Every op on the param runs on that tensor, so the runtime swaps the local
shard's ``.data``, never the param's: assigning ``param.data`` on a DTensor param is accepted and does
nothing to the shard the ops read (torch 2.11 to 2.13), which would leave the model computing with its
old weights. The local tensor object itself stays, so ``remove()`` hands the very same objects back.

Layouts this runtime understands: a DTensor on a one-dimensional mesh, placed ``Shard(d)`` or
``Replicate()``. A plain tensor in a sharded model (a norm that ``parallelize_module`` left alone)
is whole on every rank: replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from schemas.shard import split_dim


def _dtensor_type() -> type | None:
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # builds without distributed tensors
        return None
    return DTensor


_DTENSOR = _dtensor_type()


def is_dtensor(t: object) -> bool:
    return _DTENSOR is not None and isinstance(t, _DTENSOR)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s values on this rank: a DTensor's local shard, else ``t`` itself."""
    return t._local_tensor if is_dtensor(t) else t


def activation(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor to order the offload ops against (a DTensor activation's local part)."""
    return t.to_local() if is_dtensor(t) else t


@dataclass(frozen=True)
class Layout:
    """How a param is spread over the ranks: the dim it is split on (None: whole on every rank),
    the number of ranks of its mesh (None for a plain tensor), and why it cannot be used, if so."""

    split: int | None
    ranks: int | None
    device_type: str | None = None
    unsupported: str | None = None


def layout(t: torch.Tensor) -> Layout:
    if not is_dtensor(t):
        return Layout(None, None)
    mesh, placements = t.device_mesh, t.placements
    if mesh.ndim != 1:
        return Layout(None, None, mesh.device_type,
                      f"a DTensor on a {mesh.ndim}-dimensional mesh {tuple(mesh.shape)} (only 1-D meshes are supported)")
    (p,) = placements
    if p.is_replicate():
        return Layout(None, mesh.size(), mesh.device_type)
    if p.is_shard():
        return Layout(p.dim % t.ndim, mesh.size(), mesh.device_type)
    return Layout(None, mesh.size(), mesh.device_type, f"a DTensor placed {p} (only Shard and Replicate are supported)")


def shard_name(t: torch.Tensor, module: nn.Module, vocab_sizes: set[int]) -> str:
    """The plan's ``shard`` of param ``t`` of ``module`` (schemas/shard.py), from its DTensor placement.

    Split on dim 0: ``vocab`` for an embedding, or a Linear whose outputs are a vocabulary
    (``vocab_sizes``: the model's embedding sizes), ``experts`` for stacked experts (3 or more dims),
    ``dim0`` otherwise. ValueError for a layout no plan can express."""
    lay = layout(t)
    if lay.unsupported:
        raise ValueError(lay.unsupported)
    if lay.split is None:
        return "replicated"
    if lay.split == 1:
        return "dim1"
    if lay.split != 0:
        raise ValueError(f"a DTensor split on dim {lay.split} (plans split dim 0 or 1)")
    if isinstance(module, nn.Embedding) or (isinstance(module, nn.Linear) and module.out_features in vocab_sizes):
        return "vocab"
    return "experts" if t.ndim >= 3 else "dim0"


def shard_problem(full: str, t: torch.Tensor, shard: str | None, world_size: int | None,
                  plan: str = "the plan") -> str | None:
    """Why the param ``t`` of the model is not laid out as ``plan`` (its name, for the message) says:
    ``shard`` and ``world_size`` of a rank plan, both None for a plain plan; None when it is."""
    lay = layout(t)
    if lay.unsupported:
        return f"'{full}' is {lay.unsupported}"
    if world_size is None:
        return None  # a plain plan: the shapes decide (check_model)
    want = split_dim(shard or "replicated")
    if lay.ranks is not None and lay.ranks != world_size:
        return (f"'{full}' is a DTensor over {lay.ranks} ranks but {plan} is for {world_size} ranks; "
                f"apply the plans made for {lay.ranks} ranks")
    if lay.split != want:
        have = "whole on every rank" if lay.split is None else f"split on dim {lay.split}"
        return (f"'{full}' is {have} in the model but {plan} says shard '{shard or 'replicated'}' "
                f"({'whole on every rank' if want is None else f'split on dim {want}'})")
    return None


def param_value(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """What ``state_dict()`` holds for ``param`` whose local values are ``local`` (a host copy):
    a DTensor with the param's layout around it, or ``local`` itself for a plain param."""
    if not is_dtensor(param):
        return local
    return _DTENSOR(local, param._spec, requires_grad=False)
