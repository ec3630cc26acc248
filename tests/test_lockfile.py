"""`planner plan SPEC ... --check PLAN`: a committed plan is up to date (exit 0), differs (exit 1 with
the diff and the command that refreshes it), was made from another spec or by an older planner
(exit 1, said so), or cannot be judged (exit 2, tests/corpus/lockfile.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from cli_samples import invoke

from corpus.lockfile import SPEC, committed_plan
from planner.review.lockfile import CHANGED, OLDER_VERSION, OTHER_SPEC, SAME, STDIN_PLAN


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    """spec.yaml and plan.yaml, the plan as `planner plan spec.yaml --gpu-budget 8KB -o plan.yaml` writes it."""
    spec, plan = tmp_path / "spec.yaml", tmp_path / "plan.yaml"
    spec.write_text(SPEC)
    assert invoke("plan", str(spec), "--gpu-budget", "8KB", "-o", str(plan)).exit_code == 0
    return str(spec), str(plan)


def last_line(output: str) -> str:
    return output.rstrip("\n").splitlines()[-1]


def refresh_words(output: str) -> list[str]:
    """The refresh command of a text verdict, as words after ``planner``."""
    command = last_line(output).split("; refresh with: ", 1)[1]
    words = shlex.split(command)
    assert words[:2] == ["planner", "plan"], command
    return words[1:]


def test_the_plan_just_written_is_up_to_date(files: tuple[str, str]) -> None:
    spec, plan = files
    result = invoke("plan", spec, "-g", "8KB", "--check", plan)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{plan} is up to date: planner plan {spec} --gpu-budget 8KB makes the same plan\n"
    assert Path(plan).read_text() == committed_plan(gpu_budget=8000)  # --check wrote nothing


def test_equal_after_loading_whatever_the_format_or_line_endings(files: tuple[str, str], tmp_path: Path) -> None:
    spec, plan = files
    crlf, as_json = tmp_path / "crlf.yaml", tmp_path / "plan.json"
    crlf.write_bytes(Path(plan).read_text().replace("\n", "\r\n").encode())
    as_json.write_text(committed_plan(fmt="json", gpu_budget=8000))
    for committed in (crlf, as_json):
        result = invoke("plan", spec, "-g", "8KB", "--check", str(committed))
        assert result.exit_code == 0, result.output
        assert "is up to date" in result.stdout


def test_a_changed_budget_gives_the_diff_and_a_refresh_command_that_refreshes(files: tuple[str, str]) -> None:
    spec, plan = files
    result = invoke("plan", spec, "-g", "4KB", "--check", plan)
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert out.startswith("plan diff: moved ")
    assert "gpu_budget_bytes: 7.81 KiB (8000) -> 3.91 KiB (4000)" in out
    assert last_line(out) == (f"{plan} is out of date: {spec} with these options makes another plan (the diff "
                              f"above: committed -> now); refresh with: planner plan {spec} --gpu-budget 4KB -o {plan}")
    words = refresh_words(out)
    assert invoke(*words).exit_code == 0
    assert Path(plan).read_text() == committed_plan(gpu_budget=4000)
    assert invoke("plan", spec, "-g", "4KB", "--check", plan).exit_code == 0


def test_the_refresh_command_spells_every_option_as_given(files: tuple[str, str]) -> None:
    spec, plan = files
    options = ["--gpu-budget", "7 KiB", "--backend", "prefetch", "--prefetch-step", "3", "--params", "mlp",
               "--hardware", "h200", "--workload", "decode", "--workload", "prefill=512:0.25"]
    result = invoke("plan", spec, *options, "--check", plan, "--diff-format", "text")
    assert result.exit_code == 1, result.output
    words = refresh_words(result.stdout)
    assert words == ["plan", spec, *options, "-o", plan]  # in the command's order, --diff-format left out
    assert invoke(*words).exit_code == 0
    assert invoke("plan", spec, *options, "--check", plan).exit_code == 0


def test_short_flags_are_spelled_long_and_defaults_left_out(files: tuple[str, str]) -> None:
    spec, plan = files
    result = invoke("plan", spec, "-g", "5000", "-w", "decode=4", "--check", plan)
    assert refresh_words(result.stdout) == ["plan", spec, "--gpu-budget", "5000", "--workload", "decode=4", "-o", plan]


def test_a_json_plan_is_refreshed_as_json(files: tuple[str, str], tmp_path: Path) -> None:
    spec, _ = files
    plan = tmp_path / "plan.json"
    plan.write_text(committed_plan(fmt="json", gpu_budget=8000))
    result = invoke("plan", spec, "-g", "4KB", "--check", str(plan))
    words = refresh_words(result.stdout)
    assert words[-4:] == ["--format", "json", "-o", str(plan)]
    assert invoke(*words).exit_code == 0
    assert json.loads(plan.read_text())["summary"]["gpu_budget_bytes"] == 4000


def test_a_changed_prediction_is_a_change(files: tuple[str, str]) -> None:
    spec, plan = files
    data = json.loads(committed_plan(fmt="json", gpu_budget=8000))
    data["predictions"]["workloads"][0]["step_ms"] *= 1.5  # longer: still a forward that can be
    data["predictions"]["weighted_step_ms"] = data["predictions"]["workloads"][0]["step_ms"]
    Path(plan).write_text(json.dumps(data))
    result = invoke("plan", spec, "-g", "8KB", "--check", plan)
    assert result.exit_code == 1, result.output
    assert "predicted step" in result.stdout and "is out of date" in last_line(result.stdout)


def test_a_plan_of_another_spec_is_named_as_such(files: tuple[str, str], tmp_path: Path) -> None:
    spec, plan = files
    other = tmp_path / "other.yaml"
    other.write_text(SPEC.replace("name: tiny", "name: tiny-v2"))
    result = invoke("plan", str(other), "-g", "8KB", "--check", plan)
    assert result.exit_code == 1, result.output
    committed_sha = json.loads(committed_plan(fmt="json", gpu_budget=8000))["summary"]["spec_sha256"]
    line = last_line(result.stdout)
    assert line.startswith(f"{plan} was made from another spec (sha {committed_sha[:12]}; {other} has sha ")
    assert line.endswith(f"; refresh with: planner plan {other} --gpu-budget 8KB -o {plan}")
    assert "model: tiny -> tiny-v2" in result.stdout  # the diff, model first


def test_a_plan_of_an_older_planner_is_stale(files: tuple[str, str]) -> None:
    spec, plan = files
    Path(plan).write_text(Path(plan).read_text().replace("plan_version: 2", "plan_version: 1", 1))
    result = invoke("plan", spec, "-g", "8KB", "--check", plan)
    assert result.exit_code == 1, result.output
    assert result.stdout == (f"stale: {plan} was made by an older planner (plan_version 1; this planner writes 2); "
                             f"refresh with: planner plan {spec} --gpu-budget 8KB -o {plan}\n")
    assert invoke(*refresh_words(result.stdout)).exit_code == 0
    assert invoke("plan", spec, "-g", "8KB", "--check", plan).exit_code == 0
    assert invoke("show", plan).exit_code == 0


def test_an_older_plan_outside_check_is_still_bad_input(files: tuple[str, str]) -> None:
    _, plan = files
    Path(plan).write_text(Path(plan).read_text().replace("plan_version: 2", "plan_version: 1", 1))
    result = invoke("show", plan)
    assert result.exit_code == 2 and "older planner" in result.stderr


def test_a_committed_plan_that_does_not_load_is_bad_input(files: tuple[str, str]) -> None:
    spec, plan = files
    Path(plan).write_text(Path(plan).read_text()[:300])  # cut short
    result = invoke("plan", spec, "-g", "8KB", "--check", plan)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and result.stderr.startswith(f"error: {plan}")


def test_check_with_output_is_bad_input_and_writes_nothing(files: tuple[str, str]) -> None:
    spec, plan = files
    before = Path(plan).read_text()
    result = invoke("plan", spec, "-g", "4KB", "--check", plan, "-o", plan)
    assert result.exit_code == 2
    assert "--check compares with" in result.stderr and result.stdout == ""
    assert Path(plan).read_text() == before


def test_the_committed_plan_on_stdin(files: tuple[str, str]) -> None:
    spec, plan = files
    text = Path(plan).read_text()
    assert invoke("plan", spec, "-g", "8KB", "--check", "-", stdin=text).exit_code == 0
    result = invoke("plan", spec, "-g", "4KB", "--check", "-", stdin=text)
    assert result.exit_code == 1
    assert last_line(result.stdout).startswith("<stdin> is out of date")
    assert refresh_words(result.stdout)[-2:] == ["-o", STDIN_PLAN]


def test_markdown_for_a_pull_request(files: tuple[str, str]) -> None:
    spec, plan = files
    result = invoke("plan", spec, "-g", "4KB", "--check", plan, "--diff-format", "markdown")
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert out.startswith("## Plan diff\n")
    assert f"**`{plan}` is out of date: `{spec}` with these options makes another plan" in out
    assert out.endswith(f"Refresh with:\n\n```sh\nplanner plan {spec} --gpu-budget 4KB -o {plan}\n```\n")
    same = invoke("plan", spec, "-g", "8KB", "--check", plan, "--diff-format", "markdown")
    assert same.exit_code == 0
    assert same.stdout == f"`{plan}` is up to date: `planner plan {spec} --gpu-budget 8KB` makes the same plan.\n"


@pytest.mark.parametrize("budget, status, code", [("8KB", SAME, 0), ("4KB", CHANGED, 1)])
def test_json_for_tools(files: tuple[str, str], budget: str, status: str, code: int) -> None:
    spec, plan = files
    result = invoke("plan", spec, "-g", budget, "--check", plan, "--diff-format", "json")
    assert result.exit_code == code, result.output
    data = json.loads(result.stdout)
    assert data["status"] == status and data["up_to_date"] is (code == 0) and data["plan"] == plan
    if code:
        assert data["refresh"] == f"planner plan {spec} --gpu-budget {budget} -o {plan}"
        assert data["diff"]["changed"] is True
        assert [m for m in data["diff"]["memory"] if m["field"] == "gpu_budget_bytes"][0]["new"] == 4000
        assert data["spec_sha256"]["plan"] == data["spec_sha256"]["spec"]
    else:
        assert data["refresh"] is None and data["diff"] is None


def test_json_names_another_spec_and_an_older_version(files: tuple[str, str], tmp_path: Path) -> None:
    spec, plan = files
    other = tmp_path / "other.yaml"
    other.write_text(SPEC.replace("[100, 8]", "[120, 8]"))
    data = json.loads(invoke("plan", str(other), "--check", plan, "--diff-format", "json").stdout)
    assert data["status"] == OTHER_SPEC and data["spec_sha256"]["plan"] != data["spec_sha256"]["spec"]
    Path(plan).write_text(Path(plan).read_text().replace("plan_version: 2", "plan_version: 1", 1))
    data = json.loads(invoke("plan", spec, "--check", plan, "--diff-format", "json").stdout)
    assert data["status"] == OLDER_VERSION and data["plan_version"] == 1 and data["diff"] is None


def test_an_infeasible_budget_is_reported_as_without_check(files: tuple[str, str]) -> None:
    spec, plan = files
    result = invoke("plan", spec, "-g", "1KB", "--strategy", "budget", "--check", plan)  # budget keeps blocks resident
    assert result.exit_code == 1 and "no plan fits" in result.stderr and result.stdout == ""


def test_help_shows_check_and_diff_format() -> None:
    text = invoke("plan", "--help").stdout
    assert "--check PLAN" in text and "--diff-format" in text
    assert "--check plan.yaml --diff-format markdown" in text
