"""bench/compare_match.py and compare_ours_at.py: ``auto`` matched to another contender's measured GPU memory.

The decisions are checked as pure functions; the attempts are run on a synthetic spec with the real planner
and a stand-in for the measuring (compare_run.run_contender) that reports peaks and steps from a given rule,
so the choice of budgets, plans and the reported row can be checked on the CPU. No timing is asserted.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

MiB = 2**20


# --- the decisions ---------------------------------------------------------------------------------------

def test_a_first_attempt_far_below_the_target_is_moved_up_by_the_slack_less_the_margin():
    from compare_match import MARGIN, next_budget

    assert next_budget(500 * MiB, 1000 * MiB, 400 * MiB) == 500 * MiB + 600 * MiB - MARGIN
    assert next_budget(500 * MiB, 1000 * MiB, 900 * MiB, slack_min=32 * MiB, margin=0) == 600 * MiB


def test_with_the_plans_own_peak_the_second_budget_is_what_the_activations_leave():
    """Measured on the H200: auto at diffusers' 1.05 GB planned a 0.44 GB plan (the budget was not binding);
    moving the budget by the whole slack gave a 1.49 GB peak. The activations (measured - planned) are what
    the target must leave room for."""
    from compare_match import MARGIN, next_budget

    assert next_budget(1049 * MiB, 1051 * MiB, 437 * MiB, 436 * MiB, equal_within=0) == 1050 * MiB - MARGIN
    assert next_budget(1048 * MiB, 2118 * MiB, 1940 * MiB, 872 * MiB, margin=0, equal_within=0) == 2118 * MiB - 1068 * MiB
    assert next_budget(1048 * MiB, 2118 * MiB, 2200 * MiB, 872 * MiB, margin=0, equal_within=0) == 2118 * MiB - 1328 * MiB
    # peaks within EQUAL_WITHIN count as equal: the budget may use them
    assert next_budget(1048 * MiB, 2118 * MiB, 1940 * MiB, 872 * MiB, margin=0, equal_within=1024) == 2118 * MiB - 1068 * MiB + 1024


def test_a_first_attempt_just_below_the_target_is_kept_and_one_above_it_is_moved_down():
    from compare_match import MARGIN, SLACK_MIN, next_budget

    assert next_budget(500 * MiB, 1000 * MiB, 1000 * MiB - SLACK_MIN) is None
    assert next_budget(500 * MiB, 1000 * MiB, 1000 * MiB) is None
    assert next_budget(500 * MiB, 1000 * MiB, 1100 * MiB) == 400 * MiB - MARGIN
    assert next_budget(500 * MiB, 1000 * MiB, None) is None  # nothing measured: nothing to correct
    assert next_budget(50 * MiB, 100 * MiB, 400 * MiB) is None  # no budget left to move down to
    assert next_budget(500 * MiB, 1000 * MiB, 992 * MiB, slack_min=0, margin=8 * MiB) is None  # same budget


def _a(status="ok", peak=None, ms=None):
    return {"status": status, "peak_gpu_bytes": peak, "step_ms": ms}


@pytest.mark.parametrize("attempts,want", [
    ([_a(peak=400, ms=300.0), _a(peak=990, ms=200.0)], 1),  # both within: the faster
    ([_a(peak=400, ms=200.0), _a(peak=990, ms=250.0)], 0),  # more memory, slower: the first stays
    ([_a(peak=400, ms=300.0), _a(peak=1010, ms=100.0)], 0),  # the faster one is over the target
    ([_a(peak=1100, ms=300.0), _a(peak=990, ms=400.0)], 1),  # only the second fits
    ([_a(peak=1100, ms=300.0), _a(peak=1001, ms=200.0)], None),  # none fits: the caller reports the first
    ([_a(peak=400, ms=300.0), _a("skipped"), ], 0),  # a skipped second attempt (time budget) never wins
    ([_a("error"), _a(peak=900, ms=500.0)], 1),
    ([_a(peak=400, ms=300.0), _a(peak=800, ms=300.0)], 0),  # equal steps: the earlier
    ([_a("not run")], None),
])
def test_the_reported_attempt_is_the_fastest_within_the_target(attempts, want):
    from compare_match import choose

    assert choose(1000, attempts, equal_within=0) == want


def test_peaks_within_a_few_allocator_blocks_count_as_equal():
    """Measured on the H200: ours 2,118,124,544 against diffusers' 2,118,123,520 bytes (two 512-byte blocks)."""
    from compare_match import EQUAL_WITHIN, choose

    target = 2_118_123_520
    attempts = [_a(peak=1_939_899_392, ms=420.0), _a(peak=2_118_124_544, ms=277.0)]
    assert choose(target, attempts) == 1 and EQUAL_WITHIN >= 1024
    assert choose(target, attempts, equal_within=0) == 0
    assert choose(target, [_a(peak=target + EQUAL_WITHIN + 512, ms=1.0)]) is None


# --- the attempts, run on a synthetic spec ---------------------------------------------------------------

ACTIVATIONS = {"decode": 1 * MiB, "decode32": 1 * MiB, "prefill": 20 * MiB}


@pytest.fixture
def case():
    torch = pytest.importorskip("torch")
    from compare_run import Case
    from synthetic_spec import synthetic_spec_text

    from schemas.io import load_model
    from schemas.spec import SpecFile

    spec = load_model(SpecFile, "synthetic.yaml", synthetic_spec_text(16, 4, hidden=1024))
    total = sum(layer.nbytes for layer in spec.model.expanded())
    inputs = {"decode": torch.zeros(1, 1), "decode32": torch.zeros(32, 1), "prefill": torch.zeros(1, 512)}
    return Case("synthetic", None, None, spec, total, total // 2, inputs,
                floor_peak={w: total + a for w, a in ACTIVATIONS.items()})


def _workloads():
    from schemas.workload import Workload, WorkloadItem

    return Workload({"decode": WorkloadItem(tokens=1), "decode32": WorkloadItem(tokens=32),
                     "prefill": WorkloadItem(tokens=512)})


def _run():
    import torch
    from compare_run import Run

    return Run(torch.device("cpu"), io.StringIO(), time_budget_s=1000.0)


def _fake_measuring(monkeypatch, case, peak, step=lambda n, resident: 1000.0 - resident / MiB, status="ok"):
    """Stand in for compare_run.run_contender: each row's peak is ``peak(attempt, budget, resident weights,
    workload)``, its step ``step(attempt, resident weights)``; returns the calls made (name, workloads, extra)."""
    import compare_ours_at
    from compare_run import write_row

    calls = []

    def measure(run, case_, name, family, setup, workloads, *, extra=None, per_workload=None, **_):
        calls.append((name, list(workloads), dict(extra)))
        rows = {}
        for w in workloads:
            resident = case.total_bytes - per_workload[w]["offloaded_bytes"]
            n = extra["attempt"]
            row = {"type": "row", "model": case.key, "contender": name, "family": family, **extra,
                   **per_workload[w], "workload": w, "mode": "eager"}
            if (status(n) if callable(status) else status) == "ok":
                row.update(status="ok", step_ms=step(n, resident), times_ms=[1.0] * 3, warmups=1,
                           peak_gpu_bytes=peak(n, extra["matched_budget"], resident, w))
            else:
                row.update(status="skipped", reason="time budget spent")
            rows[(w, "eager")] = write_row(run, row)
        return rows

    monkeypatch.setattr(compare_ours_at, "run_contender", measure)
    return calls


def _written(run) -> list[dict]:
    return [json.loads(line) for line in run.out.getvalue().splitlines()]


def _reported(run, name="ours auto @ diffusers best memory") -> dict[str, dict]:
    return {r["workload"]: r for r in _written(run) if r["contender"] == name}


def _other(peaks: dict[str, int]) -> dict[str, dict]:
    return {w: {"status": "ok", "peak_gpu_bytes": p} for w, p in peaks.items()}


def test_each_workload_gets_its_own_second_budget_and_the_faster_attempt_within_the_target(case, monkeypatch):
    """The runtime lands at half its resident weights: every first attempt leaves memory unused, so each
    workload is planned again at its first budget plus its own slack less the margin; more resident weights
    run faster here, so the second attempt is reported, and both are listed."""
    from compare_match import MARGIN
    from compare_ours_at import ours_at

    calls = _fake_measuring(monkeypatch, case, peak=lambda n, budget, resident, w: ACTIVATIONS[w] + resident // 2)
    targets = {"decode": 100 * MiB, "decode32": 100 * MiB, "prefill": 140 * MiB}
    run = _run()
    ours_at(run, case, _workloads(), _other(targets), "diffusers best")

    first = {w: t - ACTIVATIONS[w] for w, t in targets.items()}
    # decode and decode32 share their first budget, so one plan; prefill has its own
    assert [(c[1], c[2]["attempt"], c[2]["matched_budget"]) for c in calls[:2]] == [
        (["decode", "decode32"], 1, first["decode"]), (["prefill"], 1, first["prefill"])]
    rows = _reported(run)
    assert set(rows) == set(targets)
    for w, row in rows.items():
        one, two = row["attempts"]
        assert one["budget"] == first[w] and one["peak_gpu_bytes"] < targets[w] - 32 * MiB
        assert two["budget"] == first[w] + (targets[w] - one["peak_gpu_bytes"]) - MARGIN
        assert two["peak_gpu_bytes"] <= targets[w] and two["step_ms"] < one["step_ms"]
        assert row["chosen_attempt"] == 2 and row["within_target"] and row["matched_budget"] == two["budget"]
        assert row["step_ms"] == two["step_ms"] and row["peak_gpu_bytes"] == two["peak_gpu_bytes"]
        assert row["target_peak_gpu_bytes"] == targets[w] and "attempt_of" not in row
        assert one["predicted_ms"] and two["predicted_ms"] and row["predicted_ms"] == two["predicted_ms"]
    flagged = [r for r in _written(run) if r.get("attempt_of")]
    assert sorted((r["workload"], r["attempt"]) for r in flagged) == sorted((w, n) for w in targets for n in (1, 2))


def test_over_the_target_the_budget_moves_down_and_when_nothing_fits_the_first_is_reported(case, monkeypatch):
    from compare_ours_at import ours_at

    # every attempt lands 50 MiB over what it keeps resident: the second (lower) budget fits for decode;
    # for prefill the target is below anything the runtime reaches, so nothing fits
    _fake_measuring(monkeypatch, case, peak=lambda n, budget, resident, w: (
        ACTIVATIONS[w] + resident + (50 * MiB if n == 1 else 0) if w != "prefill" else 10**12))
    run = _run()
    ours_at(run, case, _workloads(), _other({"decode": 120 * MiB, "prefill": 120 * MiB}), "diffusers best")
    rows = _reported(run)
    decode, prefill = rows["decode"], rows["prefill"]
    assert decode["attempts"][1]["budget"] < decode["attempts"][0]["budget"]
    assert decode["attempts"][0]["peak_gpu_bytes"] > 120 * MiB >= decode["peak_gpu_bytes"]
    assert decode["chosen_attempt"] == 2 and decode["within_target"]
    assert prefill["chosen_attempt"] == 1 and not prefill["within_target"]
    assert prefill["step_ms"] == prefill["attempts"][0]["step_ms"]
    # decode32 had no peak from the other contender: skipped, with the reason
    assert rows["decode32"]["status"] == "skipped" and "GPU peak" in rows["decode32"]["reason"]


@pytest.mark.parametrize("planner_says", ["raised", "error"])
def test_a_second_plan_the_budget_cannot_hold_is_not_run_and_the_first_stands(case, monkeypatch, planner_says):
    """Far over the target, the second budget is below what the planner can hold (here it says so for any
    budget under 60 MiB: ``auto`` itself always finds an all-UVA plan): it raises the budget, or fails. The
    attempt is not run and the first is reported (over the target, with the note)."""
    import compare_ours_at
    from compare_ours import plan_at
    from compare_ours_at import ours_at

    from planner.errors import PlanningError

    def holding_60_mib(spec, budget, **options):
        if budget >= 60 * MiB:
            return plan_at(spec, budget, **options)
        if planner_says == "error":
            raise PlanningError("no plan fits")
        return plan_at(spec, 60 * MiB, **options)[0], 60 * MiB

    monkeypatch.setattr(compare_ours_at, "plan_at", holding_60_mib)
    calls = _fake_measuring(monkeypatch, case, peak=lambda n, budget, resident, w: budget + 90 * MiB)
    run = _run()
    ours_at(run, case, _workloads(), _other({"decode": 101 * MiB}), "diffusers best")
    row = _reported(run)["decode"]
    one, two = row["attempts"]
    assert row["status"] == "ok" and one["budget"] == 100 * MiB and two["budget"] < 60 * MiB
    assert two["status"] == "not run"
    if planner_says == "raised":
        assert "smallest feasible budget is 62914560 B" in two["reason"] and two["budget_raised_to"] == 60 * MiB
    else:
        assert two["reason"] == "not planned: no plan fits"
    assert [c[2]["attempt"] for c in calls] == [1]
    assert row["chosen_attempt"] == 1 and not row["within_target"]


def test_a_second_budget_giving_the_same_plan_is_not_run(case, monkeypatch):
    """At a target above the whole model the first plan offloads nothing; a larger budget gives the same
    plan, so it is not measured again."""
    from compare_ours_at import ours_at

    calls = _fake_measuring(monkeypatch, case, peak=lambda n, budget, resident, w: resident)
    run = _run()
    ours_at(run, case, _workloads(), _other({"decode": 2 * case.total_bytes}), "diffusers best")
    row = _reported(run)["decode"]
    assert row["attempts"][0]["offloaded_bytes"] == 0
    assert row["attempts"][1]["status"] == "not run" and row["attempts"][1]["reason"] == "the same plan as attempt 1"
    assert len(calls) == 1 and row["chosen_attempt"] == 1 and row["within_target"]


def test_a_second_attempt_cut_by_the_time_budget_leaves_the_first(case, monkeypatch):
    from compare_ours_at import ours_at

    _fake_measuring(monkeypatch, case, peak=lambda n, budget, resident, w: resident // 2,
                    status=lambda n: "ok" if n == 1 else "skipped")
    run = _run()
    ours_at(run, case, _workloads(), _other({"prefill": 120 * MiB}), "diffusers best")
    row = _reported(run)["prefill"]
    assert row["status"] == "ok" and row["chosen_attempt"] == 1
    assert row["attempts"][1]["status"] == "skipped" and row["attempts"][1]["reason"] == "time budget spent"


def test_a_first_attempt_not_measured_is_reported_as_its_row(case, monkeypatch):
    from compare_ours_at import ours_at

    calls = _fake_measuring(monkeypatch, case, peak=lambda *a: 0, status="skipped")
    run = _run()
    ours_at(run, case, _workloads(), _other({"decode": 100 * MiB}), "diffusers best")
    row = _reported(run)["decode"]
    assert row["status"] == "skipped" and row["reason"] == "time budget spent" and len(row["attempts"]) == 1
    assert len(calls) == 1  # no peak measured: no second attempt


# --- what every row of ours carries ---------------------------------------------------------------------

def test_auto_plans_record_each_workloads_prediction_from_its_own_plan(case):
    from compare_ours import auto_plans, plan_at, predicted_ms

    from schemas.workload import Workload

    groups = auto_plans(case.spec, 100 * MiB, _workloads())
    assert sorted(w for g in groups for w in g.names) == ["decode", "decode32", "prefill"]
    for group in groups:
        assert set(group.fields) == set(group.names)
        for w in group.names:
            own, _ = plan_at(case.spec, 100 * MiB, strategy="auto", workload=Workload({w: dict(_workloads().root)[w]}))
            assert group.fields[w] == {"predicted_ms": predicted_ms(own, w),
                                       "offloaded_bytes": own.summary.offloaded_bytes}


def test_a_rows_own_bound_is_the_floor_or_what_its_plan_offloads_over_the_link(case):
    from compare_run import ratios

    run = _run()
    run.h2d_gbps = 50.0  # GB/s: 50e6 bytes a millisecond
    case.floor_ms = {"decode": 10.0, "prefill": 40.0}
    case.link_bound_ms = {"decode": 100.0, "prefill": 100.0}
    got = ratios(run, case, "decode", 120.0, moved=None, offloaded=3_000_000_000)  # 60 ms over the link
    assert got["own_bound_ms"] == 60.0 and got["ratio_own"] == 2.0 and got["ratio_link"] == 1.2
    got = ratios(run, case, "prefill", 80.0, moved=None, offloaded=1_000_000_000)  # 20 ms: the floor is higher
    assert got["own_bound_ms"] == 40.0 and got["ratio_own"] == 2.0
    assert "ratio_own" not in ratios(run, case, "decode", 120.0, moved=None)  # not a plan of ours


def test_a_first_plan_that_fails_is_a_skipped_row_with_the_planners_reason(case, monkeypatch):
    import compare_ours_at
    from compare_ours_at import ours_at

    from planner.errors import PlanningError

    def failing(spec, budget, **options):
        raise PlanningError("spec has no layers to offload")

    monkeypatch.setattr(compare_ours_at, "plan_at", failing)
    calls = _fake_measuring(monkeypatch, case, peak=lambda *a: 0)
    run = _run()
    ours_at(run, case, _workloads(), _other({"decode": 100 * MiB}), "diffusers best")
    row = _reported(run)["decode"]
    assert row["status"] == "skipped" and row["reason"] == "not planned: spec has no layers to offload"
    assert row["attempts"] == [{**row["attempts"][0], "status": "not run", "budget": 99 * MiB}] and not calls
