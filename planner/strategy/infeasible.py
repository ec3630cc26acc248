"""Why no plan fits, as a record: what does not fit and the smallest GPU budget that would.

Every strategy (and ``plan --from-vllm``) that finds no plan within the budgets says so with one
``Infeasible``; ``planner.errors.InfeasibleError`` carries it, ``planner.words.infeasible`` words it, and
the CLI renders it (its hint reruns with ``smallest``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Cause = Literal[
    "no_plan",  # every plan of the strategy peaks above the GPU budget (``needs`` says how far)
    "backend_none",  # backend none keeps the whole model on the GPU, over the GPU budget
    "nothing_to_offload",  # nothing may be offloaded and the model exceeds the GPU budget
    "over_cpu",  # the chosen plan pins more host memory than the CPU budget
    "vllm_flags",  # vLLM's flags make a plan over the GPU budget
]


@dataclass(frozen=True)
class Need:
    """The lowest peak a backend's plans reach, and how many layers that plan offloads."""

    backend: str  # prefetch | uva (strategies budget and group) | auto
    peak: int
    layers: int = 0


@dataclass(frozen=True)
class Infeasible:
    cause: Cause
    gpu_budget: int | None
    cpu_budget: int | None
    smallest: int | None  # the smallest feasible GPU budget (None: no GPU budget helps)
    strategy: str = "budget"  # budget | group | auto | vllm
    requested: str | None = None  # no_plan: the backend the search was held to, when the words name it
    needs: tuple[Need, ...] = ()  # no_plan: per backend searched, its lowest peak
    movable: bool = True  # no_plan (auto): some layer has params that may move
    total_bytes: int = 0  # backend_none, nothing_to_offload: the whole model
    why_nothing: str = "no_stack"  # nothing_to_offload: no_stack | no_params (the selection matches none) | group
    selection: tuple[tuple[str, ...] | None, tuple[str, ...] | None] = (None, None)  # offload.params, offload.kinds
    pinned: int = 0  # over_cpu: the plan's pinned host bytes
    offloaded: int = 0  # vllm_flags: the plan's offloaded bytes
    buffer: int = 0  # vllm_flags: its buffer pool
    non_weight: int | None = None  # vllm_flags: the plan's KV cache, activations and workspace (None: no memory section)
    tp: tuple[int, int] | None = None  # under tensor parallelism: (world size, bytes of one rank's part)
