"""Every real number read from a file is finite and in its quantity's range (schemas/reals.py), and a
profile that passes gives finite predictions: properties over any float in any profile figure."""

from __future__ import annotations

import math

import pytest
from cli_samples import TINY_SPEC
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner
from planner.errors import PlanningError
from schemas.errors import InputError
from schemas.hardware import load_hardware
from schemas.hardware_profile import HardwareProfile
from schemas.io import load_model, parse_text
from schemas.fields import GBPS, GIB, MICROSECONDS, MILLISECONDS, PASSES, Quantity, SHARE, TFLOPS

FIGURES = ("h2d_gbps", "uva_gbps", "gpu_mem_gbps", "matmul_tflops", "launch_us", "block_cpu_us",
           "moe_block_cpu_us", "expert_cpu_us", "copy_call_us", "uva_expert_call_ms", "uva_call_ms")
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [1e-300, 5e-324, 1e308, -0.0, 1e-3, 1e6, 1e6 * (1 + 1e-15), 86400e3, 86400e6])


@settings(max_examples=100, deadline=None)
@given(value=ANY_FLOAT, quantity=st.sampled_from([GBPS, TFLOPS, MICROSECONDS, MILLISECONDS, SHARE, PASSES, GIB]))
def test_a_quantity_accepts_exactly_its_finite_range(value: float, quantity: Quantity) -> None:
    inside = math.isfinite(value) and quantity.low <= value <= quantity.high
    if inside:
        assert quantity.check(value) == value
    else:
        with pytest.raises(ValueError, match="must be"):
            quantity.check(value)


@pytest.fixture(scope="module")
def tiny_plan():
    spec = parse_text(TINY_SPEC, "tiny.yaml")
    from schemas.spec import SpecFile

    return planner.plan(SpecFile.model_validate(spec), backend="prefetch", strategy="budget", gpu_budget=5400)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIGURES), value=ANY_FLOAT)
def test_a_profile_with_any_figure_is_refused_or_predicts_finite_times(tmp_path_factory, tiny_plan, field: str,
                                                                       value: float) -> None:
    from planner.cost.predict import predict
    from schemas.workload import Workload, WorkloadItem

    data = load_hardware("h200").model_dump(mode="json") | {field: value}
    path = tmp_path_factory.mktemp("hw") / "gpu.yaml"
    from schemas.yaml_write import dump_yaml

    path.write_text(dump_yaml(data))
    try:
        profile = load_model(HardwareProfile, path)
    except InputError as err:
        assert "gpu.yaml:" in str(err) and field in str(err)
        return
    try:
        predictions = predict(tiny_plan, profile, Workload({"decode": WorkloadItem(tokens=1),
                                                            "prefill": WorkloadItem(tokens=10**9)}))
    except PlanningError as err:  # figures in range, a forward longer than a day: refused where it is written
        assert "outside the range of a real machine" in str(err)
        return
    for row in predictions.workloads:
        assert all(math.isfinite(x) for x in (row.step_ms, row.compute_ms, row.copy_ms, row.stall_ms, row.cpu_ms))


@settings(max_examples=60, deadline=None)
@given(text=st.one_of(ANY_FLOAT.map(repr), st.integers(min_value=0, max_value=10**40).map(str),
                      st.from_regex(r"[0-9]{1,30}(\.[0-9]{0,20})?([eE][+-]?[0-9]{1,4})?", fullmatch=True)))
def test_any_cpu_offload_gb_is_refused_or_a_whole_number_of_bytes(text: str) -> None:
    from planner.vllm.flags import parse_vllm_flags

    try:
        flags = parse_vllm_flags(f"--cpu-offload-gb {text}")
    except InputError as err:
        assert "--cpu-offload-gb" in str(err)
        return
    assert 0 <= flags.uva_max_bytes <= 2**63 and isinstance(flags.text(), str)
