"""Everything a caller could observe of a module, captured and compared exactly.

Used to show that a refused or failed call, or apply followed by remove(), leaves a model
exactly as it was: every tensor's value, dtype, device, shape, stride and Parameter
object; storage addresses where the tensor cannot have moved; each module's class,
instance attributes and hook tables.
"""

from __future__ import annotations

import torch
from torch import nn

_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                "_load_state_dict_post_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs")


def tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every param and buffer object (shared ones under each name)."""
    out = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        for store in (module._parameters, module._buffers):
            for attr, t in store.items():
                if t is not None:
                    out[f"{mname}.{attr}" if mname else attr] = t
    return out


def layout(model: nn.Module) -> dict[str, tuple]:
    """Per module: its class, the names in its __dict__, the size of each hook table."""
    return {name: (type(m), sorted(m.__dict__), tuple(len(getattr(m, h, {})) for h in _HOOK_TABLES))
            for name, m in model.named_modules(remove_duplicate=False)}


def snapshot(model: nn.Module) -> dict:
    return {
        "tensors": {k: (t, t.detach().clone(), t.device, t.dtype, t.shape, t.stride(), t.data_ptr(),
                        t.requires_grad) for k, t in tensors(model).items()},
        "layout": layout(model),
    }


def differences(model: nn.Module, snap: dict, *, same_storage: bool = True) -> list[str]:
    """What differs from ``snap`` (empty when nothing). ``same_storage``: also compare each
    tensor's data_ptr (false after an offload round trip, which gives offloaded params new storage)."""
    problems = []
    now = tensors(model)
    if now.keys() != snap["tensors"].keys():
        problems.append(f"tensor names changed: {sorted(now.keys() ^ snap['tensors'].keys())}")
    for k, (obj, value, device, dtype, shape, stride, ptr, grad) in snap["tensors"].items():
        t = now.get(k)
        if t is None:
            continue
        if t is not obj:
            problems.append(f"{k}: not the same Parameter/buffer object")
        if (t.device, t.dtype, t.shape, t.stride(), t.requires_grad) != (device, dtype, shape, stride, grad):
            problems.append(f"{k}: {t.device} {t.dtype} {tuple(t.shape)} {t.stride()} "
                            f"instead of {device} {dtype} {tuple(shape)} {stride}")
        elif t.device.type != "meta" and not torch.equal(t.detach(), value):
            problems.append(f"{k}: values changed")
        if same_storage and t.data_ptr() != ptr:
            problems.append(f"{k}: storage changed")
    if layout(model) != snap["layout"]:
        before, after = snap["layout"], layout(model)
        changed = [n for n in before if after.get(n) != before[n]]
        problems.append(f"modules changed (class, attributes or hooks): {changed[:5]}")
    return problems


def assert_same(model: nn.Module, snap: dict, *, same_storage: bool = True) -> None:
    problems = differences(model, snap, same_storage=same_storage)
    assert not problems, "\n".join(problems)
