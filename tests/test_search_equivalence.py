"""The fits with bounds and floors give byte-identical plans and errors to plain fits that reckon every step.

``plain_fit`` and ``plain_choose`` are the specification of the results (planner/strategy/fit.py): every
step of the path in order, its peak reckoned exactly and its step predicted, the first that fits
(``choose``: and that is kept, the definition walked from the end of the path); when none fits, the
lowest peak within the CPU budget, the first on the path among equals. ``plain_pool`` prices a prefix
with the slot rule of docs/DESIGN.md (``min(N, step)`` slots, prefetched layer ``j`` in slot ``j %
slots``, each slot as large as the largest buffers of its layers), so the fast fits, the bounds of
planner/strategy/peaks.py and the exact pool are all checked against it.
"""

from __future__ import annotations

from conftest import make_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import planner
import planner.strategy.budget
from planner.build import _ladder, _model
from planner.cost.placement import PlacementCost
from planner.errors import InfeasibleError, PlanningError
from planner.strategy.fit import Chosen, Fit, NoFit, Reckoning, Speed, choose
from planner.strategy.order import placement
from planner.strategy.peaks import exact_pool, lower_peaks, lower_peaks_by_slots, peaks
from schemas import dump_model
from schemas.hardware import load_hardware
from schemas.workload import Workload, WorkloadItem


def plain_pool(layers, placed, slots: int) -> int:
    """The pool of ``placed`` (position -> param -> backend) written out: per slot, the largest buffer of each key."""
    prefetched = [p for p in sorted(placed) if "prefetch" in placed[p].values()]
    if not prefetched:
        return 0
    k = min(len(prefetched), slots)
    largest: dict[tuple, int] = {}  # (slot, key) -> bytes of its buffer
    for j, position in enumerate(prefetched):
        for t in layers[position].params:
            if placed[position].get(t.name) == "prefetch":
                largest[(j % k, (t.name, t.shape, t.dtype, t.stride))] = t.nbytes
    return sum(largest.values())


def plain_fit(steps, reckon, gpu_budget, cpu_budget):
    peaks_ = [reckon.peak(step) for step in steps]
    within = [i for i, (_, pinned) in enumerate(peaks_) if cpu_budget is None or pinned <= cpu_budget]
    for i in within:
        if gpu_budget is None or peaks_[i][0] <= gpu_budget:
            return Fit(steps[i], peaks_[i][0])
    if not within:
        return NoFit(steps[0], peaks_[0][0])
    best = min(within, key=lambda i: (peaks_[i][0], i))
    return NoFit(steps[best], peaks_[best][0])


def plain_choose(steps, reckon, gpu_budget, cpu_budget, speed):
    """``choose`` by its definition: from the end of the path, a step is kept unless a later kept step fits its
    peak and predicts a faster step; the first kept step that fits is taken."""
    n = 0  # the steps within the CPU budget: a prefix of the path
    while n < len(steps) and (cpu_budget is None or reckon.peak(steps[n])[1] <= cpu_budget):
        n += 1
    if n == 0:
        return NoFit(steps[0], reckon.peak(steps[0])[0])
    peak = [reckon.peak(steps[i])[0] for i in range(n)]
    ms = [speed.step_ms(steps[i]) for i in range(n)]
    same = speed.moves or (lambda step: object())

    def beats(j: int, i: int) -> bool:  # equal within a relative 1e-9
        if ms[j] < ms[i] - 1e-9 * ms[i]:
            return True
        return ms[j] <= ms[i] + 1e-9 * ms[i] and same(steps[j]) == same(steps[i]) and peak[j] < peak[i]

    kept = [True] * n
    for i in range(n - 1, -1, -1):
        kept[i] = not any(kept[j] and peak[j] <= peak[i] and beats(j, i) for j in range(i + 1, n))
    passed = 0
    for i in range(n):
        if gpu_budget is None or peak[i] <= gpu_budget:
            if kept[i]:
                return Chosen(steps[i], peak[i], passed)
            passed += 1
    lowest = min(range(n), key=lambda i: (peak[i], i))
    return NoFit(steps[lowest], peak[lowest])


paths = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 30)), min_size=1, max_size=14)


@settings(max_examples=400, deadline=None)
@given(paths, st.integers(0, 31), st.integers(0, 31), st.none() | st.integers(0, 40), st.integers(0, 5),
       st.integers(1, 3))
def test_choose_is_its_definition_and_monotone(path, b1, b2, cpu, slack, group):
    """On any path (peaks and predicted steps drawn; pinned bytes growing along it; every ``group`` steps in a row
    moving the same params), with a floor that is a lower bound on every later step: ``choose`` equals its
    definition, and a larger budget takes a step no later on the path that predicts no slower a step."""
    steps = list(range(len(path)))
    reckon = Reckoning(peak=lambda i: (path[i][0], 3 * (i // group)))
    ms = [float(t) for _, t in path]
    floor = lambda i: min(ms[i:]) - slack  # noqa: E731
    moves = lambda i: i // group  # noqa: E731
    speed = Speed(step_ms=ms.__getitem__, floor=floor, moves=moves)
    low, high = sorted((b1, b2))
    picks = []
    for budget in (low, high):
        got = choose(steps, reckon, budget, cpu, speed)
        assert got == plain_choose(steps, reckon, budget, cpu, Speed(step_ms=ms.__getitem__, moves=moves))
        picks.append(got)
    small, large = picks
    if isinstance(small, Chosen):
        assert isinstance(large, Chosen)
        assert large.step <= small.step and ms[large.step] <= ms[small.step]


# Params of every kind the prefer ladder orders, in a few shapes so that blocks share signatures or not.
PARAMS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.o_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight", "mlp.gate.weight", "mlp.experts.0.w1.weight", "mlp.experts.1.w1.weight",
          "mlp.shared_experts.w1.weight")
KINDS = ("attention", "dense_mlp", "routed_experts", "shared_experts", "router", "norm")
SHAPES = ([8], [4, 8], [8, 8], [16, 8])

block = st.dictionaries(st.sampled_from(PARAMS), st.sampled_from(SHAPES), min_size=1, max_size=5)
templates = st.lists(block, min_size=1, max_size=3)


@st.composite
def stacks(draw) -> list[dict]:
    """Blocks in any order, or a few blocks then a repeating pattern (dense/MoE interleaved) to some length."""
    kinds = draw(templates)
    if draw(st.booleans()):
        return draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=14))
    head = draw(st.lists(st.sampled_from(kinds), max_size=3))
    cycle = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=4))
    return head + (cycle * 40)[:draw(st.integers(1, 40))]


@st.composite
def cases(draw):
    blocks = draw(stacks())
    offload: dict = {"strategy": "budget", "backend": draw(st.sampled_from(["auto", "prefetch", "uva"]))}
    step = draw(st.none() | st.integers(1, 4))
    if step is not None:
        offload["prefetch_step"] = step
    prefer = draw(st.none() | st.lists(st.sampled_from(KINDS), unique=True, min_size=1, max_size=4))
    if prefer is not None:
        offload["prefer"] = prefer
    params = draw(st.none() | st.sampled_from([["mlp"], ["self_attn", "mlp"], ["experts"]]))
    if params is not None:
        offload["params"] = params
    spec = make_spec(blocks, head=draw(st.booleans()), offload=offload)
    total = sum(layer.nbytes for layer in spec.model.expanded())
    gpu = max(1, int(total * draw(st.floats(0, 1.05))))
    cpu = draw(st.none() | st.floats(0, 1.0).map(lambda f: max(1, int(total * f))))
    return spec, gpu, cpu


def outcome(spec, gpu: int, cpu: int | None, fits) -> str:
    """The plan file (JSON) or the error, planning with ``fits`` (first_fit, choose) as the budget strategy's."""
    saved = planner.strategy.budget.first_fit, planner.strategy.budget.choose
    planner.strategy.budget.first_fit, planner.strategy.budget.choose = fits
    try:
        return dump_model(planner.plan(spec, gpu_budget=gpu, cpu_budget=cpu), "json")
    except InfeasibleError as err:
        return f"infeasible {err.min_gpu_budget}: {err}"
    except (PlanningError, ValidationError) as err:
        return f"{type(err).__name__}: {err}"
    finally:
        planner.strategy.budget.first_fit, planner.strategy.budget.choose = saved


PLAIN = (plain_fit, plain_choose)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(0, 2000))
def test_plans_and_errors_identical_to_the_plain_fits(case, above):
    """At the drawn budget, and just below, at and above the smallest feasible one (where plans fit tightly)."""
    spec, gpu, cpu = case
    smallest = outcome(spec, 1, cpu, PLAIN)
    budgets = [gpu]
    if smallest.startswith("infeasible") and not smallest.startswith("infeasible None"):
        least = int(smallest.split()[1].rstrip(":"))
        budgets += [least - 1, least, least + above]
    for budget in budgets:
        fast = (planner.strategy.budget.first_fit, planner.strategy.budget.choose)
        assert outcome(spec, budget, cpu, fast) == outcome(spec, budget, cpu, PLAIN)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(["prefetch", "uva"]))
def test_the_bounds_hold_and_the_exact_pool_is_the_slot_rule(case, backend):
    spec, _, _ = case
    m = _model(spec, spec.memory, spec.offload)
    if not m.candidates:
        return
    order, _ = _ladder(m).order(m.layers, backend, {})
    upper, lower = peaks(order, m.total_bytes, m.step), lower_peaks(order, m.total_bytes, m.step)
    for taken in range(len(order.moves) + 1):
        placed = placement(order, taken)
        pool = plain_pool(m.layers, placed, m.step)
        assert exact_pool(m.layers, placed, m.step) == pool
        offloaded = sum(move.nbytes for move in order.moves[:taken])
        exact = m.total_bytes - offloaded + pool
        assert upper[taken][1] == offloaded
        assert lower[taken] <= exact <= upper[taken][0]
        if backend == "uva":
            assert lower[taken] == exact == upper[taken][0]
    counts = [1, 2, m.step + 3]  # the bounds of several slot counts at once (strategy auto's paths)
    lowers = lower_peaks_by_slots(order, m.total_bytes, counts)
    for taken in range(len(order.moves) + 1):
        placed = placement(order, taken)
        resident = m.total_bytes - sum(move.nbytes for move in order.moves[:taken])
        for s in counts:
            assert lowers[s][taken] <= resident + plain_pool(m.layers, placed, s)


def test_uniform_stack_bounds_are_exact():
    """On a stack of identical blocks both bounds are the peak: the fit reckons almost nothing exactly."""
    spec = make_spec([{"a.weight": [8, 8], "b.weight": [8]}] * 40)
    m = _model(spec, spec.memory, spec.offload)
    order, _ = _ladder(m).order(m.layers, "prefetch", {})
    for step in (1, 2, 5):
        upper, lower = peaks(order, m.total_bytes, step), lower_peaks(order, m.total_bytes, step)
        for taken in range(41):
            placed = placement(order, taken)
            exact = m.total_bytes - upper[taken][1] + plain_pool(m.layers, placed, step)
            assert lower[taken] == exact == upper[taken][0]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(["prefetch", "uva"]), st.sampled_from([1, 32, 2048]),
       st.sampled_from(["eager", "graph"]), st.floats(1e-6, 1e-2))
def test_the_budget_floor_is_under_every_later_step(case, backend, tokens, mode, gbps):
    """``_Path.floor`` (the lower bound the budget strategy's choice stops its search at) is at most the predicted
    step of its ladder step and of every later one, on links slow (copies exposed) and fast (compute or CPU bound)."""
    spec, _, _ = case
    m = _model(spec, spec.memory, spec.offload)
    if not m.candidates:
        return
    hw = load_hardware("h200").model_copy(update={"h2d_gbps": gbps})
    cost = PlacementCost(m.layers, hw, Workload({"w": WorkloadItem(tokens=tokens, mode=mode)}))
    path = planner.strategy.budget._Path(m.layers, _ladder(m), backend, {}, m.total_bytes, m.step)
    steps = [path.step_ms(count, cost) for count in range(_ladder(m).steps + 1)]
    for count in range(len(steps)):
        assert path.floor(count, cost) <= min(steps[count:]) * (1 + 1e-9)



def test_planning_pauses_the_collector_and_restores_it(monkeypatch):
    """planner.plan runs with the cycle collector off and leaves it as it found it, also when it fails."""
    import gc

    import planner.build

    seen = []
    plan_for = planner.build._plan_for

    def watched(*args):
        seen.append(gc.isenabled())
        return plan_for(*args)

    monkeypatch.setattr(planner.build, "_plan_for", watched)
    spec = make_spec([{"w": [64, 64]}] * 3)
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            for budget in (10**9, 1):  # a plan, then InfeasibleError
                try:
                    planner.plan(spec, gpu_budget=budget)
                except InfeasibleError:
                    assert budget == 1
                assert gc.isenabled() is enabled
        finally:
            gc.enable()
    assert seen == [False] * 4
