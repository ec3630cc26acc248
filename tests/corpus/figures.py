"""Figures read from files outside a machine's range: non-finite, overflowing, vanishing, not numbers
(schemas/reals.py: one rule for every real number a file holds), in hardware profiles, spec
workloads, plan predictions, measured stats, and vLLM flag values."""

from __future__ import annotations

import json

from corpus.case import CliCase
from corpus.cost import PROFILE, _cli, spec_with
from corpus.explain import PLAN, PREFETCHED, _explain, _stats


def _profile(id: str, old: str, new: str, line: int, field: str, *expect: str) -> CliCase:
    assert old in PROFILE, old
    return _cli(f"figure-profile-{id}", "--hardware", "{d}/gpu.yaml", files={"gpu.yaml": PROFILE.replace(old, new)},
                expect=(f"gpu.yaml:{line}:", field, *expect))


def _plan_prediction(id: str, old: str, new: str, *expect: str) -> CliCase:
    assert old in PLAN, old
    return CliCase(f"figure-plan-{id}", ("show", "{d}/plan.yaml"), files={"plan.yaml": PLAN.replace(old, new, 1)},
                   expect=("plan.yaml:", *expect))


_STEP = next(line for line in PLAN.splitlines() if line.strip().startswith("step_ms:"))

CASES = [
    _profile("rate-inf", "h2d_gbps: 50", "h2d_gbps: .inf", 3, "h2d_gbps", "finite number"),
    _profile("rate-minus-inf", "uva_gbps: 40", "uva_gbps: -.inf", 4, "uva_gbps", "finite number"),
    _profile("rate-nan", "gpu_mem_gbps: 2000", "gpu_mem_gbps: .nan", 6, "gpu_mem_gbps", "finite number"),
    _profile("rate-tiny", "h2d_gbps: 50", "h2d_gbps: 1.0e-300", 3, "h2d_gbps", ">= 0.001", "GB/s"),
    _profile("rate-huge", "matmul_tflops: 500", "matmul_tflops: 1.0e+300", 7, "matmul_tflops", "<= 1e+06 TFLOP/s"),
    _profile("latency-huge", "launch_us: 8", "launch_us: 1.0e+308", 8, "launch_us", "us", "real machine"),
    _profile("latency-zero", "block_cpu_us: 500", "block_cpu_us: 0", 9, "block_cpu_us", "> 0"),
    _profile("latency-negative", "copy_call_us: 4", "copy_call_us: -1.0", 12, "copy_call_us", ">= 0"),
    _profile("latency-bool", "expert_cpu_us: 0", "expert_cpu_us: true", 11, "expert_cpu_us", "expected a number"),
    _profile("rate-quoted", "h2d_gbps: 50", "h2d_gbps: '50'", 3, "h2d_gbps", "expected a number"),
    _profile("passes-huge", "passes: 1.0", "passes: 1.0e+100", 5, "passes", "<= 1e+06"),
    _profile("ms-inf", "copy_call_us: 4", "copy_call_us: 4\nuva_expert_call_ms: .inf", 13, "uva_expert_call_ms",
             "finite"),
    _cli("figure-spec-workload-weight-inf", text=spec_with("offload:", "workload: {decode: {tokens: 1, weight: .inf}}\n"
                                                                         "offload:"),
         expect=("bad.yaml:", "workload.decode.weight", "finite number")),
    _cli("figure-spec-workload-weight-tiny", text=spec_with("offload:", "workload: {decode: {tokens: 1, weight: 1.0e-300}}\n"
                                                                          "offload:"),
         expect=("bad.yaml:", "workload.decode.weight", ">= 1e-06")),
    _cli("figure-option-workload-weight-huge", "--workload", "decode=1:1e300",
         expect=("--workload", "weight must be a number >= 1e-06 and <= 1e+06")),
    _plan_prediction("step-inf", _STEP, _STEP.split(":")[0] + ": .inf", "step_ms", "finite number"),
    _plan_prediction("step-huge", _STEP, _STEP.split(":")[0] + ": 1.0e+300", "step_ms", "<= 8.64e+07 ms"),
    _plan_prediction("step-negative", _STEP, _STEP.split(":")[0] + ": -1.0", "step_ms", ">= 0"),
    _explain("figure-stats-time-huge", _stats(step_ms=1e300), "forwards[0].step_ms"),
    _explain("figure-stats-time-infinity", _stats().replace('"copy_ms": 0.5, "stall_ms": 0.1, "layers"',
                                                            '"copy_ms": Infinity, "stall_ms": 0.1, "layers"'),
             "stats.json", "copy_ms"),
    _explain("figure-stats-rate-bool", _stats(copy_gbps=True), "forwards[0].copy_gbps", "expected a number"),
    _explain("figure-stats-rate-huge", _stats(copy_gbps=1.5e7), "forwards[0].copy_gbps", "<= 1e+06 GB/s"),
    _explain("figure-stats-bytes-huge", _stats(bytes_copied=10**29), "forwards[0].bytes_copied", "2^63-1"),
    _explain("figure-stats-bytes-float", _stats(bytes_copied=1e29), "forwards[0].bytes_copied", "whole number"),
    _explain("figure-stats-layer-twice", _stats(bytes_copied=2048, layers=[{"name": PREFETCHED, "bytes": 1024}] * 2),
             "forwards[0].layers[1].name", f"'{PREFETCHED}' is listed twice"),
    _explain("figure-stats-layers-exceed-total", _stats(bytes_copied=10), "forwards[0].bytes_copied",
             "at least the layers' bytes added up"),
    _explain("figure-stats-layer-bytes-contradict-plan",
             json.dumps({"backend": "prefetch", "forwards": [{"bytes_copied": 5000, "layers": [
                 {"name": PREFETCHED, "bytes": 1000}]}]}),
             "forwards[0].layers[0].bytes", "expected the plan's", "another plan"),
]
