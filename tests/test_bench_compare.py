"""bench/bench_compare.py: a CPU smoke run of every contender's path, the naive offloader, the report.

The GPU run happens once, on a lent machine; these make sure it does not die on a typo. No timing is
asserted: only which rows exist, their status, and that outputs equal the unoffloaded model's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

GB = 10**9


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, list[dict]]:
    torch = pytest.importorskip("torch")
    for name in ("transformers", "accelerate", "diffusers"):
        pytest.importorskip(name)
    import bench_compare

    out = tmp_path_factory.mktemp("compare") / "compare.jsonl"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: threads only contend
    try:
        code = bench_compare.main(["--device", "cpu", "--smoke", "--out", str(out), "--slow-step", "0",
                                   "--step-cap", "0", "--profile-diffusers", "block,leaf-stream"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    return out, _rows(out)


def test_smoke_runs_every_contender_on_both_models_with_outputs_equal_to_the_floor(smoke):
    _, records = smoke
    kinds = [r["type"] for r in records]
    assert kinds[0] == "env" and kinds[-1] == "done" and kinds.count("case") == 2
    rows = [r for r in records if r["type"] == "row"]
    assert not [r for r in rows if r["status"] == "error"], [r.get("error") for r in rows if r["status"] == "error"]
    for model in ("llama", "moe"):
        ok = {r["contender"] for r in rows if r["model"] == model and r["status"] == "ok"}
        for want in ("no offload", "ours auto", "ours prefetch (best hand plan)", "ours uva (best hand plan)",
                     "naive (sync copy per layer)", "accelerate dispatch_model", "accelerate cpu_offload"):
            assert want in ok, (model, want)
        assert any(c.startswith("diffusers best (") for c in ok), model
        workloads = {r["workload"] for r in rows if r["model"] == model and r["contender"] == "ours auto"}
        assert workloads == {"decode", "decode32", "prefill"}
    measured = [r for r in rows if r["status"] == "ok"]
    assert all(r["equal"] is True and r["max_abs_diff"] == 0.0 for r in measured)
    assert all(r["step_ms"] > 0 and r["times_ms"] for r in measured)


def test_smoke_sweeps_diffusers_and_says_why_a_configuration_did_not_run(smoke):
    from compare_diffusers import CONFIGS, needs_cuda

    _, records = smoke
    sweep = {r["diffusers_config"]: r for r in records if r.get("sweep")}
    assert set(sweep) == set(CONFIGS)
    for name, row in sweep.items():
        if needs_cuda(name):
            assert row["status"] == "skipped" and "CUDA" in row["reason"]
        else:
            assert row["status"] == "ok" and row["workload"] == "decode"
    best = [r for r in records if r.get("from_sweep")]
    assert len(best) == 1 and best[0]["diffusers_config"] in sweep and not needs_cuda(best[0]["diffusers_config"])
    # without a GPU peak, ours at diffusers' memory cannot be planned: skipped rows, with the reason
    at = [r for r in records if r.get("contender") == "ours auto @ diffusers best memory"]
    assert at and all(r["status"] == "skipped" and "GPU peak" in r["reason"] for r in at)


def test_smoke_writes_the_profile_of_the_configurations_asked_for(smoke):
    out, records = smoke
    profiles = [r for r in records if r["type"] == "profile"]
    assert [p["contender"] for p in profiles] == ["diffusers block"]  # leaf-stream needs CUDA: skipped
    table = Path(profiles[0]["table"])
    assert table.parent == out.parent and "self_cpu_time_total" in table.read_text()
    assert profiles[0]["top"] and all({"op", "calls", "cpu_ms"} <= set(t) for t in profiles[0]["top"])


def test_the_report_of_the_smoke_run_lists_every_row(smoke, tmp_path):
    pytest.importorskip("matplotlib")
    import compare_report

    out, records = smoke
    assert compare_report.main([str(out), "--md", str(tmp_path / "c.md"), "--png", str(tmp_path / "c.png")]) == 0
    text = (tmp_path / "c.md").read_text()
    for r in records:
        if r["type"] == "row":
            assert r.get("diffusers_config", r["contender"]) in text
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv,fragment", [
    (["--diffusers-configs", "leaf-strem"], "did you mean 'leaf-stream'"),
    (["--profile-diffusers", "blok"], "did you mean 'block'"),
    (["--skip", "cpu-offload"], "did you mean 'cpu_offload'"),
])
def test_a_misspelled_name_is_refused_before_anything_runs(argv, fragment, capsys, tmp_path):
    pytest.importorskip("torch")
    import bench_compare

    with pytest.raises(SystemExit) as exc:
        bench_compare.main(["--out", str(tmp_path / "x.jsonl"), *argv])
    assert exc.value.code == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


def test_naive_offloader_moves_the_plan_layers_and_remove_restores_them():
    torch = pytest.importorskip("torch")
    from compare_naive import NaiveOffloader
    from models import LlamaConfig, make_llama

    model = make_llama(LlamaConfig(vocab=128, dim=32, layers=4, heads=4, kv_heads=2, hidden=64))
    ids = torch.randint(0, 120, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = [n for n, _ in model.named_modules() if n.endswith(("layers.1", "layers.2"))]
    layers = {n: [p for p, _ in model.get_submodule(n).named_parameters()] for n in names}
    offloader = NaiveOffloader(model, layers, "cpu")
    host = {id(t): h for t, h in offloader.moved}
    assert offloader.host_bytes == sum(p.numel() * p.element_size() for n in names
                                       for p in model.get_submodule(n).parameters())
    with torch.no_grad():
        assert torch.equal(model(ids), want)
    for t, h in offloader.moved:  # between forwards each param points at its host copy
        assert t.data_ptr() == host[id(t)].data_ptr()
    offloader.remove()
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_repeats_fall_with_the_step_time_and_stay_within_the_cap():
    pytest.importorskip("torch")
    from compare_measure import repeats_for

    assert [repeats_for(s, 10.0) for s in (0.01, 0.5, 2.0, 5.0, 9.0)] == [7, 5, 3, 2, 1]
    assert repeats_for(0.5, 1.0) == 2 and repeats_for(3.0, 0.0) == 1 and repeats_for(5.0, 60.0, slow_s=4.0) == 1


def test_host_added_is_the_largest_drop_of_available_memory_after_setup():
    pytest.importorskip("torch")
    from compare_measure import host_added

    before = {"MemAvailable": 100 * GB, "Mlocked": 0, "VmRSS": 5 * GB}
    after = [{"MemAvailable": 90 * GB, "Mlocked": 2 * GB, "VmRSS": 6 * GB},
             {"MemAvailable": 80 * GB, "Mlocked": 1 * GB, "VmRSS": 7 * GB}]
    added = host_added(before, *after)
    assert added["MemAvailable"] == 20 * GB and added["Mlocked"] == 2 * GB and added["VmRSS"] == 2 * GB
    assert added["Cached"] is None  # not in the snapshots: unknown, not zero


def _synthetic() -> list[dict]:
    def row(contender, workload, ms, family="ours", **kw):
        return {"type": "row", "model": "llama", "contender": contender, "family": family, "workload": workload,
                "mode": "eager", "status": "ok", "step_ms": ms, "times_ms": [ms] * 5, "warmups": 2,
                "ratio_link": round(ms / {"decode": 150.0, "prefill": 160.0}[workload], 3), "ratio_floor": 2.0,
                "peak_gpu_bytes": 8 * GB, "host_added_bytes": 9 * GB, "equal": True, "max_abs_diff": 0.0, **kw}

    return [
        {"type": "env", "device": "NVIDIA H200"},
        {"type": "case", "model": "llama", "total_bytes": 16 * GB, "budget": 8 * GB, "must_move_bytes": 8 * GB,
         "h2d_gbps": 55.3, "link_bound_ms": {"decode": 150.0, "prefill": 160.0},
         "tokens": {"decode": 1, "prefill": 2048}},
        row("ours auto", "decode", 152.0),
        row("ours auto", "decode", 151.0, mode="graph"),
        row("accelerate dispatch_model", "decode", 1413.0, family="accelerate"),
        row("ours auto", "prefill", 161.0),
        row("accelerate dispatch_model", "prefill", 1500.0, family="accelerate", equal=False, max_abs_diff=0.5),
        {"type": "row", "model": "llama", "contender": "accelerate cpu_offload", "family": "accelerate",
         "workload": "prefill", "mode": "eager", "status": "error", "error": "setup: OutOfMemoryError()"},
        row("diffusers leaf-stream", "decode", 330.0, family="diffusers", sweep=True, diffusers_config="leaf-stream"),
        row("diffusers block-top-stream", "decode", 16600.0, family="diffusers", sweep=True,
            diffusers_config="block-top-stream"),
        {"type": "row", "model": "llama", "contender": "diffusers block-stream", "family": "diffusers",
         "workload": "decode", "mode": "eager", "status": "error", "error": "ValueError('x')", "sweep": True,
         "diffusers_config": "block-stream"},
        {"type": "error", "model": "moe", "section": "build", "error": "OutOfMemoryError()"},
    ]


def test_report_table_ranks_rows_under_their_link_bound_and_keeps_the_sweep_apart():
    import compare_report

    text = compare_report.table(_synthetic())
    lines = text.splitlines()
    main = [ln for ln in lines if ln.startswith("| decode b=1 |")]
    assert "**link bound** | 150.0 | | | 1.00x" in main[0]
    assert [ln.split(" | ")[1] for ln in main[1:]] == ["ours auto [graph]", "ours auto", "accelerate dispatch_model"]
    assert "| 9.42x |" in main[3] and "| 8.00 | 9.00 | yes |" in main[3]
    prefill = [ln for ln in lines if ln.startswith("| prefill 2,048 |")]
    assert "no (0.5)" in prefill[2] and "error: setup: OutOfMemoryError()" in prefill[3]
    sweep = [ln for ln in lines[lines.index("### diffusers group offloading, configurations (decode b=1)"):]
             if ln.startswith("| llama |")]
    assert [ln.split(" | ")[1] for ln in sweep] == ["leaf-stream", "block-top-stream", "block-stream"]
    assert "error: ValueError('x')" in sweep[2]
    assert "leaf-stream |" not in "\n".join(main)  # sweep rows are not in the main table
    assert lines[-1] == "- moe, build: OutOfMemoryError()"


def _cells(text: str, first_column: str) -> list[dict[str, str]]:
    """The rows of the markdown table whose header starts with ``first_column``, as {column: cell}."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_column} |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))))
    return rows


def _matched() -> list[dict]:
    """A run with predictions, own-plan bounds and ``auto`` matched to diffusers' memory in two attempts
    (the attempts' own rows flagged ``attempt_of``)."""
    records = _synthetic()
    at = "ours auto @ diffusers best memory"
    attempts = [{"attempt": 1, "budget": 0.5 * GB, "budget_raised_to": None, "status": "ok",
                 "peak_gpu_bytes": 0.44 * GB, "step_ms": 285.0, "predicted_ms": 280.0, "offloaded_bytes": 15.5 * GB,
                 "reason": None},
                {"attempt": 2, "budget": 1.1 * GB, "budget_raised_to": None, "status": "ok",
                 "peak_gpu_bytes": 1.04 * GB, "step_ms": 250.0, "predicted_ms": 240.0, "offloaded_bytes": 15.0 * GB,
                 "reason": None}]
    for r in records:
        if r.get("contender") == "ours auto" and r["workload"] == "decode" and r["mode"] == "eager":
            r.update(predicted_ms=146.2, offloaded_bytes=8 * GB, ratio_own=152.0 / 145.0)
    records += [
        {**records[2], "contender": f"{at} (attempt 1)", "attempt_of": at, "attempt": 1, "step_ms": 285.0},
        {**records[2], "contender": f"{at} (attempt 2)", "attempt_of": at, "attempt": 2, "step_ms": 250.0},
        {**records[2], "contender": at, "step_ms": 250.0, "predicted_ms": 240.0, "ratio_own": 1.02,
         "peak_gpu_bytes": 1.04 * GB, "target_peak_gpu_bytes": 1.05 * GB, "attempts": attempts,
         "within_target": True, "chosen_attempt": 2, "matched_budget": 1.1 * GB},
    ]
    return records


def test_report_shows_predictions_and_own_plan_bounds_for_rows_of_ours_only():
    import compare_report

    rows = {(r["workload"], r["contender"]): r for r in _cells(compare_report.table(_matched()), "workload")}
    auto = rows[("decode b=1", "ours auto")]
    assert (auto["pred ms"], auto["/ pred"], auto["/ own bytes"], auto["/ link bound"]) == ("146.2", "1.04x", "1.05x",
                                                                                         "1.01x")
    accelerate = rows[("decode b=1", "accelerate dispatch_model")]
    assert accelerate["pred ms"] == accelerate["/ pred"] == accelerate["/ own bytes"] == ""
    assert accelerate["/ link bound"] == "9.42x"
    prefill = rows[("prefill 2,048", "ours auto")]  # a row of ours from a run before predictions: blank
    assert prefill["pred ms"] == prefill["/ own bytes"] == ""
    matched = rows[("decode b=1", "ours auto @ diffusers best memory")]
    assert matched["step ms"] == "250.0" and matched["pred ms"] == "240.0" and matched["peak GPU GB"] == "1.04"
    assert matched["note"] == "attempt 2 of 2, target peak 1.05 GB"
    assert not [k for k in rows if "(attempt" in k[1]]  # the attempts are not rows of the main table


def test_report_lists_the_attempts_of_a_memory_match_and_says_which_was_reported():
    import compare_report

    text = compare_report.table(_matched())
    assert "### `auto` at another contender's GPU memory: the attempts" in text
    got = _cells(text, "model")  # the first table headed by "model": the attempts (the sweep comes after)
    assert [(r["attempt"], r["budget GB"], r["peak GPU GB"], r["target GB"], r["step ms"], r["pred ms"], r["note"])
            for r in got] == [("1", "0.50", "0.44", "1.05", "285.0", "280.0", "slower"),
                              ("2", "1.10", "1.04", "1.05", "250.0", "240.0", "reported")]


def test_report_notes_a_match_over_the_target_and_an_attempt_not_run():
    import compare_report

    records = _matched()
    final = records[-1]
    final["attempts"][0]["peak_gpu_bytes"] = 1.2 * GB
    final["attempts"][1].update(status="not run", peak_gpu_bytes=None, step_ms=None, predicted_ms=None,
                                budget_raised_to=1.3 * GB, reason="infeasible at 1100000000 B")
    final.update(within_target=False, chosen_attempt=1)
    text = compare_report.table(records)
    matched = next(r for r in _cells(text, "workload") if r["contender"] == "ours auto @ diffusers best memory")
    assert matched["note"] == "over the target peak 1.05 GB in every attempt"
    assert [(r["budget GB"], r["note"]) for r in _cells(text, "model")] == [
        ("0.50", "reported, over the target"), ("1.10 (raised to 1.30)", "infeasible at 1100000000 B")]


def test_report_chart_leaves_the_attempts_out():
    pytest.importorskip("matplotlib")
    import compare_report

    (ax,) = compare_report.chart(_matched()).axes
    assert sorted(p.get_height() for p in ax.patches) == [151.0, 152.0, 161.0, 250.0, 1413.0, 1500.0]


def test_merged_runs_keep_the_measured_row_and_the_first_case():
    """A second run (``--only moe`` after the first ran out of time) fills the rows the first skipped; a
    skipped row never replaces a measured one, and each model keeps its first case record."""
    import compare_report

    first = _synthetic()
    skipped = {**first[2], "status": "skipped", "reason": "time budget spent", "step_ms": None}
    later = [{"type": "env", "device": "other"}, {**first[1], "h2d_gbps": 1.0}, skipped,
             {**first[7], "status": "ok", "step_ms": 9000.0, "times_ms": [9000.0], "warmups": 1}]
    merged = compare_report.merge([first, later])
    rows = {(r["contender"], r["workload"], r["mode"]): r for r in merged if r.get("type") == "row"}
    assert rows[("ours auto", "decode", "eager")]["step_ms"] == 152.0  # kept: the later one was skipped
    assert rows[("accelerate cpu_offload", "prefill", "eager")]["step_ms"] == 9000.0  # the error replaced
    assert [r["device"] for r in merged if r.get("type") == "env"] == ["NVIDIA H200"]
    assert [r["h2d_gbps"] for r in merged if r.get("type") == "case"] == [55.3]
    assert len([r for r in merged if r.get("type") == "row"]) == len([r for r in first if r.get("type") == "row"])


def test_report_chart_draws_one_bar_per_measured_row_and_the_link_bound_per_workload():
    pytest.importorskip("matplotlib")
    import compare_report

    fig = compare_report.chart(_synthetic())
    (ax,) = fig.axes
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights == [151.0, 152.0, 161.0, 1413.0, 1500.0]  # ok rows of the main table; no error, no sweep
    bounds = [seg for c in ax.collections for seg in c.get_segments()]
    assert sorted(seg[0][1] for seg in bounds) == [150.0, 160.0]
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["decode b=1", "prefill 2,048"]


@pytest.mark.parametrize("target,twice", [("", "all"), ("model", "embedding, final norm, rotary buffers")])
def test_diffusers_block_level_on_a_causal_lm_transfers_its_unmatched_group_twice(target, twice):
    """What docs/BENCHMARKS.md says about diffusers (0.42) on a transformers decoder, checked on the CPU:
    given the whole causal LM, block level finds no block and transfers every weight twice a forward; given
    the decoder stack, only its unmatched group (embedding, final norm, rotary buffers) is transferred twice.
    (On the H200 the profile shows the second transfer of a tensor copies nothing: it is already there.)"""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("diffusers")
    import diffusers.hooks.group_offloading as go
    from bench_cost import build
    from diffusers.hooks import apply_group_offloading

    if not hasattr(go.ModuleGroup, "_transfer_tensor_to_device"):
        pytest.skip("this diffusers moves tensors another way: re-check the docs' explanation")
    model, _ = build("llama", True, torch.device("cpu"))
    counts: dict[int, int] = {}
    original = go.ModuleGroup._transfer_tensor_to_device

    def counting(self, tensor, *args, **kwargs):
        counts[id(tensor)] = counts.get(id(tensor), 0) + 1
        return original(self, tensor, *args, **kwargs)

    apply_group_offloading(model.get_submodule(target), onload_device=torch.device("cpu"),
                           offload_type="block_level", num_blocks_per_group=1)
    go.ModuleGroup._transfer_tensor_to_device = counting
    try:
        with torch.no_grad():
            model(torch.tensor([[1]]), use_cache=False)
    finally:
        go.ModuleGroup._transfer_tensor_to_device = original
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    copied_twice = {n for n, t in tensors if counts.get(id(t)) == 2}
    if twice == "all":
        assert copied_twice == {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        hooked = [n for n, m in model.named_modules() if hasattr(m, "_diffusers_hook")]
        assert hooked == [""]  # one group: the whole model, with no stream
    else:
        rotary = {f"model.rotary_emb.{n}" for n, _ in model.model.rotary_emb.named_buffers()}
        assert rotary and copied_twice == {"model.embed_tokens.weight", "model.norm.weight"} | rotary


def test_a_failing_section_is_an_error_line_and_the_run_goes_on(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import bench_compare

    def broken(*args, **kwargs):
        raise RuntimeError("planner fell over")

    monkeypatch.setattr(bench_compare, "ours", broken)
    out = tmp_path / "c.jsonl"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = bench_compare.main(["--device", "cpu", "--smoke", "--only", "llama", "--out", str(out),
                                   "--skip", "hand,diffusers,cpu_offload", "--slow-step", "0", "--step-cap", "0"])
    finally:
        torch.set_num_threads(threads)
    records = _rows(out)
    assert code == 0 and records[-1]["type"] == "done"
    assert [r for r in records if r["type"] == "error"] == [  # ours() serves the first pass and the hand pass
        {"type": "error", "model": "llama", "section": section, "error": "RuntimeError('planner fell over')"}
        for section in ("ours", "hand")]
    after = {r["contender"] for r in records if r["type"] == "row" and r["status"] == "ok"}
    assert {"naive (sync copy per layer)", "accelerate dispatch_model"} <= after  # the sections after it ran


def test_the_first_pass_sweeps_the_configurations_documented_for_speed():
    """On a GPU the diffusers configurations without streams, or at block level on the whole causal LM,
    wait for the second pass; without CUDA the stream configurations cannot run, so the others go first."""
    torch = pytest.importorskip("torch")
    import bench_compare
    from compare_diffusers import CONFIGS

    names = list(CONFIGS)
    gpu = bench_compare.first_pass(names, torch.device("cuda"))
    assert set(names) - set(gpu) == {"block-top-stream", "block", "leaf"}
    assert set(bench_compare.first_pass(names, torch.device("cpu"))) == {"block", "leaf"}
    assert bench_compare.first_pass(["block"], torch.device("cuda")) == ["block"]  # nothing fast: all of them
