"""A hardware profile: what the cost model needs to know about a GPU and its host link.

Figures are rates and fixed costs measured on one machine (``planner calibrate`` measures
them on the local GPU). Bundled profiles live in ``schemas/profiles/NAME.yaml``; a profile
is named by its bundled name or by a file path (``--hardware h200`` / ``--hardware my.yaml``).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, StrictBool, field_validator

from schemas.ints import Count, PositiveCount

from schemas.reals import Microseconds, Milliseconds, Passes, PositiveMicroseconds, Rate, Tflops
from schemas.spec_names import PrintableName, PrintableText
from schemas.strict import StrictModel

PROFILES = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "h200"
# the workspace allowance of a profile that does not measure one: cuBLAS keeps 32 MiB on the stream a
# forward runs on (measured on the H200, shared/h200-limits.md)
DEFAULT_WORKSPACE_BYTES = 32 * 2**20


class UvaPoint(StrictModel):
    """How many times a matmul at ``tokens`` rows reads a weight that lives in pinned host memory."""

    tokens: PositiveCount
    passes: Passes = Field(description="bytes read over the link / the weight's bytes")


class HardwareProfile(StrictModel):
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
    workspace_bytes: Count | None = Field(
        default=None, description="GPU bytes library workspaces take on the stream a forward runs on (cuBLAS, "
        "attention kernels), counted in every plan's peak (absent: 32 MiB)")

    @property
    def workspace(self) -> int:
        """The workspace allowance a plan counts: the measured one, else DEFAULT_WORKSPACE_BYTES."""
        return self.workspace_bytes if self.workspace_bytes is not None else DEFAULT_WORKSPACE_BYTES

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


def bundled_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES.glob("*.yaml"))


def is_profile_file(key: str) -> bool:
    """Whether ``--hardware KEY`` (or a spec's ``hardware: KEY``) names a file rather than a bundled profile."""
    return "/" in key or key.endswith((".yaml", ".yml", ".json"))


def spec_hardware(value: str | None, spec_path: str | Path) -> str | None:
    """A spec's ``hardware:`` as ``load_hardware`` takes it: a bundled name as written, a relative file
    resolved against the folder of the spec file at ``spec_path`` (a spec read from stdin, ``-``: against
    the current folder), so that a spec means the same profile from wherever it is planned."""
    if value is None or not is_profile_file(value) or str(spec_path) == "-" or Path(value).is_absolute():
        return value
    return os.path.normpath(os.path.join(os.path.dirname(str(spec_path)), value))


def load_hardware(name_or_path: str | Path | None = None) -> HardwareProfile:
    """A bundled profile by name, or a profile file; InputError naming the file when it is bad."""
    from schemas.errors import InputError
    from schemas.io import load_model

    key = str(name_or_path or DEFAULT_PROFILE)
    bundled = PROFILES / f"{key}.yaml"
    if not is_profile_file(key):
        if not bundled.is_file():
            from schemas.errors import suggest

            raise InputError(f"--hardware: no bundled profile '{key}'{suggest(key, bundled_profiles())}; "
                             f"bundled: {', '.join(bundled_profiles())}; or give a profile file "
                             "(make one with `planner calibrate -o my-gpu.yaml`)")
        return load_model(HardwareProfile, bundled)
    return load_model(HardwareProfile, key)
