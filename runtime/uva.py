"""UVA offloader: offloaded params stay in pinned host memory and GPU kernels read them in place.

A CUDA tensor can point straight at page-locked host memory: with unified virtual
addressing the host address is valid on the device. We build such a tensor without a
compiled extension by handing ``torch.as_tensor`` an object that exposes the
``__cuda_array_interface__`` of the host bytes. There is nothing to schedule: no
hooks, no copies, no buffers. Each use reads the weight over PCIe, so UVA suits
small batches; the prefetch offloader is better when weights are reused.
"""

from __future__ import annotations

import logging
import warnings

import torch

from runtime.offloader import Offloader
from runtime.tensors import TensorRef, storage_nbytes

log = logging.getLogger("runtime")


class _HostBytes:
    """Exposes host bytes as a CUDA array; keeps the host tensor alive while viewed."""

    def __init__(self, host: torch.Tensor, nbytes: int) -> None:
        self._host = host
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (host.data_ptr(), False),
            "version": 3,
            "strides": None,
        }


def device_view(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor on ``device`` that reads ``host`` (pinned) in place: same shape, stride, dtype."""
    if not host.is_pinned():
        raise ValueError("a UVA view needs pinned host memory")
    nbytes = storage_nbytes(host)
    with torch.cuda.device(device):
        raw = torch.as_tensor(_HostBytes(host, max(nbytes, 1)), device=device)
    return raw[:nbytes].view(host.dtype).as_strided(host.shape, host.stride())


def uva_supported(device: torch.device) -> bool:
    """Whether kernels on ``device`` can read pinned host memory in place (on the CPU: trivially)."""
    if device.type == "cpu":
        return True
    try:
        probe = torch.arange(64, dtype=torch.int32).pin_memory()
        view = device_view(probe, device)
        return bool(torch.equal(view.cpu(), probe))
    except Exception as exc:  # noqa: BLE001 - any failure means "not supported here"
        log.debug("UVA probe failed: %s", exc)
        return False


def read_in_place(offloader: Offloader, pairs: list[tuple[TensorRef, torch.Tensor]]) -> None:
    """Point each param of ``pairs`` at a device view of its pinned host copy (on the CPU: the host
    copy itself). Where the device cannot read host memory, fall back to copying each layer's
    params in before it runs (eager only, with a warning)."""
    device = offloader.device
    if not pairs:
        return
    if not uva_supported(device):
        warnings.warn(
            "UVA (GPU reads of pinned host memory) is not available on this device; "
            "offloaded params are copied to the GPU before each layer instead (slower)",
            RuntimeWarning,
            stacklevel=4,
        )
        _install_copy_fallback(offloader, pairs)
        return
    for ref, host in pairs:
        ref.local.data = host if device.type == "cpu" else device_view(host, device)


def _install_copy_fallback(offloader: Offloader, pairs: list[tuple[TensorRef, torch.Tensor]]) -> None:
    """Copy a layer's offloaded params in before it runs and drop them after (eager only)."""
    device = offloader.device
    placeholder = {}
    for ref, host in pairs:
        placeholder[ref.full] = torch.empty(0, dtype=host.dtype, device=device)
        ref.local.data = placeholder[ref.full]
    by_layer: dict[str, list] = {}
    for ref, host in pairs:
        by_layer.setdefault(ref.layer, []).append((ref, host))

    for layer, layer_pairs in by_layer.items():
        module = offloader.model.get_submodule(layer)

        def pre(_m, _args, layer_pairs=layer_pairs):
            for ref, host in layer_pairs:
                ref.local.data = host.to(device, non_blocking=True)

        def post(_m, _args, _out, layer_pairs=layer_pairs):
            for ref, _host in layer_pairs:
                ref.local.data = placeholder[ref.full]

        offloader.hooks.append(module.register_forward_pre_hook(pre))
        offloader.hooks.append(module.register_forward_hook(post))


class UvaOffloader(Offloader):
    """Points each offloaded param at a device view of its pinned host copy."""

    name = "uva"

    def post_init(self) -> None:
        read_in_place(self, self.offloaded_pairs())
