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


def test_a_dry_run_writes_a_row_per_plan_and_workload(tmp_path, monkeypatch):
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
    assert [(s["ratio"], s["mode"]) for s in lines if s["type"] == "summary"] == [
        ("ratio", "eager"), ("ratio_model_cpu", "eager"), ("ratio_routed", "eager")]
    assert all(r["mode"] == "eager" for r in rows)  # graph replay only on CUDA, when asked
    # the MoE's rows are predicted with what the run measured too: its routing where it was well sampled (the
    # prefill's 64 tokens give each of the 16 experts 16 choices; a step of 4 tokens one: uniform routing there)
    routed = [r for r in rows if r["model"] == "moe"]
    assert routed and all("predicted_routed_ms" in r for r in routed)
    assert all(r["predicted_routed_ms"] == r["predicted_model_cpu_ms"] for r in routed if r["workload"] != "prefill")
    assert not any("predicted_routed_ms" in r for r in rows if r["model"] == "llama")
    touched = next(line for line in lines if line["type"] == "routing")
    assert touched["model"] == "moe" and set(touched["touched"]) == {"decode", "decode32", "prefill"}
    assert set(touched["shares"]) == {"decode", "decode32", "prefill"}  # saved for the replay
    assert all(len(q) == 16 and sum(q) == pytest.approx(4, abs=1e-4)  # the tiny MoE: top-4 of 16 experts
               for layers in touched["shares"].values() for q in layers.values())
    cpu = {c["model"]: c for c in lines if c["type"] == "cpu"}
    assert {m: (c["figure"], c["blocks"]) for m, c in cpu.items()} == {"llama": ("block_cpu_us", 8),
                                                                       "moe": ("moe_block_cpu_us", 6)}
    assert all(c["model_us"] > 0 for c in cpu.values())
    assert [r["plan_file"] for r in rows[::3]] == ["llama-00.plan.yaml", "moe-00.plan.yaml"]
    # every plan in one file (a device call returns a few files): one line a plan, named as the rows name it
    packed = [json.loads(line) for line in (tmp_path / "plans.jsonl").read_text().splitlines()]
    assert sorted(p["file"] for p in packed) == sorted({r["plan_file"] for r in rows})
    assert not (tmp_path / "plans").exists()
    # the replay reads the saved plans: with the run's profile, the run's predictions again (none made again)
    import replay_predict

    monkeypatch.setattr(replay_predict, "matched_plan", lambda *a, **k: pytest.fail("a plan was made again"))

    again = replay_predict.replay(tmp_path / "predict-h200.jsonl")
    assert [(r["model"], r["plan"], r["workload"]) for r in again] == [(r["model"], r["plan"], r["workload"])
                                                                       for r in rows]
    assert all(r["after_ms"] == r["before_ms"] for r in again)
    assert replay_predict.tally(again, "after") == replay_predict.tally(again, "before")
    # and with the routing the run measured, the run's routed predictions again (the MoE's rows only)
    assert [r["routed_after"] is not None for r in again] == [r["model"] == "moe" for r in again]
    assert all(r["routed_after"] == pytest.approx(r["routed_before"], abs=2e-4) for r in again if r["model"] == "moe")


def test_the_timeline_row_reads_the_copy_and_stall_events_from_the_forward_start():
    from runtime.stats import ForwardStats

    class At:  # an event at a time, as CUDA events give elapsed times
        def __init__(self, ms):
            self.ms = ms

        def elapsed_time(self, other):
            return other.ms - self.ms

    forward = ForwardStats(bytes=30, copies=[("l.3", At(2.0), At(9.5), 10), ("l.7", At(9.5), At(17.0), 20)],
                           stalls=[("l.3", At(4.0), At(9.6))], late_copies=1)
    seen = bench.windows(forward, At(1.0))
    assert seen == {"bytes": 30, "late_copies": 1, "copies": [["l.3", 1.0, 8.5, 10], ["l.7", 8.5, 16.0, 20]],
                    "stalls": [["l.3", 3.0, 8.6]]}


def test_the_blocks_are_the_longest_module_list():
    model, _ = bench.build_model("moe", True, torch.device("meta"))
    assert len(bench.blocks_of(model)) == 6 and bench.blocks_of(model) is model.model.layers


def test_the_predicted_windows_are_the_timeline_s_per_prefetched_layer():
    model, _ = bench.build_model("llama", True, torch.device("meta"))
    spec = runtime.describe(model, name="llama")
    hw = load_hardware("h200")
    plan = bench.planner.plan(spec, hardware=hw, workload=bench.DRY_WORKLOADS, strategy="group", group_size=4,
                              num_in_group=1, backend="prefetch", prefetch_step=1)
    seen = bench.predicted_windows(plan, hw, 1)
    assert [w[0] for w in seen] == ["model.layers.3", "model.layers.7"]
    assert all(w[1] is not None and w[2] > w[1] and w[3] >= 0 for w in seen)  # each copied once a forward


def test_a_replay_can_leave_a_profile_figure_out():
    """``replay_predict --without FIELD``: the figure back at its default (absent), to see what it changes; a field
    that has no default (or none of that name) is refused by name."""
    import replay_predict

    from schemas.hardware import load_hardware

    hw = load_hardware("h200")
    assert hw.matmul_gbps_rows is not None
    bare = replay_predict.without_fields(hw, ["matmul_gbps_rows", "block_gpu_us"])
    assert bare.matmul_gbps_rows is None and bare.block_gpu_us == 0.0 and bare.h2d_gbps == hw.h2d_gbps
    for bad in ("h2d_gbps", "no_such_figure"):
        with pytest.raises(SystemExit, match=bad):
            replay_predict.without_fields(hw, [bad])
