"""What a plan is predicted to cost: step time per workload, on a named hardware profile.

Predictions are informative (the plan's memory fields are the contract): they are computed
from the plan, the profile and the workload by ``planner.cost.predict``. The plan carries the profile
they were made with (``profile``), so predicting again uses the same figures; a plan is not
re-predicted when it is loaded (a simulated forward per workload is too slow for that), but the
plan check refuses predictions that contradict themselves or the plan (``schemas.plan_check``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.fields import Count, Milliseconds, PositiveCount, Share, StrictModel
from schemas.hardware_profile import HardwareProfile
from schemas.spec_names import PrintableName, PrintableText
from schemas.workload import MAX_TOKENS, Mode

Bound = Literal["copy", "compute", "cpu"]


class Prediction(StrictModel):
    workload: PrintableName
    tokens: PositiveCount = Field(le=MAX_TOKENS, description="rows a forward pushes through each weight")
    weight: Share = 1.0
    mode: Mode = Field(default="eager", description="eager, or graph (CUDA graph replay: no CPU issue time)")
    step_ms: Milliseconds = Field(description="predicted time of one forward")
    compute_ms: Milliseconds = Field(description="GPU busy time on the compute stream (UVA reads included)")
    copy_ms: Milliseconds = Field(description="copy stream busy time (prefetch)")
    stall_ms: Milliseconds = Field(description="compute stream waiting for prefetch copies")
    cpu_ms: Milliseconds = Field(description="CPU time to issue the forward's work (eager)")
    bound: Bound = Field(description="what sets the step time")


class Predictions(StrictModel):
    hardware: PrintableName = Field(description="the hardware profile's name")
    hardware_source: PrintableText = ""
    workloads: list[Prediction]
    weighted_step_ms: Milliseconds = Field(description="step time averaged with the workload weights")
    offloaded_layers: Count = 0
    profile: HardwareProfile | None = Field(
        default=None, description="the profile the predictions were made with, whole: predicting the plan again "
        "(another workload, explain) uses it, never a profile found by its name (absent in older plans)")
