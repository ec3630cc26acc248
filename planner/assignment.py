"""The planner's decision, as one record: which params leave the GPU and how each comes back.

A strategy (budget, group, or any other) decides; ``planner.assemble.assemble`` turns the
spec's layers and this record into the plan file. Nothing else passes from deciding to
assembling, so a new strategy only has to produce an ``Assignment``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

ParamBackend = Literal["prefetch", "uva"]
PARAM_BACKENDS: tuple[ParamBackend, ...] = ("prefetch", "uva")


@dataclass(frozen=True)
class Assignment:
    """``where``: layer name -> param (relative to its layer) -> its backend; a param (or layer)
    absent is resident. Any layer may appear, in or out of the block stack; a tied param or a
    param other params are tied to may not (``assemble`` refuses them)."""

    where: Mapping[str, Mapping[str, ParamBackend]]
    prefetch_step: int | None  # buffer slots; None: the default (schemas.schedule.DEFAULT_PREFETCH_STEP)
    strategy: str  # what decided (the plan's summary.strategy)
    reason: str  # why this backend (summary.backend_reason)
    notes: tuple[str, ...] = ()  # the decision in sentences (summary.notes, before the schedule's)
    span: frozenset[str] = frozenset()  # prefetched layers whose buffers lie over the slots' (schemas/schedule.py)

    @property
    def backend(self) -> str:
        """The plan's backend: none, prefetch, uva, or mixed when both occur."""
        used = {b for params in self.where.values() for b in params.values()}
        if not used:
            return "none"
        return used.pop() if len(used) == 1 else "mixed"


def uniform(layers: Iterable[tuple[str, Iterable[str]]], backend: ParamBackend) -> dict[str, dict[str, ParamBackend]]:
    """``where`` for (layer, params) pairs all on one backend."""
    return {layer: dict.fromkeys(params, backend) for layer, params in layers}
