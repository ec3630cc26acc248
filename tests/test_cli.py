"""The `planner` command line end to end: plan, validate, show, diff, schema, --version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_samples import invoke, tiny_plan

from planner.cli import output
from schemas.io import load_model
from schemas.plan import Plan

ROOT = Path(__file__).resolve().parent.parent
LLAMA = str(ROOT / "examples" / "llama-3-8b.yaml")


def plan_of(text: str) -> Plan:
    return load_model(Plan, "<output>", text)


def make_plan(tmp_path: Path, name: str, *args: str) -> Path:
    out = tmp_path / name
    result = invoke("plan", LLAMA, "-o", str(out), *args)
    assert result.exit_code == 0, result.output
    return out


# ---------------------------------------------------------------------------
# plan


def test_plan_writes_yaml_to_stdout_by_default() -> None:
    result = invoke("plan", LLAMA, "--gpu-budget", "12GB")
    assert result.exit_code == 0, result.output
    plan = plan_of(result.stdout)
    assert plan.summary.gpu_budget_bytes == 12 * 10**9
    assert plan.summary.peak_gpu_bytes <= 12 * 10**9
    assert result.stdout.startswith("plan_version: 2\n")
    assert result.stderr == ""


def test_plan_json_format_is_json_of_the_same_plan() -> None:
    as_yaml = plan_of(invoke("plan", LLAMA, "-g", "12GB").stdout)
    result = invoke("plan", LLAMA, "-g", "12GB", "--format", "json")
    assert result.exit_code == 0, result.output
    assert Plan.model_validate(json.loads(result.stdout)) == as_yaml


def test_plan_output_file_and_dash_for_stdout(tmp_path: Path) -> None:
    out = tmp_path / "llama.plan.yaml"
    result = invoke("plan", LLAMA, "-g", "12GB", "-o", str(out))
    assert result.exit_code == 0 and result.stdout == ""
    dash = invoke("plan", LLAMA, "-g", "12GB", "-o", "-")
    assert out.read_text() == dash.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["llama.plan.yaml"]  # no temp files left


def test_plan_reads_stdin_and_is_deterministic() -> None:
    from_file = invoke("plan", LLAMA, "-g", "12GB").stdout
    from_stdin = invoke("plan", "-", "-g", "12GB", stdin=Path(LLAMA).read_text())
    assert from_stdin.exit_code == 0, from_stdin.output
    assert from_stdin.stdout == from_file


@pytest.mark.parametrize("size, expected", [("20 GiB", 20 * 2**30), ("20GB", 20 * 10**9),
                                            ("1.5TB", 15 * 10**11), ("15000000000", 15 * 10**9)])
def test_size_flags_accept_units_and_ints(size: str, expected: int) -> None:
    result = invoke("plan", LLAMA, "--gpu-budget", size)
    assert result.exit_code == 0, result.output
    assert plan_of(result.stdout).summary.gpu_budget_bytes == expected


def test_flags_override_the_spec_file() -> None:
    result = invoke("plan", LLAMA, "-g", "14GB", "--backend", "uva", "--cpu-budget", "32GiB",
                    "--params", "mlp, self_attn")
    assert result.exit_code == 0, result.output
    s = plan_of(result.stdout).summary
    assert (s.backend, s.cpu_budget_bytes, s.buffer_bytes) == ("uva", 32 * 2**30, 0)


def test_group_strategy_flags() -> None:
    result = invoke("plan", LLAMA, "-g", "40GB", "--strategy", "group", "--group-size", "4",
                    "--num-in-group", "1", "--backend", "prefetch", "--prefetch-step", "2")
    assert result.exit_code == 0, result.output
    plan = plan_of(result.stdout)
    offloaded = [layer.name for layer in plan.layers if layer.offloaded]
    assert offloaded == [f"model.layers.{i}" for i in range(3, 32, 4)]
    assert (plan.summary.strategy, plan.summary.prefetch_step) == ("group", 2)


def test_flags_that_contradict_the_file_are_bad_input() -> None:
    result = invoke("plan", LLAMA, "--strategy", "group", "--group-size", "2", "--num-in-group", "3")
    assert result.exit_code == 2
    assert "with the command-line options" in result.stderr
    assert "num_in_group (3) is larger than group_size (2)" in result.stderr


def test_infeasible_budget_exits_1_with_the_smallest_feasible_budget(tmp_path: Path) -> None:
    out = tmp_path / "plan.yaml"
    out.write_text("old plan\n")
    result = invoke("plan", LLAMA, "-g", "1GB", "-o", str(out))
    assert result.exit_code == 1
    assert "smallest feasible" in result.stderr and "hint: rerun with --gpu-budget" in result.stderr
    assert "Traceback" not in result.output
    assert out.read_text() == "old plan\n"  # a failed run leaves the old file alone
    hinted = result.stderr.split("--gpu-budget ")[1].split()[0]
    assert invoke("plan", LLAMA, "-g", hinted).exit_code == 0  # the hint is enough


def test_write_atomic_leaves_the_old_file_when_the_rename_fails(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "plan.yaml"
    target.write_text("old\n")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output.os, "replace", broken_replace)
    with pytest.raises(OSError):
        output.write_atomic(target, "new\n" * 1000)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]


def test_unwritable_output_is_bad_input(tmp_path: Path) -> None:
    result = invoke("plan", LLAMA, "-g", "12GB", "-o", str(tmp_path / "no" / "such" / "dir" / "p.yaml"))
    assert result.exit_code == 2
    assert "No such file or directory" in result.stderr and "Traceback" not in result.output


# ---------------------------------------------------------------------------
# validate, show


def test_validate_a_spec_says_so_with_key_facts() -> None:
    result = invoke("validate", LLAMA)
    assert result.exit_code == 0, result.output
    assert "valid spec" in result.stdout and "llama-3-8b" in result.stdout and "35 layers" in result.stdout


def test_validate_a_plan_says_so_with_key_facts(tmp_path: Path) -> None:
    path = make_plan(tmp_path, "p.yaml", "-g", "12GB")
    result = invoke("validate", str(path))
    assert result.exit_code == 0, result.output
    plan = plan_of(path.read_text())
    assert "valid plan" in result.stdout
    assert f"{plan.summary.offloaded_layers} of 35 layers offloaded" in result.stdout


def test_show_table_lists_every_layer_and_totals(tmp_path: Path) -> None:
    path = make_plan(tmp_path, "p.yaml", "-g", "12GB", "--backend", "prefetch")
    plan = plan_of(path.read_text())
    result = invoke("show", str(path))
    assert result.exit_code == 0, result.output
    for layer in plan.layers:
        assert layer.name in result.stdout
    assert f"35 layers, {plan.summary.offloaded_layers} offloaded" in result.stdout
    assert "slot" in result.stdout and "copy before" in result.stdout  # a prefetch plan
    assert "peak GPU" in result.stdout


def test_show_json_rows_add_up_to_the_summary(tmp_path: Path) -> None:
    path = make_plan(tmp_path, "p.yaml", "-g", "12GB", "--backend", "prefetch")
    plan = plan_of(path.read_text())
    result = invoke("show", str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["name"] for r in data["layers"]] == [layer.name for layer in plan.layers]
    assert data["totals"]["resident_bytes"] == plan.summary.resident_bytes
    assert data["totals"]["offloaded_bytes"] == plan.summary.offloaded_bytes
    offloaded = [r for r in data["layers"] if r["offloaded"]]
    assert offloaded and all(r["slot"] is not None and r["copy_before"] for r in offloaded)


def test_show_a_uva_plan_has_no_slot_column(tmp_path: Path) -> None:
    path = tmp_path / "tiny.plan.yaml"
    path.write_text(yaml.safe_dump(tiny_plan((1, 3))))
    result = invoke("show", str(path))
    assert result.exit_code == 0, result.output
    assert "blocks.3" in result.stdout and "mlp.w1, mlp.w2" in result.stdout
    assert "copy before" not in result.stdout


# ---------------------------------------------------------------------------
# diff


def test_diff_of_equal_plans_exits_0(tmp_path: Path) -> None:
    a = make_plan(tmp_path, "a.yaml", "-g", "12GB")
    b = make_plan(tmp_path, "b.json", "-g", "12GB", "--format", "json")
    result = invoke("diff", str(a), str(b))
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_diff_of_different_plans_exits_1(tmp_path: Path, fmt: str) -> None:
    a = make_plan(tmp_path, "a.yaml", "-g", "12GB")
    b = make_plan(tmp_path, "b.yaml", "-g", "14GB")
    result = invoke("diff", str(a), str(b), "--format", fmt)
    assert result.exit_code == 1, result.output
    assert result.stdout.strip()
    if fmt == "json":
        json.loads(result.stdout)


def test_diff_markdown_names_the_layers_that_moved(tmp_path: Path) -> None:
    a = make_plan(tmp_path, "a.yaml", "-g", "12GB", "--backend", "prefetch")
    b = make_plan(tmp_path, "b.yaml", "-g", "14GB", "--backend", "prefetch")
    old, new = plan_of(a.read_text()), plan_of(b.read_text())
    moved = {layer.name for layer in old.layers if layer.offloaded} ^ {
        layer.name for layer in new.layers if layer.offloaded}
    assert moved
    result = invoke("diff", str(a), str(b), "--format", "markdown")
    assert "|" in result.stdout  # a markdown table
    assert any(name in result.stdout for name in moved)


# ---------------------------------------------------------------------------
# schema, version, start-up


def test_schema_spec_is_a_json_schema_that_the_example_satisfies(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    result = invoke("schema", "spec")
    assert result.exit_code == 0, result.output
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load(Path(LLAMA).read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"model": {"name": "x", "dtype": "bf16", "layers": []}, "memry": {}}, schema)


def test_schema_plan_to_a_file_validates_a_plan(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "plan.schema.json"
    assert invoke("schema", "plan", "-o", str(out)).exit_code == 0
    schema = json.loads(out.read_text())
    plan = make_plan(tmp_path, "p.yaml", "-g", "12GB")
    jsonschema.validate(yaml.safe_load(plan.read_text()), schema)


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("planner ") and result.stdout.split()[1][0].isdigit()


def test_help_teaches_with_examples() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for word in ("plan", "validate", "show", "diff", "schema", "Examples", "Exit codes"):
        assert word in result.stdout
    assert "planner plan" in invoke("plan", "--help").stdout


def test_cli_start_up_imports_no_heavy_modules() -> None:
    code = ("import sys, planner.cli.app; "
            "print(sorted(m for m in ('torch', 'networkx', 'pydantic', 'planner.build') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


def test_console_entry_point_runs_as_a_process() -> None:
    proc = subprocess.run([sys.executable, "-m", "planner.cli.app", "validate", LLAMA],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "valid spec" in proc.stdout
