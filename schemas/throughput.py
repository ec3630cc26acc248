"""The batch a plan was chosen for, when the workload asked for it (``batch: auto``): the plan's
``throughput`` section.

``planner.memory.throughput`` plans the forward at several batches, each with its KV cache inside the
budget, and keeps the one with the most predicted tokens per second (``batch x 1000 / step_ms``); the
section records it and the batches tried nearest to it, so a reader sees how flat the choice is.
``schemas.memory_check`` re-proves the figures when a plan is loaded.
"""

from __future__ import annotations

from pydantic import Field

from schemas.fields import Milliseconds, PositiveCount, StrictModel, TokensPerSecond
from schemas.spec_names import PrintableName


class BatchOption(StrictModel):
    batch: PositiveCount
    step_ms: Milliseconds = Field(description="predicted decode step at this batch, with its own plan")
    tokens_per_s: TokensPerSecond = Field(description="batch x 1000 / step_ms")


class Throughput(StrictModel):
    workload: PrintableName = Field(description="the forward whose batch was chosen")
    context: PositiveCount = Field(description="tokens each sequence holds in the KV cache")
    batch: PositiveCount = Field(description="the batch chosen: the most predicted tokens per second")
    tokens_per_s: TokensPerSecond
    tried: PositiveCount = Field(description="how many batches were planned")
    options: list[BatchOption] = Field(min_length=1, description="the chosen batch and the batches tried "
                                       "nearest to it, by batch")
