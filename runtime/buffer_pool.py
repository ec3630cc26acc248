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
from schemas.buffer_pool import PoolKey


class BufferPool:
    def __init__(self, spec: PoolSpec, device: torch.device) -> None:
        self.spec = spec
        self.buffers: dict[PoolKey, dict[int, torch.Tensor]] = {}
        self.nbytes = 0
        for k in spec.keys:
            key = k.key
            dtype = DTYPES[key.dtype]
            slots = {}
            for slot in k.slots:
                if key.stride is None:
                    buf = torch.empty(key.shape, dtype=dtype, device=device)
                else:
                    buf = torch.empty_strided(key.shape, key.stride, dtype=dtype, device=device)
                slots[slot] = buf
                self.nbytes += k.bytes
            self.buffers[key] = slots

    def buffer(self, rel: str, p: PlanParam, slot: int) -> torch.Tensor:
        return self.buffers[p.pool_key(rel)][slot]

    def close(self) -> None:
        self.buffers.clear()
