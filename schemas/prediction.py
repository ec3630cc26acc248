"""What a plan is predicted to cost: step time per workload, on a named hardware profile.

Predictions are informative (the plan's memory fields are the contract): they are
recomputed from the plan, the profile and the workload by ``planner.predict`` and are not
checked when a plan is loaded, since the profile they came from is not part of the plan.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.ints import Count, PositiveCount

from schemas.reals import Milliseconds, Share
from schemas.strict import StrictModel

Bound = Literal["copy", "compute", "cpu"]


class Prediction(StrictModel):
    workload: str
    tokens: PositiveCount
    weight: Share = 1.0
    step_ms: Milliseconds = Field(description="predicted time of one forward")
    compute_ms: Milliseconds = Field(description="GPU busy time on the compute stream (UVA reads included)")
    copy_ms: Milliseconds = Field(description="copy stream busy time (prefetch)")
    stall_ms: Milliseconds = Field(description="compute stream waiting for prefetch copies")
    cpu_ms: Milliseconds = Field(description="CPU time to issue the forward's work (eager)")
    bound: Bound = Field(description="what sets the step time")


class Predictions(StrictModel):
    hardware: str = Field(description="the hardware profile's name")
    hardware_source: str = ""
    workloads: list[Prediction]
    weighted_step_ms: Milliseconds = Field(description="step time averaged with the workload weights")
    offloaded_layers: Count = 0
