"""`planner explain`: the prediction next to the runtime's per-layer stats (hand-written and from a CPU run)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from cli_samples import invoke

import planner
from planner.cli.explain import explain
from planner.cost.predict import timeline
from planner.cost.predicted import chosen_profile
from schemas.errors import InputError
from schemas.io import dump_model
from schemas.measured import MeasuredStats

ROOT = Path(__file__).resolve().parent.parent
GB = 10**9


@pytest.fixture(scope="module")
def plan(llama8b):
    return planner.plan(llama8b, gpu_budget=12 * GB, backend="prefetch")


def _write_plan(tmp_path: Path, plan) -> str:
    path = tmp_path / "plan.yaml"
    path.write_text(dump_model(plan))
    return str(path)


def _stats(plan, slow_layer: str, stall_ms: float, step_ms: float | None = 50.0) -> dict:
    """Two forwards measured exactly as predicted, except one layer's copy takes 3x and stalls."""
    hw = chosen_profile(plan, None)
    t = timeline(plan, hw, 1)
    from planner.cost.layer import layer_work

    layers = []
    for layer, lt in zip(plan.layers, t.layers):
        if layer.prefetch is None:
            continue
        work = layer_work(layer, 1, hw)
        slow = layer.name == slow_layer
        layers.append({"name": layer.name, "bytes": work.copy_bytes,
                       "copy_ms": work.copy_ms * (3 if slow else 1),
                       "stall_ms": lt.stall + (stall_ms if slow else 0.0)})
    forward = {"bytes_copied": sum(r["bytes"] for r in layers), "copy_ms": sum(r["copy_ms"] for r in layers),
               "stall_ms": sum(r["stall_ms"] for r in layers), "copy_gbps": 50.0, "late_copies": 0,
               "step_ms": step_ms, "layers": layers}
    return {"backend": "prefetch", "forwards": [forward, copy.deepcopy(forward)], "pinned_host_bytes": 0}


def test_the_largest_miss_comes_first_with_its_ratio(plan, tmp_path):
    slow = next(layer.name for layer in plan.layers if layer.prefetch is not None and
                not layer.prefetch.previous_forward)
    stats = MeasuredStats.model_validate(_stats(plan, slow, stall_ms=40.0))
    e = explain(plan, stats, chosen_profile(plan, None), "decode", 1)
    misses = e.misses()
    assert [m.layer for m in misses] == [slow, slow]  # every other layer was measured as predicted
    assert misses[0].figure.what == "stall ms" and misses[0].figure.miss == pytest.approx(40.0)
    assert misses[1].figure.what == "copy ms" and misses[1].figure.ratio == pytest.approx(3.0)
    step = e.totals[0]
    assert step.what == "step ms" and step.measured == 50.0
    assert step.predicted == pytest.approx(plan.predictions.workloads[0].step_ms, abs=1e-3)
    assert {row.name for row in e.layers} == {layer.name for layer in plan.layers if layer.prefetch is not None}

    path = tmp_path / "stats.json"
    path.write_text(json.dumps(_stats(plan, slow, stall_ms=40.0)))
    text = invoke("explain", _write_plan(tmp_path, plan), "--measured", str(path))
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    first = lines[lines.index("largest misses:") + 1]
    assert first.startswith(f"  {slow} stall:") and "+40.000 ms" in first
    assert "x3.00" in lines[lines.index("largest misses:") + 2]
    data = json.loads(invoke("explain", _write_plan(tmp_path, plan), "-m", str(path), "-f", "json").stdout)
    assert data["misses"][0]["layer"] == slow and data["misses"][0]["miss"] == pytest.approx(40.0)
    assert data["totals"][0]["measured"] == 50.0


def test_missing_times_are_not_measured_not_misses(plan):
    data = _stats(plan, "", 0.0, step_ms=None)
    for f in data["forwards"]:
        f["copy_ms"] = f["stall_ms"] = f["copy_gbps"] = None
        for row in f["layers"]:
            del row["copy_ms"], row["stall_ms"]
    e = explain(plan, MeasuredStats.model_validate(data), chosen_profile(plan, None), "decode", 1)
    assert e.misses() == []
    assert all(row.copy_ms.measured is None and row.stall_ms.measured is None for row in e.layers)
    assert all(row.bytes.measured == row.bytes.predicted for row in e.layers)
    assert any("no copy or stall was timed" in n for n in e.notes)
    assert any("no measured step time" in n for n in e.notes)


def test_explain_a_cpu_run_of_a_prefetch_plan(tmp_path):
    torch = pytest.importorskip("torch")
    import runtime
    from models import LlamaConfig, make_llama

    model = make_llama(LlamaConfig(vocab=256, dim=64, layers=6, heads=4, kv_heads=2, hidden=160))
    plan = planner.plan(runtime.describe(model, name="tiny"), strategy="group", group_size=2, num_in_group=1,
                        prefetch_step=1, backend="prefetch")
    ids = torch.randint(0, 250, (1, 4), generator=torch.Generator().manual_seed(0))
    with runtime.apply(plan, model, device="cpu", stats=True) as h:
        for _ in range(3):
            model(ids)
        stats = h.stats()
    measured = MeasuredStats.model_validate(stats)  # the runtime writes the documented format
    prefetched = [layer for layer in plan.layers if layer.prefetch is not None]
    last = measured.forwards[-1]
    assert [row.name for row in last.layers] != [] and \
        {row.name for row in last.layers} == {layer.name for layer in prefetched}
    assert all(row.copy_ms is None and row.stall_ms is None for row in last.layers)  # no CUDA events on the CPU
    assert sum(row.bytes for row in last.layers) == last.bytes_copied == plan.summary.offloaded_bytes

    path = tmp_path / "stats.json"
    path.write_text(json.dumps(stats))
    result = invoke("explain", _write_plan(tmp_path, plan), "--measured", str(path))
    assert result.exit_code == 0, result.output
    assert "median of 2 of 3 forwards (the first left out: warm-up)" in result.output
    for layer in prefetched:
        row = next(line for line in result.output.splitlines() if line.startswith(layer.name + " "))
        assert f" {layer.offloaded_bytes} " in row and " - " in row  # bytes compared, times not measured
    assert "largest misses" not in result.output and "note: no copy or stall was timed" in result.output


def test_stats_from_another_plan_are_bad_input(plan, tmp_path):
    data = _stats(plan, "", 0.0)
    resident = next(layer.name for layer in plan.layers if layer.prefetch is None)
    data["forwards"][1]["layers"][0]["name"] = resident
    data["forwards"][1]["layers"][1]["name"] = "model.layers.99"
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(data))
    result = invoke("explain", _write_plan(tmp_path, plan), "--measured", str(path))
    assert result.exit_code == 2
    assert f"forwards[1].layers[0].name: layer '{resident}' is not prefetched in the plan" in result.output
    assert "forwards[1].layers[1].name: layer 'model.layers.99' is not in the plan" in result.output


def test_other_byte_counts_are_bad_input(plan):
    data = _stats(plan, "", 0.0)
    for f in data["forwards"]:
        for row in f["layers"]:
            row["bytes"] += 2
        f["bytes_copied"] += 2 * len(f["layers"])
    with pytest.raises(InputError) as info:
        explain(plan, MeasuredStats.model_validate(data), chosen_profile(plan, None), "decode", 1)
    first = data["forwards"][0]["layers"][0]
    assert f"forwards[0].layers[0].bytes: expected the plan's {first['bytes'] - 2} bytes" in str(info.value)
    assert "another plan" in str(info.value)


def test_a_stats_file_with_host_levels_and_layer_graphs_is_explained(plan, tmp_path):
    """Handle.stats() of a plan with host experts and layer graphs carries ``host_levels`` and ``expert_graphs``:
    a STATS.json written from it is read as the other keys are (a bad figure in them named like any other)."""
    slow = next(layer.name for layer in plan.layers if layer.prefetch is not None)
    data = {**_stats(plan, slow, stall_ms=0.0),
            "host_levels": {"model.layers.0": {"planned": 50, "now": 54, "moved_calls": 0, "all_uva_calls": 0,
                                               "more_calls": 12, "gpu_ms": 11.4, "host_ms": 10.9, "handoff_ms": 0.07}},
            "expert_graphs": {"layers": 24, "graphs": 8, "failed": 0, "bytes": 264704, "pool_bytes": 6291456}}
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(data))
    assert invoke("explain", _write_plan(tmp_path, plan), "--measured", str(path)).exit_code == 0
    e = explain(plan, MeasuredStats.model_validate(data), chosen_profile(plan, None), "decode", 1)
    graphs = [c for c in e.memory if c.what.strip() == "layer graphs"]
    assert not graphs  # a dense plan counts none, so lists none; an MoE plan's row gets the stats' bytes:
    moe = plan.model_copy(update={"memory": plan.memory.model_copy(update={"graph_bytes": 2**25})})
    row = next(c for c in explain(moe, MeasuredStats.model_validate(data), chosen_profile(plan, None), "decode",
                                  1).memory if c.what.strip() == "layer graphs")
    assert (row.predicted, row.measured) == (2**25, 264704 + 6291456)
    data["expert_graphs"]["pool_bytes"] = -1
    path.write_text(json.dumps(data))
    bad = invoke("explain", _write_plan(tmp_path, plan), "--measured", str(path))
    assert bad.exit_code == 2 and "expert_graphs.pool_bytes" in bad.output
