"""bench/bench_predict_h200.py (issue 19): its plans are the ones the issue asks for and each one plans; a dry
run on tiny models of the same configs writes the rows the H200 run writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_predict_h200 as bench  # noqa: E402

import runtime  # noqa: E402
from schemas.hardware import load_hardware  # noqa: E402


def test_the_plans_are_at_least_forty_and_cover_the_issue():
    plans = bench.PLANS
    assert len(plans) >= 40 and len({(c.model, c.label) for c in plans}) == len(plans)
    assert {c.model for c in plans} == {"llama", "moe"}
    mixes = [c for c in plans if {"uva", "prefetch"} <= set(c.options.get("backends", {}).values())]
    assert len([c for c in mixes if c.model == "llama"]) >= 2 and [c for c in mixes if c.model == "moe"]
    few = [c for c in plans if c.options.get("strategy") == "group" and c.options.get("group_size", 0) >= 8]
    assert few and [c for c in plans if c.vllm]
    assert set(bench.WORKLOADS.root) == {"decode", "decode32", "prefill"}
    assert [item.tokens for _, item in bench.WORKLOADS.items()] == [1, 32, 2048]


@pytest.mark.parametrize("kind", sorted(bench.MODELS))
def test_every_plan_is_made_on_the_tiny_model(kind):
    model, _ = bench.build_model(kind, True, torch.device("cpu"))
    spec = runtime.describe(model, name=kind)
    total = sum(layer.nbytes for layer in spec.model.expanded())
    hw = load_hardware("h200")
    for case in (c for c in bench.PLANS if c.model == kind):
        plan, _ = bench.make_plan(case, spec, total, hw, bench.DRY_WORKLOADS)
        assert len(plan.predictions.workloads) == 3, case.label
        if {"uva", "prefetch"} <= set(case.options.get("backends", {}).values()):
            assert plan.summary.backend == "mixed", case.label
        for name, item in bench.DRY_WORKLOADS.items():
            assert bench.link_bound_ms(plan, item.tokens, hw) >= 0


def test_a_dry_run_writes_a_row_per_plan_and_workload(tmp_path):
    assert bench.main(["--dry-run", "--device", "cpu", "--out", str(tmp_path), "--limit", "1"]) == 0
    lines = [json.loads(line) for line in (tmp_path / "predict-h200.jsonl").read_text().splitlines()]
    kinds = [line["type"] for line in lines]
    assert kinds[:2] == ["env", "profile"] and kinds[-1] == "summary" and "error" not in kinds
    rows = [line for line in lines if line["type"] == "row"]
    assert [(r["model"], r["workload"]) for r in rows] == [(m, w) for m in ("llama", "moe")
                                                           for w in ("decode", "decode32", "prefill")]
    assert all(r["measured_ms"] > 0 and r["ratio"] == pytest.approx(r["predicted_ms"] / r["measured_ms"], abs=1e-4)
               for r in rows)
    assert lines[-1]["plans"] == 2 and lines[-1]["pairs"] == 6
