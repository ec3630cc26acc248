import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import planner
from planner.review.diff import BYTE_FIELDS, GPU, MEMORY_FIELDS, PREFETCH, UVA, diff_plans
from planner.review.diff_render import SCHEDULE_SHOWN, render_diff
from schemas import load_spec
from schemas.io import dump_model

GB = 10**9
LLAMA = Path(__file__).resolve().parent.parent / "examples" / "llama-3-8b.yaml"


@pytest.fixture(scope="module")
def llama8b(llama8b):
    """The Llama-3-8B example on the prefetch backend: diffs of prefetch plans (slots, schedules) by default."""
    return llama8b.model_copy(update={"offload": llama8b.offload.model_copy(update={"backend": "prefetch"})})


@pytest.fixture(scope="module")
def plans(llama8b):
    return planner.plan(llama8b), planner.plan(llama8b, gpu_budget=10 * GB)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Llama-3-8B changed: another name, a wider up_proj, 34 blocks, a final norm with a bias."""
    text = (LLAMA.read_text().replace("name: llama-3-8b", "name: llama-3-8b-wide")
            .replace("mlp.up_proj.weight: [14336, 4096]", "mlp.up_proj.weight: [16384, 4096]")
            .replace("repeat: 32", "repeat: 34")
            .replace("- name: model.norm\n      params: {weight: [4096]}",
                     "- name: model.final_norm\n      params: {weight: [4096], bias: [4096]}"))
    path = tmp_path_factory.mktemp("wide") / "wide.yaml"
    path.write_text(text)
    return load_spec(path)


def _with_uva(plan, uva: dict[str, list[str]]):
    """``plan`` with per-layer ``uva`` lists, as plans carry them once mixed placement lands."""
    layers = [layer.model_copy(update={"uva": uva[layer.name]}) if layer.name in uva else layer
              for layer in plan.layers]
    return plan.model_copy(update={"layers": layers})


# ---------------------------------------------------------------------------
# Deciding


def test_equal_plans_have_no_changes(llama8b, plans):
    d = diff_plans(plans[0], planner.plan(llama8b))
    assert not d.changed and not d.moves and not d.settings and not d.schedule and not d.model.changed
    assert [m.field for m in d.memory] == [*BYTE_FIELDS, *MEMORY_FIELDS] and all(m.delta == 0 for m in d.memory)
    assert render_diff(d, "text") == render_diff(d, "markdown") == "no changes\n"
    assert json.loads(render_diff(d, "json"))["changed"] is False


def test_identical_plan_files_exit_0_with_one_line(tmp_path, plans):
    from planner.cli.app import app

    a, b = tmp_path / "a.plan.yaml", tmp_path / "b.plan.yaml"
    for path in (a, b):
        path.write_text(dump_model(plans[0]))
    for fmt in ("text", "markdown"):
        result = CliRunner().invoke(app, ["diff", str(a), str(b), "--format", fmt])
        assert result.exit_code == 0 and result.stdout == "no changes\n", result.output
    c = tmp_path / "c.plan.yaml"
    c.write_text(dump_model(plans[1]))
    assert CliRunner().invoke(app, ["diff", str(a), str(c)]).exit_code == 1
    assert CliRunner().invoke(app, ["diff", str(a), str(LLAMA)]).exit_code == 2


def test_moves_and_memory_deltas(plans):
    old, new = plans
    d = diff_plans(old, new)
    assert d.changed
    was = {layer.name for layer in old.layers if layer.offloaded}
    now = {layer.name for layer in new.layers if layer.offloaded}
    assert set(d.to_host) == now - was and set(d.to_gpu) == was - now
    assert was < now  # a smaller budget offloads more and brings nothing back (the budget strategy is stable)
    mlp = ["mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
    assert all(params == mlp for params in d.to_host.values())
    assert [(g.old, g.new, g.params_text) for g in d.moves] == [(GPU, PREFETCH, "mlp.*")]
    deltas = {m.field: m.delta for m in d.memory}
    assert deltas["gpu_budget_bytes"] == -2 * GB
    assert deltas["offloaded_bytes"] == new.summary.offloaded_bytes - old.summary.offloaded_bytes
    assert deltas["pinned_host_bytes"] == deltas["offloaded_bytes"] == -deltas["resident_bytes"]
    c = d.churn
    assert (c.to_host, c.to_gpu) == (3 * len(now - was), 3 * len(was - now))
    assert c.to_host_bytes - c.to_gpu_bytes == deltas["offloaded_bytes"] == -c.net_gpu_bytes
    assert (now ^ was) <= {p.layer for p in d.schedule}
    assert d.offloaded_layers.old == len(was) and d.offloaded_layers.new == len(now)


def test_model_change_is_decided_and_listed_first(llama8b, wide):
    old, new = planner.plan(llama8b), planner.plan(wide)
    d = diff_plans(old, new)
    m = d.model
    assert [(c.field, c.old, c.new) for c in m.changes[::2]] == [("model", "llama-3-8b", "llama-3-8b-wide"),
                                                                 ("layers", 35, 37)]
    assert m.changes[1].field == "spec_sha256"
    assert m.layers_added == ["model.layers.32", "model.layers.33", "model.final_norm"]
    assert m.layers_removed == ["model.norm"] and m.layers_renamed == []  # its params differ: not a rename
    (g,) = m.params
    assert (g.what, g.params, g.old, g.new) == ("shape", ["mlp.up_proj.weight"], "[14336, 4096]", "[16384, 4096]")
    assert g.layers == [f"model.layers.{i}" for i in range(32)] and g.layers_text == "model.layers.{0..31}"
    text = render_diff(d, "text").splitlines()
    assert text[0].startswith("plan diff: ") and text[2] == "model:"
    assert text[3:9] == ["  model: llama-3-8b -> llama-3-8b-wide",
                         f"  spec_sha256: {old.summary.spec_sha256[:12]} -> {new.summary.spec_sha256[:12]}",
                         "  layers: 35 -> 37",
                         "  layers added: model.layers.{32,33}, model.final_norm",
                         "  layers removed: model.norm",
                         "  model.layers.{0..31}: mlp.up_proj.weight shape [14336, 4096] -> [16384, 4096]"]
    md = render_diff(d, "markdown").splitlines()
    assert [line for line in md if line.startswith("### ")][0] == "### Model"


def test_renamed_layers_keep_their_moves_and_schedule(llama8b, tmp_path):
    path = tmp_path / "renamed.yaml"
    path.write_text(LLAMA.read_text().replace("model.layers.{i}", "model.decoder.layers.{i}"))
    d = diff_plans(planner.plan(llama8b), planner.plan(load_spec(path), backend="prefetch"))
    assert d.model.layers_renamed == [(f"model.layers.{i}", f"model.decoder.layers.{i}") for i in range(32)]
    assert not d.model.layers_added and not d.model.layers_removed and not d.model.layer_order_changed
    assert not d.moves and not d.schedule  # the same params offloaded, the same slots and copy points
    text = render_diff(d, "text")
    assert "  layers renamed: model.layers.{0..31} -> model.decoder.layers.{0..31}\n" in text
    assert text.startswith("plan diff: no params moved\n")


def test_param_moves_are_named_with_old_and_new_placement(llama8b):
    old = planner.plan(llama8b, strategy="group", group_size=2, gpu_budget=100 * GB)
    new = planner.plan(llama8b, strategy="group", group_size=2, gpu_budget=100 * GB,
                       params=["mlp.up_proj", "mlp.down_proj", "self_attn"])
    d = diff_plans(old, new)
    odd = "model.layers.{1,3,5,7,9,11,13,15,17,19,21,23,25,27,29,31}"
    assert d.to_gpu == {f"model.layers.{i}": ["mlp.gate_proj.weight"] for i in range(1, 32, 2)}
    assert [(g.layers_text, g.params_text, g.old, g.new) for g in d.moves] == [
        (odd, "self_attn.*", GPU, PREFETCH), (odd, "mlp.gate_proj.weight", PREFETCH, GPU)]
    text = render_diff(d, "text")
    assert f"  {odd}: mlp.gate_proj.weight host (prefetch) -> GPU, " in text
    assert f"  {odd}: self_attn.* GPU -> host (prefetch), " in text
    md = render_diff(d, "markdown")
    assert f"| `{odd}` | `mlp.gate_proj.weight` | host (prefetch) | GPU |" in md


def test_many_moves_are_grouped_exactly(plans):
    d = diff_plans(*plans)
    text = render_diff(d, "text")
    lines = [line for line in text.splitlines() if " -> host (prefetch), " in line]
    assert len(lines) == 1  # one line for every layer that moved the same params the same way
    listed = sorted(int(x) for x in lines[0].split("{")[1].split("}")[0].split(","))
    assert listed == sorted(int(n.rsplit(".", 1)[1]) for n in d.to_host)
    assert lines[0].startswith("  model.layers.{") and ": mlp.* GPU -> host (prefetch), " in lines[0]


def test_uva_placements_and_moves_between_prefetch_and_uva(llama8b, plans):
    old = plans[0]
    offloaded = [layer for layer in old.layers if layer.offloaded]
    some = {layer.name: ["mlp.down_proj.weight"] for layer in offloaded[:3]}
    d = diff_plans(old, _with_uva(old, some))
    (g,) = d.moves
    assert (g.old, g.new, g.params, g.layers) == (PREFETCH, UVA, ["mlp.down_proj.weight"], list(some))
    assert (d.churn.to_host, d.churn.to_gpu, d.churn.between_host) == (0, 0, 3)
    text = render_diff(d, "text")
    assert "; 3 between prefetch and uva (" in text.splitlines()[0]
    assert ": mlp.down_proj.weight host (prefetch) -> host (uva), " in text
    back = diff_plans(_with_uva(old, some), old)
    assert [(g.old, g.new) for g in back.moves] == [(UVA, PREFETCH)]
    # without a uva list, a uva-backend plan reads every offloaded param through UVA
    d = diff_plans(old, planner.plan(llama8b, backend="uva"))
    assert {(g.old, g.new) for g in d.moves} <= {(PREFETCH, UVA), (GPU, UVA), (PREFETCH, GPU)}
    assert any((g.old, g.new) == (PREFETCH, UVA) for g in d.moves)


def test_settings_in_words(llama8b, plans):
    uva = planner.plan(llama8b, backend="uva")
    d = diff_plans(uva, planner.plan(llama8b, prefetch_step=2))
    assert {(c.field, c.old, c.new) for c in d.settings} == {("backend", "uva", "prefetch"),
                                                             ("prefetch_step", None, 2)}
    assert all(p.old is None and p.kind == "new" for p in d.schedule)
    text, md = render_diff(d, "text"), render_diff(d, "markdown")
    assert "\nsettings:\n  backend: uva -> prefetch\n  prefetch_step: none -> 2\n" in text
    assert "\n- prefetch_step: none → 2\n" in md
    assert "None" not in text and "None" not in md


def test_schedule_changes_are_summarized(plans):
    d = diff_plans(*plans)
    n = len(d.schedule)
    assert n > SCHEDULE_SHOWN
    counts = {k: sum(p.kind == k for p in d.schedule) for k in ("new", "dropped", "changed")}
    text = render_diff(d, "text").splitlines()
    i = next(i for i, line in enumerate(text) if line.startswith("schedule ("))
    assert text[i] == f"schedule ({n} layers changed: " + ", ".join(
        f"{v} {k}" for k, v in counts.items() if v) + "):"
    shown = text[i + 1:i + 1 + SCHEDULE_SHOWN]
    assert [line.split(":")[0].strip() for line in shown] == [p.layer for p in d.schedule[:SCHEDULE_SHOWN]]
    assert text[i + 1 + SCHEDULE_SHOWN] == f"  and {n - SCHEDULE_SHOWN} more"
    data = json.loads(render_diff(d, "json"))["schedule"]
    assert data["count"] == n and len(data["changes"]) == n and data["dropped"] == counts["dropped"]


# ---------------------------------------------------------------------------
# Text, markdown and json agree


def _sections(out: str, md: bool) -> list[tuple[str, list[str]]]:
    """(title, lines) per section; markdown lines put back into the text form."""
    lines = out.splitlines()
    head = lines[0] if not md else _from_markdown(lines[2].strip("*"))
    sections = [("", [head.removeprefix("plan diff: ")])]
    for line in lines[1:]:
        if md and line.startswith("### "):
            sections.append((line[4].lower() + line[5:], []))
        elif not md and line and not line.startswith(" "):
            sections.append((line.removesuffix(":"), []))
        elif md and sections[1:] and line and not line.startswith("|---"):
            sections[-1][1].append(_from_markdown(line))
        elif not md and line:
            sections[-1][1].append(line[2:])
    return [(title, [x for x in rows if x is not None]) for title, rows in sections]


def _from_markdown(line: str) -> str | None:
    line = line.replace("→", "->").replace("`", "")
    if not line.startswith("|"):
        return line.removeprefix("- ")
    cells = [c.strip() for c in line.strip("|").split("|")]
    if cells[0] in ("memory", "layers") or cells[0].startswith("predicted step on"):
        return None  # a header row
    if len(cells) == 4:  # memory
        return f"{cells[0]}: {cells[1]} -> {cells[2]} ({cells[3]})"
    if len(cells) == 5 and (cells[4].startswith("x") or cells[4] == "-"):  # predicted step time
        return ("step", cells[0], cells[1], cells[2], cells[3], cells[4])
    return f"{cells[0]}: {cells[1]} {cells[2]} -> {cells[3]}, {cells[4]}"  # a move


def _time_in_text(line: str):
    m = re.fullmatch(r"predicted step, (\w+) \((\d+) tokens?\) on \w+: ([\d.]+) ms -> ([\d.]+) ms \((\S+)\)", line)
    return ("step", *m.groups()) if m else line


def test_text_markdown_and_json_agree(llama8b, wide):
    d = diff_plans(planner.plan(llama8b), planner.plan(wide, prefetch_step=3, backend="prefetch"))
    text, md, data = render_diff(d, "text"), render_diff(d, "markdown"), json.loads(render_diff(d, "json"))
    ts, ms = _sections(text, md=False), _sections(md, md=True)
    ts = [(title, [_time_in_text(x) for x in rows]) for title, rows in ts]
    assert [title for title, _ in ts] == [title for title, _ in ms]
    churn = data["churn"]
    layers = {name for g in data["moves"] for name in g["layers"]}
    moved = f"moved ({churn['to_host'] + churn['to_gpu']} params in {len(layers)} layers)"
    assert [t for t, _ in ts][1:4] == ["model", "memory and predicted step time", moved]
    assert ts == ms
    # the facts against json
    sections = dict(ts)
    m = re.match(r"moved (\d+) params GPU -> host \(.+?\), (\d+) host -> GPU", sections[""][0])
    assert (int(m[1]), int(m[2])) == (churn["to_host"], churn["to_gpu"])
    memory = [(r["field"], r["old"], r["new"]) for r in data["memory"] if r["old"] != r["new"]]
    rows = [re.fullmatch(r"(\w+): .*\((\d+)\) -> .*\((\d+)\) \(.*\)", x) for x in sections[
        "memory and predicted step time"] if isinstance(x, str)]
    assert [(r[1], int(r[2]), int(r[3])) for r in rows] == memory
    (step,) = [x for x in sections["memory and predicted step time"] if isinstance(x, tuple)]
    assert step[1] == data["time"][0]["workload"] and float(step[4]) == pytest.approx(data["time"][0]["new_ms"],
                                                                                        abs=5e-4)
    moves = [re.fullmatch(r"(\S+): (.+) (GPU|host \(\w+\)) -> (GPU|host \(\w+\)), .+", x) for x in sections[moved][:-1]]
    assert [x.groups() for x in moves] == [(g["layers_text"], g["params_text"], g["old"], g["new"])
                                           for g in data["moves"]]
    assert sections["settings"] == [f"{c['field']}: {c['old']} -> {c['new']}" for c in data["settings"]]
    assert data["model"]["layers_added"] == ["model.layers.32", "model.layers.33", "model.final_norm"]
    (title,) = [t for t in sections if t.startswith("schedule")]
    assert f"({data['schedule']['count']} layers changed" in title
    assert [x.split(":")[0] for x in sections[title][:SCHEDULE_SHOWN]] == [
        c["layer"] for c in data["schedule"]["changes"][:SCHEDULE_SHOWN]]
    assert [x for x in sections["other"] if x.startswith("buffer_pool")]
    with pytest.raises(ValueError):
        render_diff(d, "html")


def test_time_deltas_agree_in_text_markdown_and_json(plans):
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


def test_what_nothing_else_compares_is_named_by_field(plans):
    old = plans[0]
    reworded = old.model_copy(update={"summary": old.summary.model_copy(update={"backend_reason": "chosen by hand"})})
    d = diff_plans(old, reworded)
    assert d.changed and [(c.field, c.new) for c in d.other] == [("summary.backend_reason", "chosen by hand")]
    assert "  summary.backend_reason: " in render_diff(d, "text")


def test_a_dtype_change_is_one_line_per_kind_of_layer(llama8b, tmp_path):
    path = tmp_path / "f16.yaml"
    path.write_text(LLAMA.read_text().replace("dtype: bfloat16", "dtype: float16"))
    d = diff_plans(planner.plan(llama8b), planner.plan(load_spec(path), backend="prefetch"))
    assert not d.moves and not d.schedule
    assert [(g.layers_text, g.params_text, g.what, g.old, g.new) for g in d.model.params] == [
        ("model.embed_tokens, model.norm, lm_head", "weight", "dtype", "bfloat16", "float16"),
        ("model.layers.{0..31}", "*", "dtype", "bfloat16", "float16")]
    (pool,) = d.other  # same size, other kinds of buffer
    assert pool.field == "buffer_pool keys" and "mlp.up_proj.weight float16[14336, 4096]" in pool.new


def test_namesake_profiles_with_other_figures_are_not_compared(llama8b):
    from schemas.hardware import load_hardware

    bundled = load_hardware("h200")
    calibrated = bundled.model_copy(update={"h2d_gbps": 9.0})  # the same name and source, another link
    old = planner.plan(llama8b, gpu_budget=12 * 10**9, hardware=bundled)
    new = planner.plan(llama8b, gpu_budget=12 * 10**9, hardware=calibrated)
    d = diff_plans(old, new)
    assert d.time == [] and "two profiles named 'h200' whose figures differ" in d.time_note
    assert "predictions.profile.h2d_gbps" in render_diff(d, "text")
