import json

import pytest

import planner
from planner.diff import BYTE_FIELDS, diff_plans, render_diff

GB = 10**9


@pytest.fixture(scope="module")
def plans(llama8b):
    return planner.plan(llama8b), planner.plan(llama8b, gpu_budget=10 * GB)


def test_equal_plans_have_no_changes(llama8b, plans):
    d = diff_plans(plans[0], planner.plan(llama8b))
    assert not d.changed and not d.to_host and not d.to_gpu and not d.settings
    assert [m.field for m in d.memory] == list(BYTE_FIELDS) and all(m.delta == 0 for m in d.memory)
    assert render_diff(d, "text") == "plans are equal\n"
    assert json.loads(render_diff(d, "json"))["changed"] is False


def test_moves_and_memory_deltas(plans):
    old, new = plans
    d = diff_plans(old, new)
    assert d.changed
    was = {layer.name for layer in old.layers if layer.offloaded}
    now = {layer.name for layer in new.layers if layer.offloaded}
    assert set(d.to_host) == now - was and set(d.to_gpu) == was - now
    assert all(params == ["mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
               for params in d.to_host.values())
    deltas = {m.field: m.delta for m in d.memory}
    assert deltas["gpu_budget_bytes"] == -2 * GB
    assert deltas["offloaded_bytes"] == new.summary.offloaded_bytes - old.summary.offloaded_bytes
    assert deltas["pinned_host_bytes"] == deltas["offloaded_bytes"] == -deltas["resident_bytes"]
    moved_slots = {p.layer for p in d.prefetch}
    assert (now ^ was) <= moved_slots


def test_settings_changes(llama8b, plans):
    uva = planner.plan(llama8b, backend="uva")
    d = diff_plans(plans[0], uva)
    assert {(c.field, c.old, c.new) for c in d.settings} == {("backend", "prefetch", "uva"),
                                                             ("prefetch_step", 2, None)}
    assert all(p.new is None for p in d.prefetch)


def test_renderings(plans):
    d = diff_plans(*plans)
    md = render_diff(d, "markdown")
    assert "| memory | old | new | delta |" in md
    assert "| peak_gpu_bytes |" in md and "`mlp.*` → host" in md
    moved = sorted(int(n.rsplit(".", 1)[1]) for n in d.to_host)
    line = next(line for line in md.splitlines() if line.startswith("- `model.layers.{"))
    listed = line.split("{")[1].split("}")[0].split(",")
    assert [int(x) for x in listed] == moved  # every moved layer named, exactly
    assert line.endswith("`mlp.*` → host")
    text = render_diff(d, "text")
    assert "moved GPU -> host:" in text and "peak_gpu_bytes:" in text
    data = json.loads(render_diff(d, "json"))
    assert data["changed"] is True and data["to_host"] == d.to_host
    assert {row["field"]: row["delta"] for row in data["memory"]}["gpu_budget_bytes"] == -2 * GB
    with pytest.raises(ValueError):
        render_diff(d, "html")


def test_partial_moves_are_not_collapsed(llama8b):
    old = planner.plan(llama8b, strategy="group", group_size=2, gpu_budget=100 * GB)
    new = planner.plan(llama8b, strategy="group", group_size=2, gpu_budget=100 * GB,
                       params=["mlp.up_proj", "mlp.down_proj", "self_attn"])
    d = diff_plans(old, new)
    assert d.to_gpu == {f"model.layers.{i}": ["mlp.gate_proj.weight"] for i in range(1, 32, 2)}
    assert set(d.to_host) == {f"model.layers.{i}" for i in range(1, 32, 2)}
    md = render_diff(d, "markdown")
    assert "- `model.layers.{1,3,5,7,9,11,13,15,17,19,21,23,25,27,29,31}`: `mlp.gate_proj.weight` → GPU" in md
    assert "`self_attn.*` → host" in md


def test_time_deltas_agree_in_text_markdown_and_json(plans):
    import re

    old, new = plans
    d = diff_plans(old, new)
    (t,) = d.time
    assert (t.old_ms, t.new_ms) == (old.predictions.workloads[0].step_ms, new.predictions.workloads[0].step_ms)
    assert t.new_ms > t.old_ms  # less on the GPU: more to copy each forward
    data = json.loads(render_diff(d, "json"))
    assert data["hardware"] == "h200" and data["time_note"] is None
    (row,) = data["time"]
    assert (row["workload"], row["old_ms"], row["new_ms"]) == ("decode", t.old_ms, t.new_ms)
    assert row["ratio"] == pytest.approx(t.new_ms / t.old_ms, abs=1e-4)
    text = render_diff(d, "text")
    m = re.search(r"predicted step, decode \(1 token\) on h200: ([\d.]+) ms -> ([\d.]+) ms \(x([\d.]+)\)", text)
    md = render_diff(d, "markdown")
    n = re.search(r"\| decode \| 1 \| ([\d.]+) \| ([\d.]+) \| x([\d.]+) \|", md)
    assert m and n and m.groups() == n.groups()
    assert [float(x) for x in m.groups()] == pytest.approx([t.old_ms, t.new_ms, row["ratio"]], abs=5e-3)
    assert "| predicted step on h200 | tokens | old ms | new ms | ratio |" in md


def test_plans_predicted_differently_are_not_compared(llama8b, plans):
    from schemas.hardware import load_hardware
    from schemas.workload import Workload, WorkloadItem

    old = plans[0]
    other_hw = planner.plan(llama8b, hardware=load_hardware("h200").model_copy(update={"name": "other"}))
    d = diff_plans(old, other_hw)
    assert d.time == [] and "predicted on 'h200', the new one on 'other'" in d.time_note
    assert d.changed  # the plans differ in what they were predicted with
    for fmt in ("text", "markdown"):
        out = render_diff(d, fmt)
        assert d.time_note in out and "ms ->" not in out and "old ms" not in out
    assert json.loads(render_diff(d, "json"))["time"] == []
    prefill = planner.plan(llama8b, workload=Workload({"prefill": WorkloadItem(tokens=2048)}))
    d = diff_plans(old, prefill)
    assert d.time == [] and "different workloads (old: decode=1; new: prefill=2048)" in d.time_note
    bare = old.model_copy(update={"predictions": None})
    d = diff_plans(bare, old)
    assert d.time == [] and "the old plan has no predictions" in d.time_note
