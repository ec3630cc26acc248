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
# transformers' repeat_kv at a decode step over a static cache (planner/cost/block.py), bytes read + written a
# second: measured alone on the H200 by bench_memory.py's copy probe (batch 32, 8 KV heads repeated 4 times, head
# dim 128, 4,096 cached tokens: 1.19 ms, 1,123 GB/s; bench/results/memory-h200-2026-12-01b/memory.jsonl), until
# calibrate measures it; first inferred at 1,250 from the Llama-3-8B shape's GPU-bound decode rows
H200_STRIDED_COPY_GBPS = 1123.0
# the workspace allowance of a profile that does not measure one: cuBLAS keeps 32 MiB on the stream a
# forward runs on (measured on the H200, shared/h200-limits.md)
DEFAULT_WORKSPACE_BYTES = 32 * 2**20


class UvaPoint(StrictModel):
    """How many times a matmul at ``tokens`` rows reads a weight that lives in pinned host memory."""

    tokens: PositiveCount
    passes: Passes = Field(description="bytes read over the link / the weight's bytes")


class RatePoint(StrictModel):
    """A rate at a number of rows: GB/s of weights a kernel reads when each of its weights (an expert, a dense
    matrix) sees ``tokens`` rows."""

    tokens: PositiveCount
    gbps: Rate


class HostRatePoint(RatePoint):
    """The host's rate at a number of rows, with what a touched expert costs beyond its bytes there when measured
    at those rows (``planner calibrate`` solves both from two expert sizes at each point; absent: the profile's
    ``host_expert_us``)."""

    expert_us: Microseconds | None = None


class TflopsPoint(StrictModel):
    """A compute rate at a number of rows: grouped expert matmuls whose experts see ``tokens`` rows each."""

    tokens: PositiveCount
    tflops: Tflops


# the host CPU of the H200 machine (16 cores, AVX-512): what planner calibrate measured of runtime/host_matmul.c's
# kernel on the backend's host thread in the start of bench/results/calibrated-h200-2026-12-04e/ (each point's
# rate with its own cost a touched expert, from two expert sizes), with which that start's 8 eager batch-1 plans
# were predicted within 0.90-1.12 of measured and Phi-3.5-MoE's decode-32 hybrid at 1.11 (docs/BENCHMARKS.md,
# 2026-12-04 10:23 UTC). Before: 40 GB/s at one row (torch.bmm's pass) and 95 at two with 20 us an expert at a 0.68
# share, fitted to decode-32 forwards of 2026-12-03; they kept Phi-3.5-MoE all-UVA at batch 1, where its host plan
# measured 0.78-0.83x that step. The host's figures move between starts (that day's other calibrate: 61 GB/s and
# 146 us at one row): `planner calibrate` measures the machine at hand.
H200_HOST_EXPERTS = [HostRatePoint(tokens=1, gbps=108.085, expert_us=70.536),
                     HostRatePoint(tokens=2, gbps=107.016, expert_us=31.248),
                     HostRatePoint(tokens=4, gbps=86.414, expert_us=35.185)]
H200_HOST_EXPERT_US = 31.248
H200_HOST_LINK_SHARE = 0.901
H200_HOST_TFLOPS = 1.15
H200_HOST_CALL_US = 814.363


# the narrow weight ``planner calibrate`` reads through UVA beside its wide one, (outputs, inputs): Llama-3-8B's key
# projection; its fixed cost per call (``uva_call_ms``) and its re-reads by rows (``uva_passes_narrow``)
NARROW_UVA = (1024, 4096)


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
    uva_passes_narrow: list[UvaPoint] | None = Field(
        default=None, description="the same for a narrow weight (NARROW_UVA: 1,024 outputs, a key or value "
        "projection), which the GPU's matmul tiles in shorter tiles of rows and so re-reads more often (on the H200 "
        "15.5 times at 2,048 rows where the wide weight's curve says 7.9); priced for weights of at most "
        "NARROW_UVA's outputs; absent: uva_passes for every weight")
    gpu_mem_gbps: Rate = Field(description="GPU memory read rate of a large kernel, GB/s")
    matmul_gbps_rows: list[RatePoint] | None = Field(
        default=None, description="a dense matmul's read rate from GPU memory by its rows, as a decoder block's "
        "matmuls reach it among the block's other kernels (planner calibrate: a Llama-3-8B block replayed at decode "
        "steps of 1 to 128 sequences, its matrices' bytes over its time beyond the block floor), GB/s; slower the "
        "more rows; linear between points, flat outside them (absent: gpu_mem_gbps at any rows)")
    matmul_tflops: Tflops = Field(description="dense matmul rate in the model's dtype (bf16), TFLOP/s")
    attention_tflops: Tflops = Field(
        default=H200_ATTENTION_TFLOPS, description="rate of attention's own arithmetic (Q·Kᵀ and the weighted "
        "sum of V over the context: scaled dot-product attention as transformers runs it, causal), TFLOP/s")
    elementwise_bytes: BytesPerElement = Field(
        default=H200_ELEMENTWISE_BYTES, description="GPU memory traffic of a decoder block's work between its "
        "matmuls (norms, rotary embedding, activation, residual adds: what the matmul roofline misses), per "
        "token and per output element of the block's matrices, in bytes at gpu_mem_gbps")
    strided_copy_gbps: Rate = Field(
        default=H200_STRIDED_COPY_GBPS, description="bytes read + written a second by PyTorch's copy of a "
        "non-contiguous view into a new tensor (element by element; transformers' repeat_kv of the KV cache), GB/s")
    kv_read_gbps: Rate | None = Field(
        default=None, description="the rate scaled dot-product attention reads a KV cache at a decode step (its "
        "keys and values in place, or transformers' repeated copies of them), GB/s (absent: gpu_mem_gbps)")
    launch_us: PositiveMicroseconds = Field(description="CPU time to issue one small eager kernel, microseconds")
    block_cpu_us: PositiveMicroseconds = Field(
        description="CPU time to run one eager decoder block (module calls and ~30 kernels), microseconds")
    moe_block_cpu_us: PositiveMicroseconds = Field(
        description="CPU time to run one eager MoE decoder block (router, experts), microseconds")
    model_cpu_us: Microseconds = Field(
        default=0.0, description="CPU time an eager forward spends outside its decoder blocks (the model's own "
        "Python: embedding, rotary tables, masks, final norm, head, its output), microseconds (0: not measured)")
    block_gpu_us: Microseconds = Field(
        default=0.0, description="GPU time of one decoder block beyond its roofline: the fixed time each of its "
        "many small kernels takes (norms, rotary, residuals, attention's set-up) whatever its bytes; what a CUDA "
        "graph replay of a decode step is made of besides the weights' reads, microseconds (0: not measured)")
    moe_block_gpu_us: Microseconds = Field(
        default=0.0, description="the same for an MoE decoder block (router, top-k, sort, grouped expert kernels, "
        "gather and scatter), microseconds (0: not measured)")
    expert_cpu_us: Microseconds = Field(
        description="extra CPU time per routed expert a batch touches (MoE blocks that loop over "
        "experts; 0 for grouped kernels), microseconds")
    copy_call_us: Microseconds = Field(description="fixed cost of one host->GPU copy call, microseconds")
    uva_expert_call_ms: Milliseconds = Field(
        default=0.0, description="fixed GPU time of one routed-expert matmul (a grouped kernel over all "
        "experts) whose weights are read through UVA, beyond its bytes, milliseconds")
    uva_expert_passes: list[UvaPoint] | None = Field(
        default=None, description="re-reads of UVA expert weights by a grouped expert matmul, by the rows each "
        "expert it touches sees (``tokens`` here: rows an expert); linear between points (absent: uva_passes, a "
        "dense matmul's)")
    expert_gbps: Rate | None = Field(
        default=None, description="the rate grouped routed-expert matmuls read experts from GPU memory, by the "
        "touched experts' bytes (one token touches few experts: the block floor holds the rest), GB/s (absent: "
        "gpu_mem_gbps)")
    expert_tflops: Tflops | None = Field(
        default=None, description="the rate of grouped routed-expert matmuls (many experts, few rows each) once "
        "compute-bound, TFLOP/s (absent: matmul_tflops)")
    expert_tflops_rows: list[TflopsPoint] | None = Field(
        default=None, description="the rate of grouped routed-expert matmuls from GPU memory by the rows each "
        "expert sees, where their flops outlast their reads (128 rows an expert and more); linear between points, "
        "flat outside them (absent: expert_tflops at any rows)")
    uva_call_ms: Milliseconds = Field(
        default=0.0, description="fixed GPU time of one dense matmul whose weight is read through UVA, beyond its "
        "bytes at uva_gbps (the read's ramp and tail: what a matmul of one weight loses against uva_gbps, which a "
        "large read measures), milliseconds")
    host_expert_gbps: list[HostRatePoint] = Field(
        default_factory=lambda: list(H200_HOST_EXPERTS), min_length=1,
        description="the cpu backend: GB/s of expert weights the host CPU's padded pass reads, by the rows each "
        "expert sees, each point with its own expert_us where measured there; linear between points (default: "
        "the H200 machine's host)")
    host_expert_us: Microseconds = Field(
        default=H200_HOST_EXPERT_US, description="the cpu backend: the host's time per expert its call touches beyond "
        "reading the expert's bytes (its share of the batched matmuls' calls and padding), microseconds, where "
        "host_expert_gbps's points give none")
    host_tflops: Tflops = Field(default=H200_HOST_TFLOPS, description="the cpu backend: the host's bf16 rate on the "
                                "experts' matmuls once compute-bound (many rows an expert), TFLOP/s")
    host_call_us: Microseconds = Field(default=H200_HOST_CALL_US, description="the cpu backend: host time of one "
                                       "layer's call beyond its matmuls (routing read back, sort, copies), microseconds")
    # torch.bmm's padded pass kept 0.85-0.92 of its rate beside UVA reads; the kernel kept 0.66-0.70 in
    # kernel-h200-2026-12-03{g,h}/ and 0.69-0.97 in the calibrate runs of 2026-12-04 (the H200's default: one of them)
    host_link_share: Share = Field(default=H200_HOST_LINK_SHARE, description="the cpu backend: the host kernel's "
                                   "rate while GPU kernels read host memory through UVA, as a share of its rate alone")
    moe_sync: StrictBool = Field(default=False, description="MoE blocks read the routing back to the CPU before "
                           "looping over the experts (a per-expert loop); false for grouped MoE kernels")
    workspace_bytes: Count | None = Field(
        default=None, description="GPU bytes library workspaces take on the stream a forward runs on (cuBLAS, "
        "attention kernels), counted in every plan's peak (absent: 32 MiB)")

    @property
    def workspace(self) -> int:
        """The workspace allowance a plan counts: the measured one, else DEFAULT_WORKSPACE_BYTES."""
        return self.workspace_bytes if self.workspace_bytes is not None else DEFAULT_WORKSPACE_BYTES

    @field_validator("uva_passes", "uva_passes_narrow", "uva_expert_passes", "host_expert_gbps", "expert_tflops_rows",
                     "matmul_gbps_rows")
    @classmethod
    def _sorted(cls, points: list | None) -> list | None:
        if points is None:
            return None
        tokens = [p.tokens for p in points]
        if tokens != sorted(set(tokens)):
            raise ValueError("must be listed by increasing tokens, each once")
        return points

    def host_gbps(self, rows: float) -> float:
        """The host expert kernel's GB/s when each expert sees ``rows`` rows: linear between the points, flat
        outside them."""
        return _flat_between([(p.tokens, p.gbps) for p in self.host_expert_gbps], rows)

    def host_expert_us_at(self, rows: float) -> float:
        """What a touched expert costs the host beyond its bytes when each expert sees ``rows`` rows: the points'
        own ``expert_us`` (``host_expert_us`` where a point has none), linear between the points, flat outside."""
        return _flat_between([(p.tokens, self.host_expert_us if p.expert_us is None else p.expert_us)
                              for p in self.host_expert_gbps], rows)

    def matmul_gbps_at(self, rows: float) -> float:
        """A dense matmul's read rate from GPU memory at ``rows`` rows: ``matmul_gbps_rows`` (linear between its
        points, flat outside them), else ``gpu_mem_gbps``."""
        pts = self.matmul_gbps_rows
        return _flat_between([(p.tokens, p.gbps) for p in pts], rows) if pts else self.gpu_mem_gbps

    def passes(self, tokens: float, outputs: int | None = None) -> float:
        """Re-reads of a UVA weight by a matmul over ``tokens`` rows: piecewise linear in tokens
        (a matmul re-reads its weight once per tile of rows), extended past the last point; ``outputs``: the
        weight's output features, whose narrow curve (``uva_passes_narrow``) prices a weight of at most
        ``NARROW_UVA``'s where the profile has one."""
        if self.uva_passes_narrow and outputs is not None and outputs <= NARROW_UVA[0]:
            return _along(self.uva_passes_narrow, tokens)
        return _along(self.uva_passes, tokens)

    def expert_passes(self, rows: float) -> float:
        """Re-reads of UVA expert weights by a grouped expert matmul whose experts see ``rows`` rows each
        (``uva_expert_passes``; a dense matmul's ``passes`` where the profile has none)."""
        return _along(self.uva_expert_passes, rows) if self.uva_expert_passes else self.passes(rows)

    @property
    def experts_gbps(self) -> float:
        """The grouped expert matmuls' read rate from GPU memory: ``expert_gbps``, else ``gpu_mem_gbps``."""
        return self.expert_gbps if self.expert_gbps is not None else self.gpu_mem_gbps

    @property
    def experts_tflops(self) -> float:
        """The grouped expert matmuls' compute rate: ``expert_tflops``, else ``matmul_tflops``."""
        return self.expert_tflops if self.expert_tflops is not None else self.matmul_tflops

    def experts_tflops_at(self, rows: float) -> float:
        """The grouped expert matmuls' compute rate when each expert they touch sees ``rows`` rows:
        ``expert_tflops_rows`` (linear between its points, flat outside them), else ``experts_tflops``."""
        pts = self.expert_tflops_rows
        return _flat_between([(p.tokens, p.tflops) for p in pts], rows) if pts else self.experts_tflops


def elementwise_ms(tokens: float, outputs: int, elementwise_bytes: float, gpu_mem_gbps: float) -> float:
    """A block's norms, rotary embedding, activation and residual adds at ``tokens``: ``elementwise_bytes`` of GPU
    memory per token and output element of its matrices, at ``gpu_mem_gbps`` (the cost model adds it,
    planner/cost/block.py; ``planner calibrate`` takes it out of a replayed block, runtime/calibrate/block.py)."""
    return tokens * outputs * elementwise_bytes / gpu_mem_gbps / 1e6


def _flat_between(pts: list[tuple[float, float]], x: float) -> float:
    """The value at ``x`` of (x, value) points listed by increasing x: linear between them, flat outside."""
    if x <= pts[0][0]:
        return pts[0][1]
    for (xa, a), (xb, b) in zip(pts, pts[1:]):
        if x <= xb:
            return a + (x - xa) * (b - a) / (xb - xa)
    return pts[-1][1]


def _along(pts: list[UvaPoint], tokens: float) -> float:
    """Passes at ``tokens``: linear between the points, flat below the first, extended past the last."""
    if tokens <= pts[0].tokens or len(pts) == 1:
        return pts[0].passes if tokens <= pts[0].tokens else pts[-1].passes
    for a, b in zip(pts, pts[1:]):
        if tokens <= b.tokens:
            return a.passes + (tokens - a.tokens) * (b.passes - a.passes) / (b.tokens - a.tokens)
    a, b = pts[-2], pts[-1]
    return b.passes + (tokens - b.tokens) * (b.passes - a.passes) / (b.tokens - a.tokens)
