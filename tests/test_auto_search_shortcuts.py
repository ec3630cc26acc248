"""Strategy auto's search takes shortcuts that change no result (issue 18): the lowest peak of a path from the
bounds in order (``AutoPath.lowest_peak``), the first step of a slot count that fits from the bounds
(``AutoPath.first_with``), the estimate at a grid budget simulating its candidates in the order of a bound under
each (``auto._estimate``), and the orders weighed from bounds (``auto._keep``). Checked against the plain
definitions on the paths a plan makes."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import weights_only

import planner
from planner.strategy import auto, auto_slots
from planner.strategy.fit import first_fit
from schemas import load_spec
from schemas.workload import Workload, WorkloadItem

GENERATED = Path(__file__).resolve().parent.parent / "examples" / "generated"
DECODE32 = Workload({"decode": WorkloadItem(tokens=32)})
MIXED = Workload({"decode": WorkloadItem(tokens=1, weight=3.0), "prefill": WorkloadItem(tokens=512, mode="graph")})


def _paths(monkeypatch, spec, **options) -> list[auto_slots.AutoPath]:
    made = []
    real = auto_slots.AutoPath.__init__

    def keep(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(auto_slots.AutoPath, "__init__", keep)
    planner.plan(spec, **options)
    monkeypatch.undo()
    assert len(made) > 1  # several orders weighed
    return made


@pytest.mark.parametrize("name, options", [
    ("llama-3-8b", {"gpu_budget": 6 * 10**9, "workload": MIXED}),
    ("qwen3-30b-a3b", {"gpu_budget": 12 * 10**9, "workload": DECODE32}),  # with auto's trial of the host
    ("llama-3.2-1b", {"gpu_budget": 10**9, "workload": MIXED, "prefetch_step": 3}),
])
def test_the_shortcuts_give_what_the_definitions_give(monkeypatch, name, options):
    spec = weights_only(load_spec(GENERATED / f"{name}.yaml"))
    for path in _paths(monkeypatch, spec, **options):
        pinned = sorted({path.pinned(st) for st in path.steps})
        for cpu in (None, pinned[0], pinned[len(pinned) // 2]):
            assert path.lowest_peak(cpu) == first_fit(path.steps, path.reckoning, 0, cpu).peak
        low, total = path.lowest_peak(None), path.total
        for k in range(1, 6):
            budget = low + (total - low) * k // 6
            found = [path.first_with(s, budget, None) for s in path.counts]
            assert found == [next((st for st in path.steps if st.slots == s and st.span is None and not st.all_uva
                                   and path.within(st, budget, None)), None) for s in path.counts]
            found += [st for st in path.steps[-1:] if st.all_uva and path.within(st, budget, None)]
            steps = [st for st in found if st is not None]
            estimate = auto._estimate(path, budget, None)  # first: the steps it skips are not simulated yet
            assert all(path.least_ms(st) <= path.step_ms(st) for st in steps)
            assert estimate == min((path.step_ms(st) for st in steps), default=float("inf"))


def _kept_by_definition(paths: dict, cpu_budget, total_bytes: int, points: int) -> tuple:
    """``auto._keep`` as its docstring defines it: every order's estimate made at every grid budget."""
    lowest = {p: path.lowest_peak(cpu_budget) for p, path in paths.items()}
    floor = min(lowest.values())
    grid = [floor + (total_bytes - floor) * k // (points + 1) for k in range(1, points + 1)]
    ms = {p: [auto._estimate(path, budget, cpu_budget) for budget in grid] for p, path in paths.items()}
    best = [min(ms[p][i] for p in paths) for i in range(len(grid))]
    ratios = {p: [m / b if b > 0 else 1.0 for m, b in zip(ms[p], best)] for p in paths}
    keep = min((p for p in paths if lowest[p] == floor), key=lambda p: (max(ratios[p]), sum(ratios[p]), p))
    near = [p for p in paths if lowest[p] == floor and p != keep and max(ratios[keep]) > 1 + auto.NEAR
            and max(ratios[p]) <= max(ratios[keep]) * (1 + auto.NEAR)]
    if near:  # told apart on a grid CLOSER times as fine: the least worst ratio there
        n = auto.CLOSER * points
        fine = [floor + (total_bytes - floor) * k // (n + 1) for k in range(1, n + 1)]
        fms = {p: [auto._estimate(path, budget, cpu_budget) for budget in fine] for p, path in paths.items()}
        fbest = [min(fms[p][i] for p in paths) for i in range(len(fine))]
        worst = {p: max(m / b if 0 < b < float("inf") else 1.0 for m, b in zip(fms[p], fbest)) for p in [keep, *near]}
        keep = min([keep, *near], key=lambda p: (worst[p], p))
    return keep, auto.Weighed(len(paths), max(ratios[keep]))


@pytest.mark.parametrize("name, options", [
    ("llama-3-8b", {"gpu_budget": 6 * 10**9, "workload": MIXED}),
    ("qwen3-30b-a3b", {"gpu_budget": 12 * 10**9, "workload": DECODE32}),  # with auto's trial of the host
    ("mixtral-8x7b", {"gpu_budget": 30 * 10**9}),
])
def test_weighing_from_bounds_keeps_what_the_definition_keeps(monkeypatch, name, options):
    """``auto._keep`` makes an order's estimate only where it can change the fastest or the kept order (the step
    with nothing offloaded and the copy-free steps standing in as bounds): the same order and worst ratio as making
    every estimate; the resident bound is under every step it stands for."""
    spec = weights_only(load_spec(GENERATED / f"{name}.yaml"))
    made = _paths(monkeypatch, spec, **options)
    fresh = [auto_slots.AutoPath(p.layers, p.order, p.total, p.cost, p.counts[0] if len(p.counts) == 1 else None,
                                 p.uva) for p in made]  # nothing simulated yet
    for points in (3, 8):
        pinned = sorted({p.pinned(st) for p in made for st in p.steps})
        for cpu in (None, pinned[len(pinned) // 3]):
            paths = dict(enumerate(fresh))
            assert auto._keep(paths, cpu, made[0].total, points) == _kept_by_definition(
                dict(enumerate(made)), cpu, made[0].total, points)
    for path in made:
        floor = path.resident_floor()
        if floor is not None:
            assert all(floor <= path.step_ms(st) for st in path.steps[::max(1, len(path.steps) // 25)])


@pytest.mark.parametrize("name, options", [
    ("llama-3-8b", {"gpu_budget": 6 * 10**9, "workload": MIXED}),
    ("qwen3-30b-a3b", {"gpu_budget": 12 * 10**9, "workload": DECODE32}),
    ("llama-3.2-1b", {"gpu_budget": 10**9, "workload": MIXED, "prefetch_step": 3}),
])
def test_the_spans_made_in_one_pass_are_each_prefix_s_span_candidate(monkeypatch, name, options):
    """``AutoPath`` finds the spanning layer of every prefix in one pass (the per-prefix definition took time
    quadratic in the moves: 78 s for 20,000 layers on UVA); the same layers and bytes as ``span_candidate``."""
    from planner.strategy.auto_order import span_candidate

    spec = weights_only(load_spec(GENERATED / f"{name}.yaml"))
    spans = 0
    for path in _paths(monkeypatch, spec, **options):
        moves = path.order.moves
        last = max((i + 1 for i, m in enumerate(moves) if m.backend == "prefetch"), default=0)
        for taken in range(len(moves) + 1):  # past the last prefetch move (before it, no span is weighed)
            span = span_candidate(path.order, taken) if last and taken >= last else None
            assert path._spans.get(taken) == span
            if span is not None:
                spans += 1
                assert path._span_bytes[taken] == sum(m.nbytes for m in moves[:taken] if m.position == span and m.unique)
    assert spans  # some prefix of these plans may span the slots
