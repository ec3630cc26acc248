"""What the runtime measured: ``Handle.stats()`` as data, and the format of a STATS.json file.

``runtime.apply(..., stats=True)`` fills one ``MeasuredForward`` per forward (the last
100); ``json.dump(handle.stats(), f)`` writes a file that ``planner explain PLAN
--measured STATS.json`` compares with the plan's prediction. Times come from CUDA events
and are ``null`` where nothing was timed (a run on the CPU, a CUDA graph replay): null
means "not measured", never zero.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from schemas.errors import LocatedValueError
from schemas.fields import Count, MeasuredRate, Milliseconds, StrictModel
from schemas.plan_content import PlanBackend


class MeasuredLayer(StrictModel):
    """One prefetched layer in one forward: its copy on the copy stream and the compute stream's wait."""

    name: str = Field(min_length=1, description="the layer's name in the plan")
    bytes: Count = Field(default=0, description="bytes copied host -> GPU for this layer")
    copy_ms: Milliseconds | None = Field(default=None, description="copy stream time of its copy")
    stall_ms: Milliseconds | None = Field(
        default=None, description="compute stream time spent waiting for its copy before it ran")


class MeasuredForward(StrictModel):
    bytes_copied: Count
    copy_ms: Milliseconds | None = Field(default=None, description="sum of the timed copies")
    stall_ms: Milliseconds | None = Field(default=None, description="sum of the timed waits")
    copy_gbps: MeasuredRate | None = Field(default=None, description="bytes of the timed copies / their time")
    late_copies: Count = 0
    step_ms: Milliseconds | None = Field(
        default=None, description="the forward's wall time, when the caller timed it")
    max_memory_allocated: Count | None = Field(
        default=None, description="torch.cuda.max_memory_allocated() over the forward (the GPU's peak: weights, "
        "buffers, KV cache, activations, workspace); null where not measured")
    layers: list[MeasuredLayer] = Field(default_factory=list, description="prefetched layers, in copy order")

    @field_validator("layers")
    @classmethod
    def _each_once(cls, layers: list[MeasuredLayer]) -> list[MeasuredLayer]:
        seen: dict[str, int] = {}
        for j, layer in enumerate(layers):
            first = seen.setdefault(layer.name, j)
            if first != j:
                raise LocatedValueError(f"layer '{layer.name}' is listed twice in one forward (first at layers"
                                        f"[{first}]); the runtime writes one row a layer", (j, "name"))
        return layers

    @model_validator(mode="after")
    def _bytes_add_up(self) -> MeasuredForward:
        layer_bytes = sum(layer.bytes for layer in self.layers)
        if layer_bytes > self.bytes_copied:
            raise LocatedValueError(f"must be at least the layers' bytes added up, {layer_bytes} (got "
                                    f"{self.bytes_copied})", ("bytes_copied",))
        return self


class MeasuredHostLevel(StrictModel):
    """One split layer's guard (runtime/host_guard.py ``HostGuard.summary``): the plan's host experts, the host's
    now, the calls with fewer and with more, the last judged call's parts."""

    planned: Count
    now: Count
    moved_calls: Count = 0
    all_uva_calls: Count = 0
    more_calls: Count = 0
    gpu_ms: Milliseconds = 0.0
    host_ms: Milliseconds = 0.0
    handoff_ms: Milliseconds = 0.0


class MeasuredGraphs(StrictModel):
    """The applied plan's layer graphs (runtime/shape_graphs.py ``GraphPool.counts``)."""

    layers: Count = Field(description="experts calls wrapped")
    graphs: Count = Field(description="graphs held")
    failed: Count = Field(default=0, description="calls whose capture failed (run as launched)")
    bytes: Count = Field(default=0, description="the static inputs and outputs the graphs share")
    pool_bytes: Count = Field(default=0, description="the allocator's segments of the graphs' pool")


class MeasuredStats(StrictModel):
    """``Handle.stats()``: the backend, the recent forwards and the pinned host memory; with host experts their
    guards, with layer graphs what those hold."""

    backend: PlanBackend
    forwards: list[MeasuredForward] = Field(min_length=1)
    pinned_host_bytes: Count = 0
    host_levels: dict[str, MeasuredHostLevel] | None = None
    expert_graphs: MeasuredGraphs | None = None


def load_measured(path: str | Path) -> MeasuredStats:
    """A STATS.json file; InputError naming the file, line and field when it is bad."""
    from schemas.io import load_model

    return load_model(MeasuredStats, path)
