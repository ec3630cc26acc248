"""Predictions by execution mode (issue 17): eager counts the CPU's issue time, CUDA graph replay does not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import planner
from planner.cli.app import ExecMode, app
from planner.cost.layer import layer_work, profile_for
from planner.cost.predict import predict
from schemas import load_spec
from schemas.hardware import load_hardware
from schemas.io import dump_model
from schemas.workload import MODES, Workload, WorkloadItem

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "examples" / "llama-3-8b.yaml"
MOE = ROOT / "examples" / "generated" / "qwen3-30b-a3b.yaml"
GB = 10**9


def test_cli_choices_are_the_schema_modes():
    assert tuple(m.value for m in ExecMode) == MODES


def test_graph_profile_has_no_cpu_cost_and_keeps_the_rest():
    hw = load_hardware("h200")
    g = profile_for(hw, "graph")
    assert (g.launch_us, g.block_cpu_us, g.moe_block_cpu_us, g.expert_cpu_us, g.moe_sync) == (0, 0, 0, 0, False)
    assert profile_for(hw.model_copy(update={"model_cpu_us": 2000.0}), "graph").model_cpu_us == 0
    assert (g.h2d_gbps, g.uva_gbps, g.matmul_tflops, g.name) == (hw.h2d_gbps, hw.uva_gbps, hw.matmul_tflops, hw.name)
    assert profile_for(hw, "eager") is hw


def test_graph_replay_pays_no_fixed_time_per_uva_matmul():
    """A UVA matmul's fixed time (``uva_call_ms``, ``uva_expert_call_ms``, measured on eager calls) is not paid in
    graph replay (two H200 runs matched far more graph-replayed plans without it): the MoE's decode with its
    experts on UVA is predicted faster in graph mode by at least those fixed times; an eager call launched pays them,
    one replayed from its layer graph does not."""
    hw = load_hardware("h200").model_copy(update={"uva_call_ms": 0.1, "uva_expert_call_ms": 0.2})
    g = profile_for(hw, "graph")
    assert (g.uva_call_ms, g.uva_expert_call_ms) == (0, 0) and profile_for(hw, "eager").uva_expert_call_ms == 0.2
    plan = planner.plan(load_spec(MOE), gpu_budget=12 * GB, backend="uva")
    uva_layers = sum(1 for layer in plan.layers if any("experts" in p for p in layer.uva))
    assert uva_layers > 0
    work = Workload({"graph": WorkloadItem(tokens=1, mode="graph")})
    graph_ms = predict(plan, hw, work).workloads[0].step_ms
    with_fixed = predict(plan, hw.model_copy(update={"uva_expert_call_ms": 0.0, "uva_call_ms": 0.0}), work)
    assert graph_ms == with_fixed.workloads[0].step_ms  # the fixed times are gone in replay, whatever the profile
    layer = next(layer for layer in plan.layers if any("experts" in p for p in layer.uva))
    routed = [p for p in layer.uva if "experts" in p]
    launched = layer_work(layer, 1, profile_for(hw, "eager"), graphs=False).gpu_ms
    assert launched - layer_work(layer, 1, g).gpu_ms == pytest.approx(0.2 * len(routed))  # a launched call pays them
    # an eager call replayed from its layer graph does not either
    assert layer_work(layer, 1, profile_for(hw, "eager")).gpu_ms == pytest.approx(layer_work(layer, 1, g).gpu_ms)


@pytest.mark.parametrize("spec_path,budget", [(LLAMA, 8 * GB), (LLAMA, 15 * GB), (MOE, 12 * GB)])
def test_graph_step_never_exceeds_eager_and_has_no_cpu_time(spec_path, budget):
    if not spec_path.exists():
        pytest.skip(f"{spec_path.name} not bundled")
    spec = load_spec(spec_path)
    plan = planner.plan(spec, gpu_budget=budget)
    hw = load_hardware("h200")
    both = Workload({"eager": WorkloadItem(tokens=1), "graph": WorkloadItem(tokens=1, mode="graph"),
                     "prefill": WorkloadItem(tokens=2048, mode="graph")})
    rows = {p.workload: p for p in predict(plan, hw, both).workloads}
    assert rows["graph"].cpu_ms == 0 and rows["prefill"].cpu_ms == 0 and rows["eager"].cpu_ms > 0
    assert rows["graph"].step_ms <= rows["eager"].step_ms
    assert rows["graph"].mode == "graph" and rows["eager"].mode == "eager"


def test_eager_plans_are_written_as_before_and_graph_plans_say_so(llama8b):
    eager = dump_model(planner.plan(llama8b, gpu_budget=8 * GB))
    assert "mode:" not in eager  # the default is not written: plans made before modes existed are unchanged
    graph = planner.plan(llama8b, gpu_budget=8 * GB, workload=Workload({"decode": WorkloadItem(tokens=1, mode="graph")}))
    row = yaml.safe_load(dump_model(graph))["predictions"]["workloads"][0]
    assert row["mode"] == "graph" and row["cpu_ms"] == 0


def test_auto_chooses_by_the_mode_it_is_asked_for(llama8b):
    """Same budget, same workload tokens: the chosen plan's prediction in each mode is the best auto found for it;
    the graph-mode prediction of the graph plan is no slower than the graph-mode prediction of the eager plan."""
    hw = load_hardware("h200")
    graph_w = Workload({"decode": WorkloadItem(tokens=1, mode="graph")})
    p_eager = planner.plan(llama8b, gpu_budget=6 * GB)
    p_graph = planner.plan(llama8b, gpu_budget=6 * GB, workload=graph_w)
    assert predict(p_graph, hw, graph_w).weighted_step_ms <= predict(p_eager, hw, graph_w).weighted_step_ms + 1e-9


def test_cli_mode_applies_to_every_workload(tmp_path):
    out = tmp_path / "p.yaml"
    result = CliRunner().invoke(app, ["plan", str(LLAMA), "-g", "8GB", "-w", "decode", "-w", "prefill=512",
                                      "--mode", "graph", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = yaml.safe_load(out.read_text())["predictions"]["workloads"]
    assert [r["mode"] for r in rows] == ["graph", "graph"] and all(r["cpu_ms"] == 0 for r in rows)


def test_cli_mode_alone_uses_the_default_workload(tmp_path):
    out = tmp_path / "p.yaml"
    result = CliRunner().invoke(app, ["plan", str(LLAMA), "-g", "8GB", "--mode", "graph", "-o", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = yaml.safe_load(out.read_text())["predictions"]["workloads"]
    assert (row["workload"], row["tokens"], row["mode"]) == ("decode", 1, "graph")


def test_bad_mode_is_refused_with_the_choices():
    result = CliRunner().invoke(app, ["plan", str(LLAMA), "-g", "8GB", "--mode", "replay"])
    assert result.exit_code == 2 and "eager" in result.output and "graph" in result.output


def test_spec_workload_mode_is_read_and_checked(tmp_path):
    text = LLAMA.read_text() + "\nworkload:\n  decode: {tokens: 1, mode: graph}\n"
    good = tmp_path / "good.yaml"
    good.write_text(text)
    result = CliRunner().invoke(app, ["plan", str(good), "-g", "8GB"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["predictions"]["workloads"][0]["mode"] == "graph"
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("mode: graph", "mode: graphs"))
    result = CliRunner().invoke(app, ["plan", str(bad), "-g", "8GB"])
    assert result.exit_code == 2 and "bad.yaml" in result.output and "mode" in result.output


def test_show_prints_the_mode_only_when_a_workload_is_not_eager(tmp_path):
    graph, eager = tmp_path / "g.yaml", tmp_path / "e.yaml"
    runner = CliRunner()
    assert runner.invoke(app, ["plan", str(LLAMA), "-g", "8GB", "-w", "decode", "-w", "prefill", "--mode", "graph",
                               "-o", str(graph)]).exit_code == 0
    assert runner.invoke(app, ["plan", str(LLAMA), "-g", "8GB", "-o", str(eager)]).exit_code == 0
    shown = runner.invoke(app, ["show", str(graph)], terminal_width=200)
    assert shown.exit_code == 0 and re.search(r"\bmode\b", shown.output) and shown.output.count("graph") >= 2
    assert not re.search(r"\bmode\b", runner.invoke(app, ["show", str(eager)], terminal_width=200).output)
