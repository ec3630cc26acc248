"""Ties by storage: the one definition of "these tensors share memory", and moving them together.

Two tensors are tied when they are views of one storage (``storage_key``): the same object under
two names, a weight and its transpose, a slice of a bigger param. ``describe`` lists each group
once, at an owner whose bytes cover every other member's (``covering``), and records the others
as ``tied`` to it; the plan counts the group's bytes once, at the owner; ``apply`` checks the
model's groups against the plan's ties, never offloads a member of a group, and moves a group as
one: the bytes all its views cover are copied once and every member becomes the same view of the
new storage (``rehome``), so after ``remove()`` the members share one storage again, bit-identical.
On the meta device (no storage) and for empty tensors only identity counts.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.dtensor import local_tensor
from runtime.tensors import span_elements


def storage_key(t: torch.Tensor) -> tuple:
    """Equal for tensors that are views of one storage (for a DTensor: its local shard's)."""
    t = local_tensor(t)
    if t.device.type == "meta" or t.numel() == 0 or t.untyped_storage().nbytes() == 0:
        return ("object", id(t))
    return (str(t.device), t.untyped_storage().data_ptr())


def extent(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[start, end)`` of its storage that the tensor's elements span."""
    start = t.storage_offset() * t.element_size()
    return start, start + (span_elements(t) * t.element_size() if t.numel() else 0)


def covering(tensors: list[torch.Tensor]) -> int | None:
    """Index of the first tensor whose extent covers every other's (all views of one storage), else None."""
    spans = [extent(t) for t in tensors]
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    return next((i for i, (a, b) in enumerate(spans) if a == lo and b == hi), None)


def within(t: torch.Tensor, owner: torch.Tensor) -> bool:
    """``t`` shares ``owner``'s storage and lies inside the bytes ``owner`` spans."""
    if storage_key(t) != storage_key(owner):
        return False
    (a, b), (lo, hi) = extent(t), extent(owner)
    return lo <= a and b <= hi


def rehome(tensors: list[torch.Tensor], device: torch.device) -> None:
    """Copy the bytes these views of one storage span into new memory on ``device`` and point each
    at the same view of it (``.data``: the tensor objects stay). Aliasing in, aliasing out."""
    spans = [extent(t) for t in tensors]
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    src = torch.empty(0, dtype=torch.uint8, device=tensors[0].device).set_(
        tensors[0].untyped_storage(), lo, (hi - lo,), (1,))
    raw = torch.empty(hi - lo, dtype=torch.uint8, device=device)
    raw.copy_(src)
    storage = raw.untyped_storage()
    for t, (a, _) in zip(tensors, spans):
        t.data = torch.empty(0, dtype=t.dtype, device=device).set_(
            storage, (a - lo) // t.element_size(), t.shape, t.stride())


def shared_storages(model: nn.Module) -> dict[tuple, list[tuple[str, torch.Tensor]]]:
    """storage key -> (name, tensor) of every distinct param or buffer object viewing it, for the
    storages that more than one object of ``model`` views."""
    groups: dict[tuple, list[tuple[str, torch.Tensor]]] = {}
    for mname, module in model.named_modules():
        for store in (module._parameters, module._buffers):
            for attr, t in store.items():
                if t is not None:
                    members = groups.setdefault(storage_key(t), [])
                    if all(t is not o for _, o in members):
                        members.append((f"{mname}.{attr}" if mname else attr, t))
    return {k: v for k, v in groups.items() if len(v) > 1}
