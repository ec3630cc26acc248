"""The decode steps bench_memory.py measured, predicted again by this tree's cost model (CPU, seconds).

    PYTHONPATH=. python bench/decode_rows.py                                   # the 2026-12-01 H200 rows
    PYTHONPATH=. python bench/decode_rows.py bench/results/NEW/memory.jsonl    # a rerun's rows

Every row with a measured decode step (``throughput`` rows; ``memory`` rows of a rerun that time their steps)
names its model, budget, batch and context, the bytes its plan offloaded and the step it predicted then. The
model's spec is described from its transformers class on the meta device (bench_memory.py's shapes, no
weights). The plan measured is found again: the plan of that workload at the budget, or, where this tree
counts more or fewer bytes besides the weights than the tree that ran (activations), at the budget whose plan
offloads the same bytes (auto's order does not depend on the budget, so the bytes offloaded fall as the budget
grows). Printed: one line a row (measured, predicted then, predicted now, measured / predicted) and the count
within 10%; ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from bench_cost import random_model  # noqa: E402

import planner  # noqa: E402
import runtime  # noqa: E402
from planner.errors import InfeasibleError  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402

RAW = Path(__file__).resolve().parent / "results" / "memory-h200-2026-12-01"
DEFAULT_ROWS = (RAW / "memory.jsonl", RAW / "memory-moe-phi3.jsonl")


def spec_of(kind: str, dry_run: bool):
    """The spec bench_memory.py planned with: its model's shapes (the tiny ones of a dry run) on the meta device."""
    import transformers
    from bench_memory import CLASSES, FULL, SMALL, Setup, described

    config_cls, model_cls = (getattr(transformers, n) for n in CLASSES[kind])
    model = random_model(model_cls, config_cls(**(SMALL if dry_run else FULL)[kind]), torch.device("meta"))
    return described(model, kind, Setup(dry_run, "meta"))


def timed_rows(paths) -> list[dict]:
    """The rows with a measured decode step, each with its run's context and dry-run flag."""
    out = []
    for p in paths:
        rows = [json.loads(line) for line in Path(p).read_text().splitlines() if line.strip()]
        setup = next((r for r in rows if r["kind"] == "setup"), {})
        out += [{"context": setup.get("context", 4096), "dry_run": setup.get("dry_run", False), **r}
                for r in rows if r.get("measured_step_ms") is not None]
    return out


def plan_as_run(spec, row: dict):
    """The plan of the row's workload that offloads the bytes the measured plan offloaded (None: none found)."""
    item = WorkloadItem(batch=row["batch"], context=row["context"], logits=row.get("logits"),
                        mode=row.get("mode", "eager"))

    def at(budget: int):
        try:
            return planner.plan(spec, gpu_budget=budget, workload=Workload({"decode": item}))
        except InfeasibleError:
            return None

    want = row["offloaded_bytes"]
    plan = at(row["budget"])
    if plan is not None and plan.summary.offloaded_bytes == want:
        return plan
    lo, hi = row["budget"] // 2, row["budget"] * 2  # the budget at which the plan offloads `want` bytes
    for _ in range(48):
        mid = (lo + hi) // 2
        p = at(mid)
        if p is None or p.summary.offloaded_bytes > want:
            lo = mid
        else:
            hi, plan = mid, p
        if hi - lo <= 1 << 16:
            break
    return plan if plan is not None and plan.summary.offloaded_bytes == want else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="*", type=Path, help="bench_memory.py JSONL files (default: the 2026-12-01 rows)")
    ap.add_argument("--only", action="append", help="these models only (repeatable)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--profile", help="predict the plans found (made with the bundled profile, as the run's were) "
                    "with this profile (name or file)")
    args = ap.parse_args(argv)
    rows = [r for r in timed_rows(args.rows or DEFAULT_ROWS) if not args.only or r["model"] in args.only]
    specs = {(kind, dry): spec_of(kind, dry) for kind, dry in sorted({(r["model"], r["dry_run"]) for r in rows})}
    out, within = [], 0
    for r in rows:
        plan = plan_as_run(specs[r["model"], r["dry_run"]], r)
        now = plan.predictions.workloads[0].step_ms if plan is not None else None
        if plan is not None and args.profile:
            from planner.cost.predict import predict
            from schemas.hardware import load_hardware

            item = WorkloadItem(batch=r["batch"], context=r["context"], logits=r.get("logits"),
                                mode=r.get("mode", "eager"))
            now = predict(plan, load_hardware(args.profile), Workload({"decode": item})).workloads[0].step_ms
        ratio = r["measured_step_ms"] / now if now else None
        within += ratio is not None and 0.9 <= ratio <= 1.1
        out.append({k: r.get(k) for k in ("model", "budget", "batch", "context", "cache", "offloaded_bytes",
                                          "measured_step_ms", "predicted_step_ms")} |
                   {"predicted_now_ms": now, "measured_over_now": round(ratio, 3) if ratio else None})
        then = r["measured_step_ms"] / r["predicted_step_ms"]
        print(f"{r['model']:6} {r['budget'] / 1e9:5.1f} GB batch {r['batch']:4} {r.get('cache') or 'static':7} "
              f"{r.get('mode', 'eager'):5} "
              f"measured {r['measured_step_ms']:8.2f} ms  predicted then {r['predicted_step_ms']:8.2f} ({then:4.2f}x)"
              f"  now " + (f"{now:8.2f} ({ratio:4.2f}x)" if now else "(plan not found)"))
    print(f"within 10% now: {within} of {len(rows)}")
    if args.json:
        args.json.write_text("".join(json.dumps(o) + "\n" for o in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
