"""What a choice of offloaded layers costs: resident, pinned and buffer bytes, peak, step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.buffer_pool import PoolEntry, Signature, build_pool, pool_bytes
from schemas.schedule import num_slots
from planner.layers import longest_run


@dataclass(frozen=True)
class Candidate:
    """A block-stack layer that has params eligible for offload."""

    position: int  # in execution order
    params: tuple[str, ...]  # eligible param names, in spec order
    nbytes: int  # bytes of those params
    signature: Signature  # of the params it prefetches (all of them unless some are on UVA)
    uva: tuple[str, ...] = ()  # backend mixed: the params read through UVA (the others are prefetched)

    @property
    def prefetches(self) -> bool:
        return len(self.uva) < len(self.params)


@dataclass(frozen=True)
class Cost:
    backend: str  # prefetch | uva | mixed (per candidate: its uva params, the others prefetched)
    chosen: tuple[int, ...]  # indices into the candidate list
    resident_bytes: int
    offloaded_bytes: int
    buffer_bytes: int
    longest_run: int  # of the prefetched layers (of all offloaded layers for uva), for the notes
    step: int | None  # prefetch step used, the number of buffer slots (None for uva)
    pool: tuple[PoolEntry, ...]
    picked: tuple[Candidate, ...] = ()  # the chosen candidates: the offloaded layers and their params

    @property
    def peak_gpu_bytes(self) -> int:
        return self.resident_bytes + self.buffer_bytes


def evaluate(
    candidates: Sequence[Candidate],
    chosen: Sequence[int],
    *,
    total_bytes: int,
    num_layers: int,
    backend: str,
    step: int,
) -> Cost:
    """Cost of offloading ``chosen`` candidates (sorted) with ``backend`` and, for prefetch, ``step`` slots.

    Backend mixed: the pool and the schedule cover the candidates that prefetch a param."""
    picked = [candidates[i] for i in chosen]
    offloaded = sum(c.nbytes for c in picked)
    copied = picked if backend == "prefetch" else [c for c in picked if c.prefetches] if backend == "mixed" else []
    run = longest_run([c.position for c in (picked if backend == "uva" else copied)], num_layers)
    if not copied:
        return Cost(backend, tuple(chosen), total_bytes - offloaded, offloaded, 0, run, None, (), tuple(picked))
    pool = build_pool([c.signature for c in copied], num_slots(len(copied), step))
    return Cost(backend, tuple(chosen), total_bytes - offloaded, offloaded, pool_bytes(pool), run, step, tuple(pool),
                tuple(picked))
