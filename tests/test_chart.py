"""`planner show --chart`: the figure holds what the plan and its predicted forward say, written as PNG/SVG."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_samples import invoke

import planner
from planner.cli.chart import chart
from planner.cost.predict import timeline
from planner.cost.predicted import chosen_profile
from schemas.io import dump_model

pytest.importorskip("matplotlib")

GB = 10**9


@pytest.fixture(scope="module", params=["prefetch", "uva"])
def plan(request, llama8b):
    return planner.plan(llama8b, gpu_budget=12 * GB, backend=request.param)


def test_the_figure_draws_every_layer_copy_and_stall(plan):
    hw = chosen_profile(plan, None)
    drawn = chart(plan, hw, "decode", 1)
    t = timeline(plan, hw, 1)
    n = len(plan.layers)
    assert len(drawn.resident.patches) == len(drawn.offloaded.patches) == len(drawn.compute.patches) == n
    heights = [p.get_height() for p in drawn.offloaded.patches]
    assert [h > 0 for h in heights] == [bool(layer.offloaded) for layer in plan.layers]
    prefetched = [layer for layer in plan.layers if layer.prefetch is not None]
    assert len(drawn.copy.patches) == len(prefetched)
    assert len(drawn.stall.patches) == sum(1 for lt in t.layers if lt.stall > 0)
    if plan.summary.backend == "prefetch":
        assert prefetched and len(drawn.stall.patches) > 0  # at 12 GB llama-3-8b waits for its copies
    else:
        assert not prefetched and len(drawn.stall.patches) == 0
    assert drawn.cpu.get_xdata()[-1] == pytest.approx(t.cpu_ms)
    ends = [p.get_x() + p.get_width() for p in drawn.compute.patches]
    assert max(ends) == pytest.approx(max(lt.end for lt in t.layers))


@pytest.mark.parametrize("suffix, signature", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml")])
def test_show_writes_the_chart(plan, tmp_path: Path, suffix: str, signature: bytes):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(dump_model(plan))
    out = tmp_path / f"chart{suffix}"
    result = invoke("show", str(plan_file), "--chart", str(out), "--workload", "prefill=512")
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data.startswith(signature)
    if suffix == ".svg":
        assert b"<svg" in data[:400] and data.rstrip().endswith(b"</svg>")
        assert b"prefill (512 tokens)" in data  # the chosen workload is the one drawn
    assert "prefill" in result.output and f"chart written to {out}" in result.output


def test_bad_chart_paths_exit_2(tmp_path: Path, llama8b):
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(dump_model(planner.plan(llama8b, gpu_budget=12 * GB)))
    bad = invoke("show", str(plan_file), "--chart", str(tmp_path / "chart.jpg"))
    assert bad.exit_code == 2 and "expected one of .png, .svg, .pdf" in bad.output
    missing = invoke("show", str(plan_file), "--chart", str(tmp_path / "no" / "such" / "chart.png"))
    assert missing.exit_code == 2 and "Traceback" not in missing.output
    assert not (tmp_path / "chart.jpg").exists()


def test_without_matplotlib_the_chart_is_bad_input(tmp_path: Path, llama8b, monkeypatch):
    import sys

    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(dump_model(planner.plan(llama8b, gpu_budget=12 * GB)))
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    result = invoke("show", str(plan_file), "--chart", str(tmp_path / "c.png"))
    assert result.exit_code == 2 and "pip install 'offload-planner[chart]'" in result.output
    assert not (tmp_path / "c.png").exists()
