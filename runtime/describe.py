"""``describe(model)``: a spec from any ``nn.Module``, meta-device models included.

Layers are found from the module tree in registration order: each element of a
``ModuleList``/``ModuleDict``/``Sequential`` is a layer (the block stack), a module
that holds tensors directly is a layer, and other containers are descended into.
Consecutive blocks with identical tensors fold into one ``{i}`` template. Params that
share storage (or are the same object) are recorded as ``tied`` to their first name.
"""

from __future__ import annotations

import re

from torch import nn

from runtime.tensors import dtype_name
from schemas import SpecFile

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


def _layers(module: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    out: list[tuple[str, nn.Module]] = []
    if prefix and (module._parameters or module._buffers):
        return [(prefix, module)]
    for name, child in module.named_children():
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(child, _CONTAINERS):
            for sub, block in child.named_children():
                if any(True for _ in block.parameters()) or any(True for _ in block.buffers()):
                    out.append((f"{path}.{sub}", block))
        elif any(True for _ in child.parameters()) or any(True for _ in child.buffers()):
            out += _layers(child, path)
    return out


def _storage_key(t) -> tuple:
    if t.device.type == "meta":
        return ("meta", id(t))
    return (t.device.type, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def describe(model: nn.Module, name: str | None = None, dtype: str | None = None) -> SpecFile:
    layers = _layers(model)
    if not layers:
        raise ValueError("the model holds no parameters or buffers")
    owner_of: dict[tuple, str] = {}
    entries: list[dict] = []
    dtypes: dict[str, int] = {}
    for lname, module in layers:
        params: dict[str, dict] = {}
        tied: dict[str, str] = {}
        tensors = [(n, t, False) for n, t in module.named_parameters(remove_duplicate=False)]
        tensors += [(n, t, True) for n, t in module.named_buffers(remove_duplicate=False)]
        for rel, t, is_buffer in tensors:
            full = f"{lname}.{rel}"
            key = _storage_key(t)
            if key in owner_of:
                tied[rel] = owner_of[key]
                continue
            owner_of[key] = full
            d = dtype_name(t.dtype)
            dtypes[d] = dtypes.get(d, 0) + t.numel()
            entry: dict = {"shape": list(t.shape), "dtype": d}
            if t.numel() > 1 and not t.is_contiguous():
                entry["stride"] = list(t.stride())
            if is_buffer:
                entry["buffer"] = True
            params[rel] = entry
        entries.append({"name": lname, "params": params, "tied": tied})
    default = dtype or max(dtypes, key=dtypes.get)
    for e in entries:
        for p in e["params"].values():
            if p["dtype"] == default:
                del p["dtype"]
    spec_layers = _fold(entries)
    model_name = name or type(model).__name__
    return SpecFile.model_validate({"model": {"name": model_name, "dtype": default, "layers": spec_layers}})


_BLOCK = re.compile(r"^(.*)\.(\d+)$")


def _fold(entries: list[dict]) -> list[dict]:
    """Fold runs of ``prefix.0 … prefix.N-1`` with identical params into one ``{i}`` template."""
    out: list[dict] = []
    i = 0
    while i < len(entries):
        m = _BLOCK.match(entries[i]["name"])
        j = i + 1
        if m and int(m.group(2)) == 0 and not entries[i]["tied"]:
            while j < len(entries):
                mj = _BLOCK.match(entries[j]["name"])
                if not (mj and mj.group(1) == m.group(1) and int(mj.group(2)) == j - i
                        and entries[j]["params"] == entries[i]["params"] and not entries[j]["tied"]):
                    break
                j += 1
        if j - i > 1:
            out.append({"name": f"{m.group(1)}.{{i}}", "repeat": j - i, "params": entries[i]["params"]})
        else:
            e = {k: v for k, v in entries[i].items() if v or k == "params"}
            out.append(e)
            j = i + 1
        i = j
    return out
