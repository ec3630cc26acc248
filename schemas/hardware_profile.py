"""A hardware profile: what the cost model needs to know about a GPU and its host link.

Figures are rates and fixed costs measured on one machine (``planner calibrate`` measures
them on the local GPU). Profiles are named and loaded by ``schemas.hardware``.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, StrictBool, field_validator

from schemas.fields import (BytesPerElement, Count, Microseconds, Milliseconds, Passes, PositiveCount,
                            PositiveMicroseconds, Rate, Share, StrictModel, Tflops)
from schemas.spec_names import PrintableName, PrintableText

# what the roofline of a block's matrices misses, as fitted on the H200 (Llama-3-8B shape, prefill of 2,048
# tokens, resident: 62.7 ms measured; docs/BENCHMARKS.md, "Cost model"): the defaults of a profile without them
H200_ATTENTION_TFLOPS = 300.0
H200_ELEMENTWISE_BYTES = 17.0
# the workspace allowance of a profile that does not measure one: cuBLAS keeps 32 MiB on the stream a
# forward runs on (measured on the H200, shared/h200-limits.md)
DEFAULT_WORKSPACE_BYTES = 32 * 2**20


class UvaPoint(StrictModel):
    """How many times a matmul at ``tokens`` rows reads a weight that lives in pinned host memory."""

    tokens: PositiveCount
    passes: Passes = Field(description="bytes read over the link / the weight's bytes")


class RatePoint(StrictModel):
    """A rate at a number of rows: the host's grouped expert kernel, GB/s of expert weights it reads when
    each expert it computes sees ``tokens`` rows."""

    tokens: PositiveCount
    gbps: Rate


# the host CPU of the H200 machine (16 cores, AMX), torch 2.11's grouped_mm in bf16 over Qwen3-MoE experts
# (bench/results/probe-cpu-experts-h200.jsonl): 24.5 GB/s at one row an expert, 32 GB/s from two rows on
H200_HOST_EXPERTS = [RatePoint(tokens=1, gbps=24.5), RatePoint(tokens=2, gbps=32.0)]


class HardwareProfile(StrictModel):
    FILE_KIND: ClassVar[str] = "hardware profile"

    name: PrintableName
    source: PrintableText = Field(description="where the figures come from: machine, software, command, date")
    h2d_gbps: Rate = Field(description="pinned host -> GPU copy rate, GB/s (10^9 bytes)")
    uva_gbps: Rate = Field(description="rate at which a GPU kernel reads pinned host memory in place")
    link_shared_gbps: Rate | None = Field(
        default=None, description="a pinned host -> GPU copy and a UVA read of equal bytes run at once on two "
        "streams: the bytes of both / the time both take, GB/s. The copy engine and UVA reads share one host "
        "link (about the harmonic mean of h2d_gbps and uva_gbps when they take turns); absent: assumed so")
    uva_passes: list[UvaPoint] = Field(
        min_length=1, description="matmul re-reads of a UVA weight by token count; linear between points")
    gpu_mem_gbps: Rate = Field(description="GPU memory read rate of a large kernel, GB/s")
    matmul_tflops: Tflops = Field(description="dense matmul rate in the model's dtype (bf16), TFLOP/s")
    attention_tflops: Tflops = Field(
        default=H200_ATTENTION_TFLOPS, description="rate of attention's own arithmetic (Q·Kᵀ and the weighted "
        "sum of V over the context: scaled dot-product attention as transformers runs it, causal), TFLOP/s")
    elementwise_bytes: BytesPerElement = Field(
        default=H200_ELEMENTWISE_BYTES, description="GPU memory traffic of a decoder block's work between its "
        "matmuls (norms, rotary embedding, activation, residual adds: what the matmul roofline misses), per "
        "token and per output element of the block's matrices, in bytes at gpu_mem_gbps")
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
    uva_call_ms: Milliseconds = Field(
        default=0.0, description="fixed GPU time of one dense matmul whose weight is read through UVA, beyond its "
        "bytes at uva_gbps (the read's ramp and tail: what a matmul of one weight loses against uva_gbps, which a "
        "large read measures), milliseconds")
    host_expert_gbps: list[RatePoint] = Field(
        default_factory=lambda: list(H200_HOST_EXPERTS), min_length=1,
        description="the cpu backend: GB/s of expert weights the host CPU's grouped kernel reads, by the rows each "
        "expert sees; linear between points (default: the H200 machine's host)")
    host_dense_gbps: Rate = Field(default=59.0, description="the cpu backend: GB/s of expert weights the host's dense "
                                  "pass reads (every token through every expert, few tokens; schemas/plan_experts.py)")
    host_tflops: Tflops = Field(default=0.52, description="the cpu backend: the host's bf16 rate on the experts' "
                                "matmuls once compute-bound (many rows an expert), TFLOP/s")
    host_call_us: Microseconds = Field(default=250.0, description="the cpu backend: host time of one layer's call "
                                       "beyond its matmuls (routing read back, sort, copies), microseconds")
    host_link_share: Share = Field(default=0.71, description="the cpu backend: the host kernel's rate while GPU "
                                   "kernels read host memory through UVA, as a share of its rate alone")
    moe_sync: StrictBool = Field(default=False, description="MoE blocks read the routing back to the CPU before "
                           "looping over the experts (a per-expert loop); false for grouped MoE kernels")
    workspace_bytes: Count | None = Field(
        default=None, description="GPU bytes library workspaces take on the stream a forward runs on (cuBLAS, "
        "attention kernels), counted in every plan's peak (absent: 32 MiB)")

    @property
    def workspace(self) -> int:
        """The workspace allowance a plan counts: the measured one, else DEFAULT_WORKSPACE_BYTES."""
        return self.workspace_bytes if self.workspace_bytes is not None else DEFAULT_WORKSPACE_BYTES

    @field_validator("uva_passes", "host_expert_gbps")
    @classmethod
    def _sorted(cls, points: list) -> list:
        tokens = [p.tokens for p in points]
        if tokens != sorted(set(tokens)):
            raise ValueError("must be listed by increasing tokens, each once")
        return points

    def host_gbps(self, rows: float) -> float:
        """The host expert kernel's GB/s when each expert sees ``rows`` rows: linear between the points, flat
        outside them."""
        pts = self.host_expert_gbps
        if rows <= pts[0].tokens:
            return pts[0].gbps
        for a, b in zip(pts, pts[1:]):
            if rows <= b.tokens:
                return a.gbps + (rows - a.tokens) * (b.gbps - a.gbps) / (b.tokens - a.tokens)
        return pts[-1].gbps

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
