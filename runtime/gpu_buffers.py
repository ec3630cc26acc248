"""The static GPU buffer pool of the prefetch offloader: its buffers on the GPU (the rule that sizes it:
schemas/buffer_pool.py).

Allocated once at apply time from the plan's ``buffer_pool``: per unique key
(param name relative to its layer, shape, dtype, stride) one buffer per slot id the
key uses. Every offloaded layer's params point at the buffers of its slot, so the
pool's addresses never change: the property CUDA graphs and torch.compile need.

When a layer spans the slots the pool is one byte arena laid out by
``schemas.buffer_pool.arena_layout`` (the planner sized it with the same function); the
spanning layer's buffers are views over the slots' bytes, and the plan's schedule orders
its copy after every earlier user of those bytes and theirs after it.
"""

from __future__ import annotations

import torch

from runtime.tensors import DTYPES
from schemas import BufferPool as PoolSpec
from schemas import PlanParam
from schemas.buffer_pool import PoolKey, arena_layout

SPAN = None  # the slot argument of a spanning layer's buffers


class BufferPool:
    def __init__(self, spec: PoolSpec, device: torch.device) -> None:
        self.spec = spec
        self.buffers: dict[PoolKey, dict[int | None, torch.Tensor]] = {}
        self.arena: torch.Tensor | None = None
        if any(k.span for k in spec.keys):
            self._carve(spec, device)
            return
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

    def _carve(self, spec: PoolSpec, device: torch.device) -> None:
        layout = arena_layout([k.entry() for k in spec.keys])
        self.arena = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
        self.nbytes = layout.nbytes
        for k in spec.keys:
            key = k.key
            dtype = DTYPES[key.dtype]
            slots = {}
            for slot in [*k.slots, *([SPAN] if k.span else [])]:
                offset = layout.offsets[(key, slot)]
                raw = self.arena[offset:offset + k.bytes].view(dtype)  # offsets are aligned: any dtype views
                slots[slot] = raw.view(key.shape) if key.stride is None else raw.as_strided(key.shape, key.stride)
            self.buffers[key] = slots

    def buffer(self, rel: str, p: PlanParam, slot: int | None) -> torch.Tensor:
        """The buffer of param ``p`` (named ``rel`` in its layer) in ``slot`` (SPAN: a spanning layer's)."""
        return self.buffers[p.pool_key(rel)][slot]

    def close(self) -> None:
        self.buffers.clear()
        self.arena = None
