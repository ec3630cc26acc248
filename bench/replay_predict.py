"""The rows of a bench_predict_h200.py run predicted again by today's cost model, on the CPU (issue 19).

    PYTHONPATH=. python bench/replay_predict.py bench/results/predict-h200-2026-12-01/predict-h200.jsonl
    PYTHONPATH=. python bench/replay_predict.py RUN.jsonl --json after.jsonl     # also one JSON line per row

Each measured plan is made again from the spec of its model (built on the meta device: no weights, no GPU)
and predicted with the run's own profile (its ``profile`` row) at the run's workloads; the table gives the
prediction the run wrote, today's, the measured step and both ratios, then how many plans and pairs are
within 10% before and after. A run that saved its plans (``plans.jsonl`` beside the rows, as the bench does
now, or a ``plans/`` folder of files, as it did until 2026-12-03) is replayed from them, exactly. Older runs
saved none: a plan is then made again from its case
(bench_predict_h200.PLANS), and where today's planner cuts a budget differently (its peak reckoning has
changed since) the budget is raised to the smallest one whose plan offloads what the run's did, so that
the plan replayed is the plan measured; a plan that cannot be matched so is listed as not replayed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_predict_h200 as bench  # noqa: E402

WITHIN = 0.10


def _signature(plan) -> tuple:
    s = plan.summary
    return s.offloaded_bytes, s.offloaded_layers, s.backend, s.prefetch_step


def _row_signature(row: dict) -> tuple:
    return row["offloaded_bytes"], row["offloaded_layers"], row["backend"], row["prefetch_step"]


def matched_plan(case, spec, total: int, hw, workload, row: dict):
    """The case's plan as the run measured it: made as the bench makes it, else (a budget case whose cut moved)
    at the smallest budget from the run's up whose plan offloads the run's bytes; None when none does."""
    plan, _ = bench.make_plan(case, spec, total, hw, workload)
    want = _row_signature(row)
    if _signature(plan) == want or case.budget is None or row.get("gpu_budget") is None:
        return plan if _signature(plan) == want else None
    for options in (dict(case.options), _one_backend(case.options, row["backend"])):
        found = _at_matching_budget(options, spec, total, hw, workload, row)
        if found is not None:
            return found
    return None


def _one_backend(options: dict, backend: str) -> dict:
    """``options`` with every kind on the run's backend: an ``auto`` plan whose choice of backend has moved since,
    made with the backend the run's plan had."""
    if backend not in ("uva", "prefetch"):
        return options
    kinds = ("embedding", "attention", "dense_mlp", "routed_experts", "shared_experts")
    return dict(options, backends={kind: backend for kind in kinds})


def _at_matching_budget(options: dict, spec, total: int, hw, workload, row: dict):
    want = _row_signature(row)

    def at(budget: int):
        return bench.planner.plan(spec, hardware=hw, workload=workload, **options, gpu_budget=budget)

    lo, hi = row["gpu_budget"], min(total, row["gpu_budget"] + (4 << 30))  # offloaded bytes never rise with the budget
    while hi - lo > 1 << 20:
        mid = (lo + hi) // 2
        try:
            offloaded = at(mid).summary.offloaded_bytes
        except bench.PlannerError:
            lo = mid
            continue
        if offloaded > want[0]:
            lo = mid
        else:
            hi = mid
    plan = at(hi)
    return plan if _signature(plan) == want else None


def without_fields(hw, fields: list[str]):
    """``hw`` with each of ``fields`` back at its default (an optional figure absent, as a profile without it): what
    a figure changes, replayed side by side."""
    from schemas.hardware_profile import HardwareProfile

    known = HardwareProfile.model_fields
    unknown = [f for f in fields if f not in known or known[f].is_required()]
    if unknown:
        optional = ", ".join(f for f, info in known.items() if not info.is_required())
        raise SystemExit(f"--without {', '.join(unknown)}: not a hardware profile figure with a default (those: "
                         f"{optional})")
    return hw.model_copy(update={f: known[f].get_default(call_default_factory=True) for f in fields})


def replay(path: Path, profile=None, cache: Path | None = None, without: list[str] | None = None) -> list[dict]:
    """One dict per measured row: the run's prediction, today's, the measured step. ``cache``: a folder that keeps
    the plans made again (a later replay of the same run reads them instead of searching again)."""
    import torch

    from schemas import dump_model

    from schemas.hardware_profile import HardwareProfile
    from schemas.io import load_model, load_plan
    from schemas.plan import Plan

    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in lines if r["type"] == "row"]
    made = HardwareProfile.model_validate(next(r for r in lines if r["type"] == "profile")["profile"])
    hw = profile or made  # plans are made again with the run's profile (the plans measured), predicted with ``hw``
    if without:
        hw = without_fields(hw, without)
    dry = any(r.get("dry_run") for r in lines if r["type"] == "env")
    workload = bench.DRY_WORKLOADS if dry else bench.WORKLOADS
    saved = path.parent / "plans"  # a plan a file (runs until 2026-12-03), or every plan in bench.PLANS_FILE
    packed = {}
    if (path.parent / bench.PLANS_FILE).exists():
        for line in (path.parent / bench.PLANS_FILE).read_text().splitlines():
            entry = json.loads(line)
            packed[entry["file"]] = entry["yaml"]
    routings = {r["model"]: r["shares"] for r in lines if r["type"] == "routing" and "shares" in r}
    # the bench predicts the routed eager rows with the model's own CPU times (its ``cpu`` row: a block, and outside
    # the blocks where the row has it), as here
    own_cpu = {r["model"]: bench.own_cpu_figures(r) for r in lines if r["type"] == "cpu"}
    out = []
    for kind in dict.fromkeys(r["model"] for r in rows):
        model, _ = bench.build_model(kind, dry, torch.device("meta"))
        spec = bench.runtime.describe(model, name=kind)
        total = sum(layer.nbytes for layer in spec.model.expanded())
        for label in dict.fromkeys(r["plan"] for r in rows if r["model"] == kind):
            measured = [r for r in rows if r["model"] == kind and r["plan"] == label]
            file = saved / measured[0]["plan_file"] if measured[0].get("plan_file") else None
            kept = cache / f"{kind}--{label.replace('/', '_')}.plan.yaml" if cache is not None else None
            case = next((c for c in bench.PLANS if c.model == kind and c.label == label), None)
            if measured[0].get("plan_file") in packed:
                plan = load_model(Plan, measured[0]["plan_file"], packed[measured[0]["plan_file"]])
            elif file is not None and file.exists():
                plan = load_plan(file)
            elif kept is not None and kept.exists():
                plan = load_plan(kept)
            elif case is not None:
                plan = matched_plan(case, spec, total, made, workload, measured[0])
                if plan is not None and kept is not None:
                    kept.write_text(dump_model(plan))
            else:
                plan = None
            now, routed = {}, {}
            if plan is not None:
                from planner.cost.predict import predict

                names = [name for name, _ in workload.items()]
                for mode in dict.fromkeys(r.get("mode", "eager") for r in measured):
                    now.update({(p.workload, mode): p.step_ms
                                for p in predict(plan, hw, bench.in_mode(workload, mode)).workloads})
                    on = hw.model_copy(update=own_cpu.get(kind, {})) if mode == "eager" else hw
                    recorded = routings.get(kind, {})  # the routing measured on the inputs timed
                    for name, item in workload.items() if recorded else ():
                        shares = bench.sampled_shares(recorded, name, item.tokens)  # None: uniform
                        step = predict(plan, on, bench.in_mode(workload, mode), shares).workloads[names.index(name)]
                        routed[(name, mode)] = step.step_ms
            for r in measured:
                mode = r.get("mode", "eager")
                after = now.get((r["workload"], mode))
                out.append({"model": kind, "plan": label, "workload": r["workload"], "mode": mode,
                            "measured_ms": r["measured_ms"],
                            "before_ms": r["predicted_ms"], "after_ms": after,
                            "before": round(r["predicted_ms"] / r["measured_ms"], 4),
                            "after": None if after is None else round(after / r["measured_ms"], 4),
                            "routed_before": (round(r["predicted_routed_ms"] / r["measured_ms"], 4)
                                              if r.get("predicted_routed_ms") else None),
                            "routed_after": (round(routed[(r["workload"], mode)] / r["measured_ms"], 4)
                                             if (r["workload"], mode) in routed else None)})
    return out


def tally(rows: list[dict], key: str) -> tuple[int, int, int, int]:
    """(pairs within 10%, pairs, plans within 10% in every workload, plans) for ratio ``key``."""
    pairs = [r for r in rows if r[key] is not None]
    plans: dict[tuple, bool] = {}
    for r in pairs:
        ok = abs(r[key] - 1) <= WITHIN
        plans[(r["model"], r["plan"])] = plans.get((r["model"], r["plan"]), True) and ok
    return (sum(abs(r[key] - 1) <= WITHIN for r in pairs), len(pairs), sum(plans.values()), len(plans))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", type=Path, help="a predict-h200.jsonl")
    ap.add_argument("--profile", help="predict with this profile (name or file) instead of the run's")
    ap.add_argument("--json", type=Path, help="also write one JSON line per row here")
    ap.add_argument("--cache", type=Path, help="keep the plans made again in this folder, and read them from it")
    ap.add_argument("--without", action="append", default=[], metavar="FIELD",
                    help="predict with this profile figure at its default (absent), e.g. matmul_gbps_rows; repeatable")
    args = ap.parse_args(argv)
    profile = None
    if args.profile:
        from schemas.hardware import load_hardware

        profile = load_hardware(args.profile)
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
    rows = replay(args.rows, profile, args.cache, args.without)
    for r in rows:
        after = "not replayed" if r["after_ms"] is None else f"{r['after_ms']:9.2f} x{r['after']:.3f}"
        flag = "" if r["after"] is None or abs(r["after"] - 1) <= WITHIN else "  <-"
        print(f"{r['model']:5} {r['plan'][:50]:50} {r['workload']:8} {r['mode']:5} measured {r['measured_ms']:8.2f}  "
              f"before {r['before_ms']:8.2f} x{r['before']:.3f}  now {after}{flag}")
    for mode in dict.fromkeys(r["mode"] for r in rows):
        for key in ("before", "after", "routed_before", "routed_after"):
            within, pairs, plans_ok, plans = tally([r for r in rows if r["mode"] == mode], key)
            if pairs:  # routed: predicted with the routing measured on the inputs timed (MoE; runs that saved it)
                print(f"{mode:5} {key:13}: {within} of {pairs} pairs within 10%, {plans_ok} of {plans} plans within "
                      "10% in every workload")
    if args.json:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
