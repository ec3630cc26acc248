"""Every order strategy auto weighs, predicted at its grid of budgets: each order's ratio to the fastest order at
each budget, and the order kept (planner/strategy/auto.py ``_keep``). CPU only.

    python bench/probe_auto_orders.py deepseek-v2-lite prefill 2048 0.25 [--hardware h200]

SPEC is a bundled spec's name (examples/generated/SPEC.yaml), then a workload's name, its tokens, and the budget as
a share of the model's bytes (the kept order does not depend on it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import planner  # noqa: E402
import planner.strategy.auto as auto  # noqa: E402
from schemas import load_spec  # noqa: E402
from schemas.hardware import load_hardware  # noqa: E402
from schemas.workload import Workload, WorkloadItem  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("workload")
    ap.add_argument("tokens", type=int)
    ap.add_argument("share", type=float)
    ap.add_argument("--hardware", default="h200", help="a bundled profile's name or a file")
    args = ap.parse_args(argv)
    path = ROOT / "examples" / "generated" / f"{args.spec}.yaml"
    if not path.exists():
        names = sorted(p.stem for p in path.parent.glob("*.yaml"))
        print(f"probe_auto_orders: no bundled spec '{args.spec}' (examples/generated/): expected one of "
              f"{', '.join(names)}", file=sys.stderr)
        return 2
    spec = load_spec(path)
    keep = auto._keep

    def shown(paths, cpu_budget, total_bytes, points=auto.GRID):
        lowest = {p: path.lowest_peak(cpu_budget) for p, path in paths.items()}
        floor = min(lowest.values())
        grid = auto.budget_grid(floor, total_bytes, points)
        rows = {p: [auto._Estimate(path, b, cpu_budget).exact() for b in grid] for p, path in paths.items()}
        best = [min(row[i] for row in rows.values()) for i in range(len(grid))]
        print("grid GB", [round(g / 1e9, 1) for g in grid])
        print("fastest ms", [round(b, 1) for b in best])
        for p, row in rows.items():
            print(str(p)[:70].ljust(70), "reaches the floor" if lowest[p] == floor else "                 ",
                  " ".join(f"{m / b:.2f}" for m, b in zip(row, best)))
        kept = keep(paths, cpu_budget, total_bytes, points)
        print("kept", kept[0])
        return kept

    auto._keep = shown
    try:
        total = sum(t.nbytes for layer in spec.model.expanded() for t in layer.params)
        planner.plan(spec, gpu_budget=int(total * args.share), hardware=load_hardware(args.hardware),
                     workload=Workload({args.workload: WorkloadItem(tokens=args.tokens)}))
    finally:
        auto._keep = keep
    return 0


if __name__ == "__main__":
    sys.exit(main())
