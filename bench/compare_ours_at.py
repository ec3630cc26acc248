"""Running ``auto`` at the GPU memory another contender measured: the attempts compare_match.py decides,
each measured like any contender (compare_run.py), and the row reported under ``ours auto @ <label> memory``.
"""

from __future__ import annotations

from planner.errors import InfeasibleError, PlanningError
from schemas.workload import Workload

from compare_match import Attempt, choose, next_budget
from compare_ours import apply_plan, layout_key, plan_at, plan_fields
from compare_run import Case, Run, run_contender, skip_row, write_row


def targets_of(run: Run, case: Case, other: dict, name: str) -> dict[str, int]:
    """Each workload's target peak (the other contender's measured one); a skipped row for a workload without
    one (or without the floor's peak, which the first budget needs)."""
    targets = {}
    for w in case.inputs:
        row = other.get(w)
        if not row or row.get("status") != "ok" or row.get("peak_gpu_bytes") is None or w not in case.floor_peak:
            skip_row(run, case, name, "ours", w, "no GPU peak measured for it (or for the floor)")
            continue
        targets[w] = row["peak_gpu_bytes"]
    return targets


def plan_attempt(case: Case, workloads: Workload, number: int, budget: int, names: list[str],
                 tried: dict[str, list[Attempt]]) -> tuple[object | None, int | None, str | None]:
    """(plan, raised budget, why it is not to be run): ``auto`` for ``names`` at ``budget``. A later attempt
    is not run when the planner had to raise the budget or failed, or when it gives the first attempt's plan."""
    try:
        plan, raised = plan_at(case.spec, budget, strategy="auto",
                               workload=Workload({w: dict(workloads.root)[w] for w in names}))
    except (InfeasibleError, PlanningError) as err:
        return None, None, f"not planned: {err}"[:300]
    if number > 1 and raised is not None:
        return plan, raised, f"infeasible at {budget} B (the smallest feasible budget is {raised} B)"
    if number > 1 and all(tried[w][0].layout == layout_key(plan) for w in names):
        return plan, raised, "the same plan as attempt 1"
    return plan, raised, None


def attempt(run: Run, case: Case, workloads: Workload, name: str, number: int, budgets: dict[str, int],
            tried: dict[str, list[Attempt]]) -> None:
    """Attempt ``number`` of every workload in ``budgets`` (workload -> budget; workloads of equal budget
    share one plan), measured unless plan_attempt says not to, appended to ``tried``."""
    groups: dict[int, list[str]] = {}
    for w, budget in budgets.items():
        groups.setdefault(budget, []).append(w)
    for budget, names in groups.items():
        plan, raised, why = plan_attempt(case, workloads, number, budget, names, tried)
        rows = {}
        if why is None:
            rows = run_contender(run, case, f"{name} (attempt {number})", "ours", apply_plan(plan, run.device),
                                 names, extra={"attempt_of": name, "attempt": number, "matched_budget": budget,
                                               "budget_raised_to": raised},
                                 per_workload=plan_fields(plan, names))
        layout = None if plan is None else layout_key(plan)
        for w in names:
            tried.setdefault(w, []).append(Attempt(number, budget, raised, layout, rows.get((w, "eager")), why))


def report(run: Run, case: Case, name: str, workload: str, target: int, attempts: list[Attempt]) -> dict:
    """The row under ``name`` for ``workload``: the chosen attempt's row, with every attempt listed."""
    records = [a.record() for a in attempts]
    chosen = choose(target, records)
    pick = attempts[0 if chosen is None else chosen]
    match = {"target_peak_gpu_bytes": target, "attempts": records, "within_target": chosen is not None,
             "chosen_attempt": pick.number, "matched_budget": pick.budget}
    if pick.row is None:
        return skip_row(run, case, name, "ours", workload, pick.reason or "not run", extra=match)
    row = {k: v for k, v in pick.row.items() if k not in ("attempt_of", "attempt")}
    return write_row(run, {**row, "contender": name, **match})


def ours_at(run: Run, case: Case, workloads: Workload, other: dict, label: str) -> None:
    """``auto`` at the GPU memory ``other``'s rows (by workload) measured: up to two attempts per workload,
    the reported row named ``ours auto @ <label> memory``."""
    name = f"ours auto @ {label} memory"
    targets = targets_of(run, case, other, name)
    first = {w: max(1, t - (case.floor_peak[w] - case.total_bytes)) for w, t in targets.items()}
    tried: dict[str, list[Attempt]] = {}
    attempt(run, case, workloads, name, 1, first, tried)
    second = {w: b for w in targets if (b := next_budget(first[w], targets[w], tried[w][0].peak,
                                                                          tried[w][0].planned)) is not None}
    attempt(run, case, workloads, name, 2, second, tried)
    for w, target in targets.items():
        report(run, case, name, w, target, tried[w])
