"""A naive offloader, as a contender for bench_compare.py (not product code).

What one writes in an afternoon: each offloaded layer's weights live in pinned host memory; a
forward pre-hook copies them to the GPU synchronously (``non_blocking=False``: the host waits, and
the copy waits for the kernels queued before it) and a forward post-hook points the params back
at the host copies, so the GPU copies are freed. No prefetch, no overlap of copy and compute.
"""

from __future__ import annotations

import torch
from torch import nn


class NaiveOffloader:
    """Offload ``layers`` (module name -> names of its params or buffers, relative to it) of ``model``."""

    def __init__(self, model: nn.Module, layers: dict[str, list[str]], device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.hooks = []
        self.moved: list[tuple[torch.Tensor, torch.Tensor]] = []  # (param or buffer, its host copy)
        seen: set[int] = set()
        pin = self.device.type == "cuda"
        for name, tensor_names in layers.items():
            module = model.get_submodule(name)
            pairs = []
            for tname in tensor_names:
                t = _tensor(module, tname)
                if id(t) in seen:  # tied: moved once, by the first layer that names it
                    continue
                seen.add(id(t))
                host = t.detach().to("cpu", copy=True)
                pairs.append((t, host.pin_memory() if pin else host))
            if not pairs:
                continue
            for t, host in pairs:
                t.data = host
            self.moved += pairs
            self.hooks.append(module.register_forward_pre_hook(self._onload(pairs)))
            self.hooks.append(module.register_forward_hook(self._offload(pairs)))

    @property
    def host_bytes(self) -> int:
        return sum(h.numel() * h.element_size() for _, h in self.moved)

    def _onload(self, pairs):
        def hook(_module, _args):
            for t, host in pairs:
                t.data = host.to(self.device, non_blocking=False)
        return hook

    def _offload(self, pairs):
        def hook(_module, _args, _out):
            for t, host in pairs:
                t.data = host
        return hook

    def remove(self) -> None:
        """Remove the hooks and put every moved tensor back on the device."""
        for h in self.hooks:
            h.remove()
        self.hooks = []
        for t, host in self.moved:
            t.data = host.to(self.device)
        self.moved = []


def _tensor(module: nn.Module, name: str) -> torch.Tensor:
    try:
        return module.get_parameter(name)
    except AttributeError:
        return module.get_buffer(name)


def plan_layers(plan) -> dict[str, list[str]]:
    """The layers a plan offloads and their offloaded tensors: the naive offloader moves the same bytes."""
    return {layer.name: list(layer.offloaded) for layer in plan.layers if layer.offloaded}
