"""bench/bench_search.py: strategy auto against an exhaustive search of plan families (group, budget spreads,
per-kind backends, the embedding and head, slots), by predicted step; a small cell of its table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import bench_search  # noqa: E402
from schemas import load_spec  # noqa: E402
from schemas.hardware import load_hardware  # noqa: E402

GENERATED = Path(__file__).resolve().parent.parent / "examples" / "generated"


def test_auto_is_within_two_percent_of_the_exhaustive_best():
    """Llama-3-8B at half its bytes, prefill of 2,048 tokens: no plan of the families predicts 2% faster."""
    space = bench_search.Space(load_spec(GENERATED / "llama-3-8b.yaml"), slots=(1, 2, 3))
    row = bench_search.cell(space, 0.5, "prefill", load_hardware("h200"))
    assert row["plans_predicted"] > 100 and row["auto_ms"] is not None
    assert row["auto_over_best"] <= 1.02, row


def test_every_plan_of_the_space_is_exact_and_the_best_fits(capsys):
    spec = load_spec(GENERATED / "llama-3.2-1b.yaml")
    space = bench_search.Space(spec, slots=(1, 2))
    budget = space.total // 2
    seen = 0
    for _, family in space.candidates():
        for c in family[:2]:
            moved = sum(t.nbytes for p, ps in c.placed.items() for t in space.layers[p].params if t.name in ps)
            assert 0 < moved and c.peak >= space.total - moved  # the pool is never negative
            seen += 1
    assert seen > 50
    assert bench_search.main(["--spec", "llama-3.2-1b", "--budget", "0.5", "--workload", "decode"]) == 0
    out = capsys.readouterr().out
    row = json.loads(out.splitlines()[0])
    assert row["budget_bytes"] == budget and row["best_ms"] > 0
    assert "auto within 2% of the best in" in out


def test_the_orders_probe_shows_every_order_against_the_fastest_and_the_one_kept(capsys):
    """bench/probe_auto_orders.py: a ratio per order and grid budget, each at least 1 and one order at 1.00 at every
    budget (the fastest is one of them), and the order ``_keep`` kept, which is then restored."""
    import planner.strategy.auto as auto

    import probe_auto_orders

    keep = auto._keep
    assert probe_auto_orders.main(["llama-3-8b", "decode", "1", "0.5"]) == 0
    assert auto._keep is keep
    lines = capsys.readouterr().out.splitlines()
    grid = next(line for line in lines if line.startswith("grid GB"))
    points = grid.count(",") + 1
    rows = [[float(x) for x in line.split()[-points:]] for line in lines if line.startswith("(")]  # an order a line
    assert rows and all(len(r) == points and min(r) >= 1.0 for r in rows)
    assert all(min(r[i] for r in rows) == 1.0 for i in range(points))
    assert any(line.startswith("kept ") for line in lines)


def test_the_orders_probe_names_the_bundled_specs_for_an_unknown_one(capsys):
    import probe_auto_orders

    assert probe_auto_orders.main(["llama-9000", "decode", "1", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "no bundled spec 'llama-9000'" in err and "llama-3-8b" in err
