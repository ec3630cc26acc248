"""The measured side of the whole-GPU plan: a workload on the command line parses as it does in a spec (a
property), Handle.stats() carries each forward's peak, `planner explain --measured` puts it next to the
plan's parts, describe() records the attention heads, and bench/bench_memory.py's CPU dry run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_samples import invoke
from conftest import EXAMPLES, ROOT
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import planner
from schemas import dump_model, load_spec
from schemas.workload import MAX_TOKENS, Workload, WorkloadItem, batch_of, is_prefill, parse_workload_option

torch = pytest.importorskip("torch")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["decode", "prefill", "chat"]),
       st.one_of(st.none(), st.just("auto"), st.integers(-2, 5000).map(str), st.text("0123456789x.-", max_size=6)),
       st.one_of(st.none(), st.integers(-1, 9000).map(str), st.text("0123456789e", max_size=5)),
       st.one_of(st.none(), st.sampled_from(["0.5", "1", "0", "x"])))
def test_an_option_is_the_spec_item_it_spells_or_refused(name, n, context, weight):
    text = name + ("" if n is None else f"={n}") + ("" if context is None else f"@{context}") + (
        "" if weight is None else f":{weight}")
    try:
        parsed, item = parse_workload_option(text)
    except ValueError as err:
        assert str(err).startswith(repr(text))  # a message about the option as given, never another exception
        return
    data: dict = {"weight": float(weight)} if weight is not None else {}
    if n is None:
        data["tokens"] = {"decode": 1, "prefill": 2048}[name]
    elif n == "auto":
        data["batch"] = "auto"
    else:
        data["batch" if context is not None and not is_prefill(name) else "tokens"] = int(n)
    if context is not None:
        data["context"] = int(context)
    spelled = WorkloadItem.model_validate(data)
    Workload({name: spelled})  # the spec's rules pass too
    assert parsed == name and item == spelled
    if not item.auto:
        batch = batch_of(name, item)
        assert 1 <= batch <= item.rows <= MAX_TOKENS
        assert item.context is None or item.context * batch >= item.rows


def test_a_workload_the_option_refuses_the_spec_refuses_too():
    for data in ({"batch": "auto"}, {"batch": 4, "tokens": 2}, {"tokens": 2048, "context": 8}, {"batch": 0}):
        with pytest.raises(ValidationError):
            Workload({"prefill": WorkloadItem.model_validate(data)})


def test_stats_carry_each_forwards_peak():
    from runtime.stats import with_peaks

    copies = [{"bytes_copied": 10, "layers": []}, {"bytes_copied": 20, "layers": []}]
    assert [f.get("max_memory_allocated") for f in with_peaks(copies, [5, 6, 7])] == [6, 7]  # aligned at the end
    assert with_peaks(copies, []) == copies
    rows = with_peaks([], [5, 6])  # a backend that records no copies: a row a forward
    assert [(r["bytes_copied"], r["max_memory_allocated"]) for r in rows] == [(0, 5), (0, 6)]


def test_explain_puts_the_measured_peak_next_to_the_plans_parts(tmp_path):
    spec = load_spec(EXAMPLES / "generated" / "llama-3-8b.yaml")
    plan = planner.plan(spec, gpu_budget=16 * 10**9, backend="uva",
                        workload=Workload({"decode": WorkloadItem(batch=8, context=4096)}))
    (tmp_path / "p.yaml").write_text(dump_model(plan))
    peak = plan.summary.peak_gpu_bytes - 10**8
    stats = {"backend": "uva", "forwards": [{"bytes_copied": 0, "max_memory_allocated": p} for p in (peak, peak + 1)]}
    (tmp_path / "s.json").write_text(json.dumps(stats))
    out = invoke("explain", str(tmp_path / "p.yaml"), "--measured", str(tmp_path / "s.json"))
    assert out.exit_code == 0, out.output
    line = next(x for x in out.stdout.splitlines() if x.startswith("peak GPU bytes"))
    # the largest of the forwards used (the first is left out: the warm-up)
    assert f"({plan.summary.peak_gpu_bytes})" in line and f"({peak + 1})" in line and "x0.99" in line
    assert "KV cache" in out.stdout and "4.00 GiB (4294967296)" in out.stdout
    data = json.loads(invoke("explain", str(tmp_path / "p.yaml"), "--measured", str(tmp_path / "s.json"),
                             "--format", "json").stdout)
    assert data["memory"][0] == {"what": "peak GPU bytes", "predicted": plan.summary.peak_gpu_bytes,
                                 "measured": float(peak + 1), "ratio": (peak + 1) / plan.summary.peak_gpu_bytes,
                                 "miss": float(peak + 1 - plan.summary.peak_gpu_bytes)}


def test_describe_records_the_attention_heads():
    transformers = pytest.importorskip("transformers")
    import runtime

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    spec = runtime.describe(transformers.LlamaForCausalLM(config))
    assert (spec.model.attention.heads, spec.model.attention.kv) == (4, 2)
    assert runtime.describe(torch.nn.Sequential(torch.nn.Linear(2, 2))).model.attention is None


def test_the_bench_dry_run_measures_what_the_plan_counts(tmp_path, monkeypatch):
    """bench/bench_memory.py on the CPU: tiny Phi-3 (fused projections), one budget, the memory rows; the
    peak counted tensor by tensor is within a few percent of the plan's (tiny models' small tensors included)."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_memory

    monkeypatch.setattr(bench_memory, "SMALL_BUDGETS", (0.7, 1.3))
    out = tmp_path / "m.jsonl"
    assert bench_memory.main(["--dry-run", "--only", "phi3", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    memory = [r for r in rows if r["kind"] == "memory" and r["budget"] == rows[-1]["budgets"][-1]]
    assert [(r["workload"], r["cache"]) for r in memory] == [
        ("decode-1", "static"), ("decode-1", "dynamic"), ("decode-4", "static"), ("decode-4", "dynamic"),
        ("prefill-16", None), ("prefill-48", None)]
    for r in memory:
        assert r["planned"] == r["weights"] + r["buffers"] + r["kv_cache"] + r["activations"] + r["workspace"]
        assert 0.9 < r["ratio"] < 1.1, r
    assert rows[-1]["kind"] == "summary" and rows[-1]["memory_rows"] == 12
    # tokens per second at the larger budget: the batch chosen with its plan, measured beside a smaller one
    summary = next(r for r in rows if r["kind"] == "throughput-summary")
    tried = [r for r in rows if r["kind"] == "throughput"]
    assert summary["chosen"] in [r["batch"] for r in tried] and len(tried) == 2
    assert all(r["predicted_tokens_per_s"] > 0 and r["measured_tokens_per_s"] > 0 for r in tried)
    # every decode through generate() is timed (static and dynamic caches), with what decode_rows.py needs
    decodes = [r for r in rows if r["kind"] == "memory" and r.get("cache")]
    assert decodes and all(r["measured_step_ms"] > 0 and r["predicted_step_ms"] > 0 for r in decodes)
    probe = next(r for r in rows if r["kind"] == "probe")
    assert probe["strided_copy_gbps"] > 0 and probe["sdpa_gqa_read_gbps"] > 0
    # bench/decode_rows.py finds each timed row's plan again and, in this same tree, predicts what it recorded
    import decode_rows
    again = tmp_path / "again.jsonl"
    assert decode_rows.main([str(out), "--json", str(again)]) == 0
    redone = [json.loads(line) for line in again.read_text().splitlines()]
    assert len(redone) == len(decodes) + len(tried)
    assert all(r["predicted_now_ms"] == r["predicted_step_ms"] for r in redone), redone


def test_the_bench_tokens_per_second_in_graph_mode(tmp_path, monkeypatch):
    """``--mode graph --skip-memory``: only the tokens-per-second rows, each plan made for a decode step in CUDA
    graph replay (its prediction has no CPU issue time; the CPU run itself stays eager)."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_memory

    monkeypatch.setattr(bench_memory, "SMALL_BUDGETS", (0.7, 1.3))
    out = tmp_path / "g.jsonl"
    assert bench_memory.main(["--dry-run", "--only", "phi3", "--skip-memory", "--mode", "graph",
                              "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert not any(r["kind"] == "memory" for r in rows)
    tried = [r for r in rows if r["kind"] == "throughput"]
    assert tried and all(r["mode"] == "graph" and r["predicted_step_ms"] > 0 for r in tried)
    summary = next(r for r in rows if r["kind"] == "throughput-summary")
    assert summary["mode"] == "graph" and summary["chosen"] in [r["batch"] for r in tried]
