"""The static GPU buffer pool of the prefetch offloader.

Allocated once at apply time from the plan's ``buffer_pool``: per unique key
(param name relative to its layer, shape, dtype, stride) one buffer per slot id the
key uses. Every offloaded layer's params point at the buffers of its slot, so the
pool's addresses never change: the property CUDA graphs and torch.compile need.
"""

from __future__ import annotations

import torch

from runtime.tensors import DTYPES
from schemas import BufferPool as PoolSpec
from schemas import PlanParam

Key = tuple[str, tuple[int, ...], str, tuple[int, ...] | None]


def key_of(rel: str, p: PlanParam) -> Key:
    return (rel, tuple(p.shape), p.dtype, None if p.stride is None else tuple(p.stride))


class BufferPool:
    def __init__(self, spec: PoolSpec, device: torch.device) -> None:
        self.spec = spec
        self.buffers: dict[Key, dict[int, torch.Tensor]] = {}
        self.nbytes = 0
        for k in spec.keys:
            key: Key = (k.param, tuple(k.shape), k.dtype, None if k.stride is None else tuple(k.stride))
            dtype = DTYPES[k.dtype]
            stride = tuple(k.stride) if k.stride is not None else None
            slots = {}
            for slot in k.slots:
                if stride is None:
                    buf = torch.empty(tuple(k.shape), dtype=dtype, device=device)
                else:
                    buf = torch.empty_strided(tuple(k.shape), stride, dtype=dtype, device=device)
                slots[slot] = buf
                self.nbytes += k.bytes
            self.buffers[key] = slots

    def buffer(self, rel: str, p: PlanParam, slot: int) -> torch.Tensor:
        return self.buffers[key_of(rel, p)][slot]

    def close(self) -> None:
        self.buffers.clear()
