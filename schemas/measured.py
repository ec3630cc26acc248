"""What the runtime measured: ``Handle.stats()`` as data, and the format of a STATS.json file.

``runtime.apply(..., stats=True)`` fills one ``MeasuredForward`` per forward (the last
100); ``json.dump(handle.stats(), f)`` writes a file that ``planner explain PLAN
--measured STATS.json`` compares with the plan's prediction. Times come from CUDA events
and are ``null`` where nothing was timed (a run on the CPU, a CUDA graph replay): null
means "not measured", never zero.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt

from schemas.strict import StrictModel


class MeasuredLayer(StrictModel):
    """One prefetched layer in one forward: its copy on the copy stream and the compute stream's wait."""

    name: str = Field(min_length=1, description="the layer's name in the plan")
    bytes: NonNegativeInt = Field(default=0, description="bytes copied host -> GPU for this layer")
    copy_ms: NonNegativeFloat | None = Field(default=None, description="copy stream time of its copy")
    stall_ms: NonNegativeFloat | None = Field(
        default=None, description="compute stream time spent waiting for its copy before it ran")


class MeasuredForward(StrictModel):
    bytes_copied: NonNegativeInt
    copy_ms: NonNegativeFloat | None = Field(default=None, description="sum of the timed copies")
    stall_ms: NonNegativeFloat | None = Field(default=None, description="sum of the timed waits")
    copy_gbps: NonNegativeFloat | None = None
    late_copies: NonNegativeInt = 0
    step_ms: NonNegativeFloat | None = Field(
        default=None, description="the forward's wall time, when the caller timed it")
    layers: list[MeasuredLayer] = Field(default_factory=list, description="prefetched layers, in copy order")


class MeasuredStats(StrictModel):
    """``Handle.stats()``: the backend, the recent forwards and the pinned host memory."""

    backend: Literal["prefetch", "uva", "mixed", "none"]
    forwards: list[MeasuredForward] = Field(min_length=1)
    pinned_host_bytes: NonNegativeInt = 0


def load_measured(path: str | Path) -> MeasuredStats:
    """A STATS.json file; InputError naming the file, line and field when it is bad."""
    from schemas.io import load_model

    return load_model(MeasuredStats, path)
