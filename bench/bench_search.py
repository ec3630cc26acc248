"""strategy auto against an exhaustive search of plans, by predicted step (no GPU: the cost model only).

    python bench/bench_search.py                      # the table: 4 specs x 25/50/75 % x 3 workloads
    python bench/bench_search.py --spec llama-3-8b --budget 0.5 --workload decode

For each bundled spec (examples/generated/), GPU budget (a share of the model's bytes) and workload,
the search predicts every plan of these families and keeps the fastest that fits:

- *which layers*: the block stack's layers ``n`` of ``M`` spread evenly (the budget strategy's priority
  order, planner/strategy/spread_order.py), vLLM's group rule (the last ``k`` of every ``g``), and two
  kinds on their own spreads (every layer's params of one kind, then ``n`` layers' of another: the
  budget strategy's prefer ladder);
- *which backend per kind* (the per-kind mixes): each large kind of the blocks (attention, dense MLP,
  routed and shared experts) resident, on UVA or prefetched; norms and routers stay resident;
- the embedding and the LM head resident or on UVA;
- 1 to 4 buffer slots.

In each family the first fitting layer counts (fewest layers offloaded) are predicted: offloading more
of the same never made a step faster in this cost model's families, and it keeps the search to a few
minutes. Each plan is predicted by ``PlacementCost`` (planner/cost/placement.py), the function strategy
auto predicts with, so a change of the cost model flows into both sides. auto's own plan is made by
``planner.plan`` and predicted the same way. One JSON line per cell, then the table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import planner  # noqa: E402
from planner.build import _merge, _model  # noqa: E402
from planner.cost.placement import PlacementCost  # noqa: E402
from planner.errors import InfeasibleError  # noqa: E402
from schemas.kinds import param_kind  # noqa: E402
from planner.layers import group_rule  # noqa: E402
from planner.memory.parts import MemoryModel, weights_budget  # noqa: E402
from planner.strategy.peaks import exact_pool  # noqa: E402
from planner.strategy.spread_order import last_first  # noqa: E402
from schemas import load_spec  # noqa: E402
from schemas.hardware import HardwareProfile, load_hardware  # noqa: E402
from schemas.spec import SpecFile  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402

SPECS = ("llama-3-8b", "llama-3-70b", "mixtral-8x7b", "qwen3-30b-a3b")
BUDGETS = (0.25, 0.5, 0.75)
WORKLOADS = {"decode": WorkloadItem(tokens=1), "decode32": WorkloadItem(tokens=32),
             "prefill": WorkloadItem(tokens=2048)}
MOVING = ("attention", "dense_mlp", "routed_experts", "shared_experts")  # kinds whose backend the search varies
GROUPS = ((2, 1), (3, 1), (4, 1), (3, 2), (4, 2), (4, 3), (8, 1), (8, 7))
SLOTS = (1, 2, 3, 4)
FIRST_FITS = 3  # fitting layer counts predicted per family


@dataclass(frozen=True)
class Candidate:
    label: str
    placed: dict[int, dict[str, str]]  # position -> param -> backend
    slots: int
    peak: int


class Space:
    """The plans of one spec, with their peaks (the same for every budget and workload)."""

    def __init__(self, spec: SpecFile, slots: Sequence[int] = SLOTS, kinds: Sequence[str] = MOVING):
        memory, offload = _merge(spec, {}, {"strategy": "budget"})
        m = _model(spec, memory, offload)
        self.sizes = MemoryModel(spec.model, spec.model.expanded(), memory)  # the parts besides the weights
        self.spec, self.layers, self.total = spec, m.layers, m.total_bytes
        self.stack = [p for p, _ in m.candidates]
        self.params = {p: [(t.name, param_kind(m.layers[p].name, t.name, t.kind)) for t in ts]
                       for p, ts in m.candidates}
        present = {k for ps in self.params.values() for _, k in ps}
        self.kinds = [k for k in kinds if k in present]
        in_stack = set(self.stack)
        shared = {name for names in m.shared.values() for name in names}
        self.extras = [(layer.index, tuple(t.name for t in layer.params if t.name not in shared))
                       for layer in m.layers if layer.index not in in_stack and layer.nbytes > self.total // 200]
        self.slots = tuple(slots)
        self._pools: dict[tuple, int] = {}

    def _layer(self, position: int, backend: dict[str, str]) -> dict[str, str]:
        return {name: backend[kind] for name, kind in self.params[position] if backend.get(kind, "gpu") != "gpu"}

    def sets(self, backend: dict[str, str]) -> Iterator[tuple[str, list[dict[int, dict[str, str]]]]]:
        """Families of stack placements, each ordered by growing offload (labels for the table)."""
        m = len(self.stack)
        order = last_first(m)
        yield "spread", [{self.stack[j]: self._layer(self.stack[j], backend) for j in sorted(order[:n])}
                         for n in range(1, m + 1)]
        for g, k in GROUPS:
            if g <= m:
                yield f"group {k}/{g}", [{self.stack[j]: self._layer(self.stack[j], backend)
                                          for j in group_rule(m, g, k)}]
        moving = [kind for kind in self.kinds if backend.get(kind, "gpu") != "gpu"]
        for first, then in itertools.permutations(moving, 2):
            base = {kind: backend[kind] for kind in moving if kind != then}
            family = []
            for n in range(1, m + 1):
                on = set(sorted(order[:n]))
                family.append({self.stack[j]: self._layer(self.stack[j], backend if j in on else base)
                               for j in range(m)})
            yield f"all {first}, then {then} spread", family

    def candidates(self) -> Iterator[tuple[str, list[Candidate]]]:
        for states in itertools.product(("gpu", "uva", "prefetch"), repeat=len(self.kinds)):
            backend = dict(zip(self.kinds, states))
            if all(s == "gpu" for s in states):
                continue
            mix = ", ".join(f"{k} {s}" for k, s in backend.items())
            for extra in itertools.product(("gpu", "uva"), repeat=len(self.extras)):
                outside = {p: dict.fromkeys(names, "uva") for (p, names), s in zip(self.extras, extra) if s == "uva"}
                out = ", ".join(self.layers[p].name for (p, _), s in zip(self.extras, extra) if s == "uva")
                prefetches = "prefetch" in states
                for slots in (self.slots if prefetches else (1,)):
                    for what, family in self.sets(backend):
                        plans = []
                        for stack in family:
                            placed = {p: ps for p, ps in stack.items() if ps} | outside
                            plans.append(Candidate(f"{what}: {mix}" + (f"; {out} on UVA" if out else "")
                                                   + (f"; {slots} slots" if prefetches else "")
                                                   + f" ({sum(1 for p in stack if stack[p])} layers)",
                                                   placed, slots, self.peak(placed, slots)))
                        yield what, plans

    def peak(self, placed: dict[int, dict[str, str]], slots: int) -> int:
        key = (tuple((p, tuple(ps.items())) for p, ps in sorted(placed.items())), slots)
        if key not in self._pools:
            self._pools[key] = exact_pool(self.layers, placed, slots)
        moved = sum(t.nbytes for p, ps in placed.items() for t in self.layers[p].params if t.name in ps)
        return self.total - moved + self._pools[key]


def best(space: Space, budget: int, cost: PlacementCost) -> tuple[float, str, int]:
    """(predicted step, label, plans predicted) of the fastest plan of the space that fits ``budget``."""
    found: tuple[float, str] | None = None
    predicted = 0
    for _, family in space.candidates():
        fits = [c for c in family if c.peak <= budget][:FIRST_FITS]
        for c in fits:
            ms = cost.step_ms(c.placed, c.slots)
            predicted += 1
            if found is None or ms < found[0]:
                found = (ms, c.label)
    if found is None:
        return float("inf"), "nothing fits", predicted
    return found[0], found[1], predicted


def auto_ms(spec: SpecFile, budget: int, workload: Workload, cost: PlacementCost) -> tuple[float | None, str]:
    try:
        plan = planner.plan(spec, gpu_budget=budget, workload=workload)
    except InfeasibleError:
        return None, "infeasible"
    if any(layer.experts is not None for layer in plan.layers):  # the host computes experts: the plan's own
        return plan.predictions.weighted_step_ms, plan.summary.backend_reason  # prediction (PlacementCost has no host)
    placed = {i: {p: "uva" if p in layer.uva else "prefetch" for p in layer.offloaded}
              for i, layer in enumerate(plan.layers) if layer.offloaded}
    span = [i for i, layer in enumerate(plan.layers) if layer.prefetch is not None and layer.prefetch.span]
    slots = plan.buffer_pool.slots if plan.buffer_pool else 1
    return cost.step_ms(placed, slots, span), plan.summary.backend_reason


def cell(space: Space, fraction: float, name: str, hw: HardwareProfile) -> dict:
    workload = Workload({name: WORKLOADS[name]})
    cost = PlacementCost(space.layers, hw, workload)
    budget = int(space.total * fraction)
    started = time.perf_counter()
    # the searched plans' weights and buffers get what auto's do: the budget less the KV cache, activations, workspace
    weights = weights_budget(budget, space.sizes.plan_memory(workload, hw))
    best_ms, label, predicted = best(space, weights, cost)
    ours, reason = auto_ms(space.spec, budget, workload, cost)
    if ours is not None and ours < best_ms:  # auto's plan is in the space too (a spanning head, tiers of its own)
        best_ms, label = ours, "auto's own plan"
    return {"spec": space.spec.model.name, "budget": fraction, "budget_bytes": budget, "workload": name,
            "auto_ms": None if ours is None else round(ours, 2), "best_ms": round(best_ms, 2), "best": label,
            "auto_over_best": None if ours is None else round(ours / best_ms, 4), "auto": reason,
            "plans_predicted": predicted, "seconds": round(time.perf_counter() - started, 1)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", action="append", help="a bundled spec name (examples/generated/NAME.yaml)")
    ap.add_argument("--budget", action="append", type=float, help="a share of the model's bytes")
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    ap.add_argument("--hardware", default="h200")
    args = ap.parse_args(argv)
    hw = load_hardware(args.hardware)
    rows = []
    for name in args.spec or SPECS:
        space = Space(load_spec(ROOT / "examples" / "generated" / f"{name}.yaml"))
        for fraction in args.budget or BUDGETS:
            for workload in args.workload or WORKLOADS:
                row = cell(space, fraction, workload, hw)
                print(json.dumps(row), flush=True)
                rows.append(row)
    print()
    print(f"{'spec':16} {'budget':>6} {'workload':9} {'auto ms':>9} {'best ms':>9} {'auto/best':>9}  best plan")
    for r in rows:
        ratio = "-" if r["auto_over_best"] is None else f"{r['auto_over_best']:.3f}"
        ours = "-" if r["auto_ms"] is None else f"{r['auto_ms']:.1f}"
        print(f"{r['spec']:16} {r['budget']:>6.0%} {r['workload']:9} {ours:>9} {r['best_ms']:>9.1f} {ratio:>9}  "
              f"{r['best']}")
    within = [r for r in rows if r["auto_over_best"] is not None]
    if within:
        worst = max(within, key=lambda r: r["auto_over_best"])
        print(f"\nauto within 2% of the best in {sum(r['auto_over_best'] <= 1.02 for r in within)} of {len(within)} "
              f"cells; worst {worst['auto_over_best']:.3f} ({worst['spec']}, {worst['budget']:.0%}, {worst['workload']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
