"""Each order strategy auto weighs (the tiered orders and the greedy one), by its own plan at many budgets.

    PYTHONPATH=. python bench/results/search-2026-12-02/orders_sweep.py llama-3-8b 1 2 16

args: bundled spec, tokens of the one workload item, lowest and highest budget of weights and buffers (GB). For
each order: its path's plan (AutoPath.choose) at 201 budgets between them, and its worst ratio to the fastest of
these orders at the same budget; and its plan at the 75% cell's budget of bench_search (12.01 GB for
Llama-3-8B). The 2026-12-02 output: orders-sweep-llama-3-8b.txt.
"""

import sys

import planner
from planner.layers import eligible_params
from planner.strategy import auto
from planner.strategy.auto_order import build_order, candidate_prefers, greedy_order, large_kinds
from planner.strategy.auto_slots import AutoPath
from schemas import load_spec
from schemas.workload import Workload, WorkloadItem

name, tokens, lo, hi = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) * 1e9, float(sys.argv[4]) * 1e9
spec = load_spec(f"examples/generated/{name}.yaml")
workload = Workload({("prefill" if tokens >= 2048 else "decode"): WorkloadItem(tokens=tokens)})
total = sum(layer.nbytes for layer in spec.model.expanded())
seen = {}
decide = auto.decide


def _capture(*args, **kwargs):
    seen["args"] = args
    return decide(*args, **kwargs)


auto.decide = _capture
planner.plan(spec, gpu_budget=int(total * 0.75), strategy="auto", workload=workload)  # auto's own inputs
layers, shared, memory, offload, hw, wl, step, total_bytes, cost = seen["args"]
cell = memory.gpu_budget
eligible = {layer.index: eligible_params(layer, offload.params, shared.get(layer.name, set()), offload.kinds)
            for layer in layers}
tiers = candidate_prefers(layers, eligible)
uva = build_order(layers, eligible, hw, wl, step, {}, "uva", ())
paths = {str(t): AutoPath(layers, build_order(layers, eligible, hw, wl, step, {}, None, *t), total_bytes, cost, step,
                          uva) for t in tiers}
base = build_order(layers, eligible, hw, wl, step, {}, None, (), large_kinds(tiers))
paths["greedy"] = AutoPath(layers, greedy_order(layers, base, cost, total_bytes, len(large_kinds(tiers))), total_bytes,
                           cost, step, uva)
budgets = [int(lo + (hi - lo) * k / 200) for k in range(201)]


def _ms(path, budget):
    found = path.choose(budget, None)
    return path.step_ms(found.step) if hasattr(found, "step") else float("inf")


ms = {p: [_ms(path, b) for b in budgets] for p, path in paths.items()}
best = [min(ms[p][i] for p in paths) for i in range(len(budgets))]
for p, path in paths.items():
    ratio = [m / b for m, b in zip(ms[p], best)]
    i = ratio.index(max(ratio))
    print(f"{p:36} worst ratio {max(ratio):.3f} at {budgets[i] / 1e9:.2f} GB ({ms[p][i]:.1f} ms against "
          f"{best[i]:.1f}); at {cell / 1e9:.2f} GB: {_ms(path, cell):.2f} ms")
