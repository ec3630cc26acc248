"""`planner show` prints the plan's predictions (table and JSON), or new ones for --hardware / --workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_samples import invoke

import planner
from schemas.io import dump_model

GB = 10**9


@pytest.fixture(scope="module")
def plan(llama8b):
    from schemas.workload import Workload, WorkloadItem

    workload = Workload({"decode": WorkloadItem(tokens=1, weight=0.9), "prefill": WorkloadItem(tokens=2048, weight=0.1)})
    return planner.plan(llama8b, gpu_budget=12 * GB, workload=workload, backend="prefetch")


@pytest.fixture()
def plan_file(plan, tmp_path: Path) -> str:
    path = tmp_path / "plan.yaml"
    path.write_text(dump_model(plan))
    return str(path)


def test_table_prints_each_workload_prediction(plan, plan_file):
    result = invoke("show", plan_file)
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"predicted on {plan.predictions.hardware}" in out
    for p in plan.predictions.workloads:
        row = next(line for line in out.splitlines() if line.startswith(f"│ {p.workload} "))
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert cells == [p.workload, str(p.tokens), f"{p.step_ms:.3f}", f"{p.compute_ms:.3f}", f"{p.copy_ms:.3f}",
                         f"{p.stall_ms:.3f}", f"{p.cpu_ms:.3f}", p.bound]
    assert f"weighted step: {plan.predictions.weighted_step_ms:.3f} ms" in out


def test_json_carries_the_predictions(plan, plan_file):
    data = json.loads(invoke("show", plan_file, "--format", "json").stdout)
    assert data["predictions"] == plan.predictions.model_dump(mode="json")


def test_workload_and_hardware_predict_again(plan, plan_file, tmp_path: Path):
    data = json.loads(invoke("show", plan_file, "-f", "json", "--workload", "decode=64").stdout)
    (row,) = data["predictions"]["workloads"]
    assert (row["workload"], row["tokens"]) == ("decode", 64)
    named = json.loads(invoke("show", plan_file, "-f", "json", "--workload", "prefill").stdout)
    assert named["predictions"]["workloads"][0]["weight"] == 0.1  # the plan's own prefill, weight kept
    from schemas.hardware import load_hardware

    slow = load_hardware("h200").model_copy(update={"name": "slow-link", "h2d_gbps": 5.0})
    profile = tmp_path / "slow.yaml"
    profile.write_text(dump_model(slow))
    again = json.loads(invoke("show", plan_file, "-f", "json", "--hardware", str(profile)).stdout)["predictions"]
    assert again["hardware"] == "slow-link"
    before = {p.workload: p.copy_ms for p in plan.predictions.workloads}
    assert all(p["copy_ms"] > 5 * before[p["workload"]] for p in again["workloads"])  # an 11x slower link


def test_unknown_workload_is_bad_input(plan_file):
    result = invoke("show", plan_file, "--workload", "prefil")
    assert result.exit_code == 2
    assert "did you mean 'prefill'?" in result.output and "the plan predicts: decode, prefill" in result.output


@pytest.fixture(scope="module")
def calibrated_h200():
    """A profile `planner calibrate` could write on another H200: the bundled name, other figures."""
    from schemas.hardware import load_hardware

    return load_hardware("h200").model_copy(update={
        "source": "planner calibrate on NVIDIA H200, a slower host", "h2d_gbps": 9.0, "block_cpu_us": 4000.0})


def test_a_calibrated_profile_named_like_a_bundled_one_is_the_one_predicted_again(llama8b, calibrated_h200,
                                                                                 tmp_path: Path):
    from planner.cost.predict import predict
    from planner.cost.predicted import chosen_profile
    from schemas.hardware import load_hardware
    from schemas.io import load_plan
    from schemas.workload import Workload, WorkloadItem

    profile = tmp_path / "h200.yaml"
    profile.write_text(dump_model(calibrated_h200))
    path = tmp_path / "plan.yaml"
    assert invoke("plan", "examples/llama-3-8b.yaml", "-g", "12GB", "--hardware", str(profile),
                  "-o", str(path)).exit_code == 0
    plan = load_plan(path)
    assert plan.predictions.profile == calibrated_h200 and chosen_profile(plan, None) == calibrated_h200
    four = Workload({"decode": WorkloadItem(tokens=4)})
    ours, bundled = predict(plan, calibrated_h200, four), predict(plan, load_hardware("h200"), four)
    assert ours.workloads[0].step_ms != bundled.workloads[0].step_ms
    shown = json.loads(invoke("show", str(path), "-f", "json", "--workload", "decode=4").stdout)["predictions"]
    assert shown["workloads"][0]["step_ms"] == ours.workloads[0].step_ms


def test_an_older_plan_without_its_profile_is_not_predicted_with_a_namesake(llama8b, calibrated_h200, tmp_path: Path):
    plan = planner.plan(llama8b, gpu_budget=12 * GB, hardware=calibrated_h200)
    older = plan.model_copy(update={"predictions": plan.predictions.model_copy(update={"profile": None})})
    path = tmp_path / "old.plan.yaml"
    path.write_text(dump_model(older))
    result = invoke("show", str(path), "--workload", "decode=4")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "not the bundled 'h200'" in result.output and "--hardware FILE" in result.output
    assert invoke("show", str(path)).exit_code == 0  # its own predictions are shown as written
    bundled = planner.plan(llama8b, gpu_budget=12 * GB)
    plain = bundled.model_copy(update={"predictions": bundled.predictions.model_copy(update={"profile": None})})
    path.write_text(dump_model(plain))
    assert invoke("show", str(path), "--workload", "decode=4").exit_code == 0  # the bundled one's own source
