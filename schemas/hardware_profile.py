"""A hardware profile: what the cost model needs to know about a GPU and its host link.

Figures are rates and fixed costs measured on one machine (``planner calibrate`` measures
them on the local GPU). Profiles are named and loaded by ``schemas.hardware``.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, StrictBool, field_validator

from schemas.fields import (Microseconds, Milliseconds, Passes, PositiveCount, PositiveMicroseconds, Rate,
                            StrictModel, Tflops)
from schemas.spec_names import PrintableName, PrintableText


class UvaPoint(StrictModel):
    """How many times a matmul at ``tokens`` rows reads a weight that lives in pinned host memory."""

    tokens: PositiveCount
    passes: Passes = Field(description="bytes read over the link / the weight's bytes")


class HardwareProfile(StrictModel):
    FILE_KIND: ClassVar[str] = "hardware profile"

    name: PrintableName
    source: PrintableText = Field(description="where the figures come from: machine, software, command, date")
    h2d_gbps: Rate = Field(description="pinned host -> GPU copy rate, GB/s (10^9 bytes)")
    uva_gbps: Rate = Field(description="rate at which a GPU kernel reads pinned host memory in place")
    uva_passes: list[UvaPoint] = Field(
        min_length=1, description="matmul re-reads of a UVA weight by token count; linear between points")
    gpu_mem_gbps: Rate = Field(description="GPU memory read rate of a large kernel, GB/s")
    matmul_tflops: Tflops = Field(description="dense matmul rate in the model's dtype (bf16), TFLOP/s")
    launch_us: PositiveMicroseconds = Field(description="CPU time to issue one small eager kernel, microseconds")
    block_cpu_us: PositiveMicroseconds = Field(
        description="CPU time to run one eager decoder block (module calls and ~30 kernels), microseconds")
    moe_block_cpu_us: PositiveMicroseconds = Field(
        description="CPU time to run one eager MoE decoder block (router, experts), microseconds")
    expert_cpu_us: Microseconds = Field(
        description="extra CPU time per routed expert a batch touches (MoE blocks that loop over "
        "experts; 0 for grouped kernels), microseconds")
    copy_call_us: Microseconds = Field(description="fixed cost of one host->GPU copy call, microseconds")
    uva_expert_call_ms: Milliseconds = Field(
        default=0.0, description="fixed GPU time of one routed-expert matmul (a grouped kernel over all "
        "experts) whose weights are read through UVA, beyond its bytes, milliseconds")
    moe_sync: StrictBool = Field(default=False, description="MoE blocks read the routing back to the CPU before "
                           "looping over the experts (a per-expert loop); false for grouped MoE kernels")

    @field_validator("uva_passes")
    @classmethod
    def _sorted(cls, points: list[UvaPoint]) -> list[UvaPoint]:
        tokens = [p.tokens for p in points]
        if tokens != sorted(set(tokens)):
            raise ValueError("must be listed by increasing tokens, each once")
        return points

    def passes(self, tokens: float) -> float:
        """Re-reads of a UVA weight by a matmul over ``tokens`` rows: piecewise linear in tokens
        (a matmul re-reads its weight once per tile of rows), extended past the last point."""
        pts = self.uva_passes
        if tokens <= pts[0].tokens or len(pts) == 1:
            return pts[0].passes if tokens <= pts[0].tokens else pts[-1].passes
        for a, b in zip(pts, pts[1:]):
            if tokens <= b.tokens:
                return a.passes + (tokens - a.tokens) * (b.passes - a.passes) / (b.tokens - a.tokens)
        a, b = pts[-2], pts[-1]
        return b.passes + (tokens - b.tokens) * (b.passes - a.passes) / (b.tokens - a.tokens)
