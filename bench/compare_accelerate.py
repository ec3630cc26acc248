"""Accelerate as a contender for bench_compare.py, used the way its big-model-inference guide says.

- ``dispatch``: the model loaded on the CPU, ``infer_auto_device_map(model, max_memory={gpu: budget,
  "cpu": ...}, no_split_module_classes=model._no_split_modules)`` then ``dispatch_model(model,
  device_map)``: the modules mapped to "cpu" stay in host memory and ``AlignDevicesHook`` copies their
  weights to the GPU before each of their forwards (and drops them after). Accelerate keeps room for
  the largest offloaded layer inside ``max_memory``.
- ``cpu_offload``: ``accelerate.cpu_offload(model, execution_device)``: every module's weights in
  host memory, copied in before its forward.
"""

from __future__ import annotations

import torch
from torch import nn

from compare_measure import host_snapshot


def _owner(name: str, device_map: dict[str, object]) -> object:
    """The device_map entry that holds the param ``name`` (its longest module prefix)."""
    parts = name.split(".")
    for i in range(len(parts), -1, -1):
        key = ".".join(parts[:i])
        if key in device_map:
            return device_map[key]
    return None


def dispatch(model: nn.Module, budget: int, device: torch.device) -> dict:
    """Dispatch ``model`` (moved to the CPU first) with a device map for a GPU budget of ``budget`` bytes."""
    from accelerate import dispatch_model, infer_auto_device_map

    model.to("cpu")
    cpu_room = int(host_snapshot().get("MemAvailable", 64 << 30) * 0.9)
    max_memory: dict[object, int] = {"cpu": cpu_room}
    if device.type == "cuda":
        max_memory = {device.index or 0: budget, **max_memory}
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)
    moved = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if _owner(n, device_map) == "cpu")
    dispatch_model(model, device_map=device_map)
    return {"moved_bytes": moved, "cpu_modules": sum(1 for d in device_map.values() if d == "cpu"),
            "device_map_entries": len(device_map)}


def cpu_offload(model: nn.Module, device: torch.device) -> dict:
    """``accelerate.cpu_offload`` on ``model`` (moved to the CPU first), executing on ``device``."""
    from accelerate import cpu_offload as offload

    moved = sum(p.numel() * p.element_size() for p in model.parameters())
    model.to("cpu")
    offload(model, execution_device=device)
    return {"moved_bytes": moved}
