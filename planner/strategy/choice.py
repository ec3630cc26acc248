"""What the budget and group strategies (and backend none) decided, as a record for the words and the plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# why a plan of strategy budget or group is what it is (planner/words/build_notes.py words each)
WHY = ("backend_none",  # backend none requested: nothing offloaded
       "no_budget",  # strategy budget without a gpu_budget: nothing offloaded
       "fits",  # the whole model fits the gpu_budget: nothing offloaded
       "group_empty",  # the group rule selects no layer with eligible params
       "requested",  # the backend was given
       "prefetch_faster",  # backend auto: prefetch predicts no slower a step than UVA for these params
       "uva_faster",  # backend auto: UVA predicts a faster step than prefetch, which fits too
       "uva_fits")  # backend auto: prefetch of these params does not fit, UVA does


@dataclass(frozen=True)
class Choice:
    strategy: str  # budget | group | none
    backend: str  # the backend of the kinds offload.backends does not list: prefetch | uva | none
    why: str  # one of WHY
    placed: Mapping[int, Mapping[str, str]] = field(default_factory=dict)  # position -> param -> backend
    peak: int = 0
    buffer_bytes: int = 0
    offloaded_bytes: int = 0
    step: int = 2  # buffer slots of the plan's pool
    alternative: int | None = None  # backend auto: the other backend's peak with the same params
    count: int = 0  # budget: ladder steps taken (planner/strategy/budget.py)
    fewer_peak: int | None = None  # budget: the peak one ladder step fewer would have
    chosen: tuple[int, ...] = ()  # group: positions of the layers offloaded
    step_ms: float | None = None  # its predicted weighted step
    other_ms: float | None = None  # backend auto: the other backend's, with the same params
    passed: int = 0  # budget: ladder steps that fit with fewer params but that one offloading more beats

    @property
    def offloads(self) -> bool:
        return bool(self.placed)

