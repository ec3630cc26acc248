"""strategy auto against the fastest plan of a grid, measured on the GPU, and exactness of auto's mixed plans.

    python bench/bench_auto.py --out $OUT/auto.jsonl

Llama-3-8B shape (transformers, random bf16 weights, 16 GB) at 4, 8 and 12 GB x decode b=1, decode b=32,
prefill 2,048: auto's plan for that workload, and the grid backend {prefetch, UVA} x group {1/1, 2/1, 4/1,
4/2, 4/3} x step {1, 2, 3} plus the budget strategy's prefetch and UVA plans. Every grid plan that fits is
predicted with the bundled profile; the two predicted fastest are measured beside auto's (measuring all
~30 would not fit the device time; the cost model was measured within 0.95-1.0x of these plans). A
Qwen3-MoE shape at 12 GB, decode b=1: auto against the predicted-fastest prefetch-only plan. Outputs of
auto's plans are compared with the unoffloaded model's (torch.equal on the logits).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from bench_cost import build, inputs, timer  # noqa: E402

import planner  # noqa: E402
import runtime  # noqa: E402
from planner.errors import InfeasibleError, PlanningError  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402

WORKLOADS = {"decode": WorkloadItem(tokens=1), "decode32": WorkloadItem(tokens=32),
             "prefill": WorkloadItem(tokens=2048)}
GROUPS = [(1, 1), (2, 1), (4, 1), (4, 2), (4, 3)]


def grid(spec, budget: int, workload: Workload):
    plans = {}
    for backend in ("prefetch", "uva"):
        for g, k in GROUPS:
            for step in ((1, 2, 3) if backend == "prefetch" else (None,)):
                try:
                    plans[f"{backend} group {k}/{g}" + (f" step {step}" if step else "")] = planner.plan(
                        spec, gpu_budget=budget, backend=backend, strategy="group", group_size=g, num_in_group=k,
                        prefetch_step=step, workload=workload)
                except (InfeasibleError, PlanningError):
                    pass
        try:
            plans[f"{backend} budget"] = planner.plan(spec, gpu_budget=budget, backend=backend, strategy="budget",
                                                      workload=workload)
        except (InfeasibleError, PlanningError):
            pass
    return plans


def measure(plan, model, ids, device, reference=None) -> tuple[float, bool | None]:
    handle = runtime.apply(plan, model, device=str(device))
    try:
        slow = plan.summary.backend in ("uva", "mixed") and ids.numel() >= 2048
        ms = timer(device, lambda: model(ids, use_cache=False), repeat=3 if slow else 7, warmup=1 if slow else 2)
        same = None
        if reference is not None:
            with torch.inference_mode():
                same = bool(torch.equal(model(ids, use_cache=False).logits, reference))
        return ms, same
    finally:
        handle.remove()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    out = open(args.out, "w")

    def row(**r):
        print(json.dumps(r), flush=True)
        out.write(json.dumps(r) + "\n")
        out.flush()

    model, config = build("llama", args.small, device)
    spec = runtime.describe(model, name="llama")
    total = sum(layer.nbytes for layer in spec.model.expanded())
    budgets = [int(total * f) for f in (0.6, 0.75, 0.9)] if args.small else [4 * 10**9, 8 * 10**9, 12 * 10**9]
    refs = {}
    with torch.inference_mode():
        for name, item in WORKLOADS.items():
            ids = inputs(item if not args.small else WorkloadItem(tokens=min(item.tokens, 64)), name,
                         config.vocab_size, device)
            refs[name] = (ids, model(ids, use_cache=False).logits.clone())
    for budget in budgets:
        for name, item in WORKLOADS.items():
            workload = Workload({name: item})
            ids, ref = refs[name]
            auto = planner.plan(spec, gpu_budget=budget, strategy="auto", workload=workload)
            predicted = {label: p.predictions.weighted_step_ms for label, p in grid(spec, budget, workload).items()}
            best = sorted(predicted, key=predicted.get)[:2]
            plans = grid(spec, budget, workload)
            auto_ms, same = measure(auto, model, ids, device, ref)
            measured = {label: measure(plans[label], model, ids, device)[0] for label in best}
            fastest = min(measured.values())
            row(model="llama", budget=budget, workload=name, auto_backend=auto.summary.backend,
                auto_peak=auto.summary.peak_gpu_bytes, auto_predicted=auto.predictions.weighted_step_ms,
                auto_ms=round(auto_ms, 3), auto_equal=same, grid_predicted=predicted,
                grid_measured={k: round(v, 3) for k, v in measured.items()},
                auto_over_best=round(auto_ms / fastest, 4), grid_fitting=len(predicted))
    del model, refs
    torch.cuda.empty_cache() if device.type == "cuda" else None
    model, config = build("moe", args.small, device)
    spec = runtime.describe(model, name="moe")
    total = sum(layer.nbytes for layer in spec.model.expanded())
    budget = int(total * 0.7) if args.small else 12 * 10**9
    workload = Workload({"decode": WORKLOADS["decode"]})
    ids = inputs(WORKLOADS["decode"], "decode", config.vocab_size, device)
    with torch.inference_mode():
        ref = model(ids, use_cache=False).logits.clone()
    auto = planner.plan(spec, gpu_budget=budget, strategy="auto", workload=workload)
    prefetch_only = {}
    for label, opts in [("prefetch budget step 1", dict(prefetch_step=1)), ("prefetch budget step 2", {}),
                        ("prefetch budget experts step 1", dict(kinds=["routed_experts"], prefetch_step=1)),
                        ("prefetch budget experts step 2", dict(kinds=["routed_experts"]))]:
        try:
            prefetch_only[label] = planner.plan(spec, gpu_budget=budget, backend="prefetch", workload=workload, **opts)
        except (InfeasibleError, PlanningError):
            pass
    predicted = {k: p.predictions.weighted_step_ms for k, p in prefetch_only.items()}
    best = min(predicted, key=predicted.get)
    auto_ms, same = measure(auto, model, ids, device, ref)
    best_ms, _ = measure(prefetch_only[best], model, ids, device)
    row(model="moe", budget=budget, workload="decode", auto_backend=auto.summary.backend,
        auto_predicted=auto.predictions.weighted_step_ms, auto_ms=round(auto_ms, 3), auto_equal=same,
        prefetch_only_predicted=predicted, prefetch_only_best=best, prefetch_only_ms=round(best_ms, 3),
        speedup=round(best_ms / auto_ms, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
