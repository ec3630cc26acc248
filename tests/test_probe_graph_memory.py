"""bench/probe_graph_memory.py in its CPU dry run, the layer graphs captured by the stand-in of
tests/test_shape_graphs.py: a row a plan and batch, the static bytes the graphs hold as runtime/shape_graphs.py
estimates them, none without the graphs."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))


def test_the_dry_run_writes_a_row_a_plan_and_batch(tmp_path, monkeypatch):
    import torch

    import probe_graph_memory
    from test_experts_forward import _graphs_on_the_cpu

    _graphs_on_the_cpu(monkeypatch)
    threads = torch.get_num_threads()
    try:
        assert probe_graph_memory.main(["--dry-run", "--out", str(tmp_path / "rows.jsonl")]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [(r["plan"], r["tokens"]) for r in rows] == [(p, t) for p in ("uva", "auto decode32")
                                                        for t in probe_graph_memory.TOKENS]
    uva = [r for r in rows if r["plan"] == "uva"]
    assert all(r["graphs"] > 0 and 0 < r["static_bytes"] <= r["estimate_bytes"] for r in uva)
    assert [r["graphs"] for r in uva] == sorted(r["graphs"] for r in uva)  # a shape more each batch
    assert uva[-1]["static_bytes"] > uva[0]["static_bytes"]
    assert all(r["allocated_with"] == r["allocated_without"] == r["reserved_with"] == 0 for r in rows)  # no GPU
    assert all(r["plan_graph_bytes"] == 0 for r in rows)  # a dry run's plans count weights alone
    assert all(r["held"] == r["static_bytes"] and r["within_plan"] == (r["held"] == 0) for r in rows)
