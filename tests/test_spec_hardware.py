"""A spec's `hardware: FILE` is the file next to the spec, from wherever the spec is planned (stdin: the
current folder), and `check-plans` given that file checks the plans made with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_samples import TINY_SPEC, invoke

from schemas.hardware import load_hardware
from schemas.io import dump_model, load_plan

SPEC = TINY_SPEC.replace("gpu_budget: 2KB", "gpu_budget: 6KB").replace("backend: uva\n", "backend: prefetch\nhardware: gpu.yaml\n")


def _profile(path: Path, name: str, h2d_gbps: float) -> None:
    path.write_text(dump_model(load_hardware("h200").model_copy(update={"name": name, "h2d_gbps": h2d_gbps})))


@pytest.fixture()
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """specs/m.yaml naming specs/gpu.yaml, another gpu.yaml at the top, the current folder the top."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "m.yaml").write_text(SPEC)
    _profile(tmp_path / "specs" / "gpu.yaml", "next-to-spec", 50.0)
    _profile(tmp_path / "gpu.yaml", "current-folder", 5.0)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_relative_profile_is_the_one_next_to_the_spec(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert invoke("plan", "specs/m.yaml", "-o", "top.plan.yaml").exit_code == 0
    monkeypatch.chdir(repo / "specs")
    assert invoke("plan", "m.yaml", "-o", "../inside.plan.yaml").exit_code == 0
    top, inside = load_plan(repo / "top.plan.yaml"), load_plan(repo / "inside.plan.yaml")
    assert top.predictions.hardware == inside.predictions.hardware == "next-to-spec"
    assert top == inside


def test_a_spec_on_stdin_finds_its_profile_in_the_current_folder(repo: Path) -> None:
    result = invoke("plan", "-", "-o", "stdin.plan.yaml", stdin=SPEC)
    assert result.exit_code == 0, result.output
    assert load_plan(repo / "stdin.plan.yaml").predictions.hardware == "current-folder"


def test_the_command_line_profile_is_relative_to_the_current_folder(repo: Path) -> None:
    assert invoke("plan", "specs/m.yaml", "--hardware", "gpu.yaml", "-o", "p.yaml").exit_code == 0
    assert load_plan(repo / "p.yaml").predictions.hardware == "current-folder"


def test_a_missing_profile_names_the_path_next_to_the_spec(repo: Path) -> None:
    (repo / "specs" / "gpu.yaml").unlink()
    result = invoke("plan", "specs/m.yaml")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "specs/gpu.yaml: no such file" in result.output


def test_check_plans_given_the_spec_profile_checks_its_plans(repo: Path) -> None:
    (repo / "planner-plans.sh").write_text("planner plan specs/m.yaml -o specs/m.plan.yaml\n")
    assert invoke("plan", "specs/m.yaml", "-o", "specs/m.plan.yaml").exit_code == 0
    fresh = invoke("check-plans", "specs/gpu.yaml")
    assert fresh.exit_code == 0 and "1 plan checked: 1 up to date" in fresh.output, fresh.output
    _profile(repo / "specs" / "gpu.yaml", "next-to-spec", 7.0)  # the profile changed: the plan is stale
    stale = invoke("check-plans", "specs/gpu.yaml")
    assert stale.exit_code == 1 and "1 plan checked: 1 out of date" in stale.output, stale.output
    other = invoke("check-plans", "gpu.yaml")  # a profile no line uses
    assert other.exit_code == 0 and "0 plans checked" in other.output and "not checked" in other.output
