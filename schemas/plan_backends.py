"""A plan's backends: how its offloaded params come back to the GPU.

``prefetch``: every offloaded param is copied into a buffer slot before its layer runs;
``uva``: GPU kernels read every offloaded param in place (``PlanLayer.uva`` lists them all);
``cpu``: the host CPU computes the routed experts it holds (``PlanLayer.experts``, schemas/plan_experts.py);
``mixed``: more than one of these, per param (or per expert); ``none``: nothing is offloaded.
"""

from __future__ import annotations

from typing import Literal

PlanBackend = Literal["prefetch", "uva", "cpu", "mixed", "none"]
PREFETCHING = ("prefetch", "mixed")  # the backends with prefetched params: a buffer pool and a schedule
