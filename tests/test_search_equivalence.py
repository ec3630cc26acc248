"""The bounded budget search gives byte-identical plans and errors to the exhaustive one it replaced.

``reference_search`` is the search as it was before planner/strategy/peak_bound.py (every state evaluated
in ladder order); it is kept here as the specification of the result. It prices each state
plainly with the slot rule of docs/DESIGN.md (``reference_cost``: ``min(N, step)`` slots, offloaded
layer ``j`` in slot ``j % slots``, each slot as large as the largest buffers of its layers), so
the fast search and ``planner.strategy.footprint.evaluate`` are both checked against it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from conftest import make_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import planner
import planner.build
from planner.strategy.footprint import Cost, evaluate
from planner.errors import InfeasibleError, PlanningError
from planner.strategy.peak_bound import tier_bound
from planner.strategy.budget import Search, Tier, _fewest_possible
from schemas import dump_model


def reference_cost(picked: Sequence, *, total_bytes: int, num_layers: int, backend: str, step: int) -> Cost:
    """``evaluate``, written out: the pool holds, per slot, the largest buffer of each param key its layers use."""
    cost = evaluate(picked, range(len(picked)), total_bytes=total_bytes, num_layers=num_layers, backend=backend,
                    step=step)
    if backend != "prefetch" or not picked:
        assert cost.buffer_bytes == 0
        return cost
    slots = min(len(picked), step)
    largest: dict[tuple, int] = {}  # (slot, key) -> bytes of its buffer
    for j, c in enumerate(picked):
        for key, nbytes in c.signature:
            largest[(j % slots, key)] = nbytes
    assert cost.buffer_bytes == sum(largest.values()) and cost.step == step
    return cost


def reference_search(tiers: Sequence[Tier], *, total_bytes: int, num_layers: int, backend: str,
                     step: int, gpu_budget: int, cpu_budget: int | None, start: tuple[int, int] = (0, 0)) -> Search:
    common = dict(total_bytes=total_bytes, num_layers=num_layers, backend=backend, step=step)
    lowest: Cost | None = None
    lowest_state = None
    skipped: list[tuple[int, int]] = []
    for t, tier in enumerate(tiers):
        first = _fewest_possible(tier.member_bytes(), total_bytes - tier.base_bytes(), gpu_budget)
        bottom = 0 if t == 0 else 1
        skipped += [(t, n) for n in range(bottom, first) if (t, n) >= start]
        for n in range(max(first, bottom), len(tier.members) + 1):
            if (t, n) < start:
                continue
            cost = reference_cost(tier.pick(n), **common)
            if cpu_budget is not None and cost.offloaded_bytes > cpu_budget:
                continue
            if lowest is None or cost.peak_gpu_bytes < lowest.peak_gpu_bytes:
                lowest, lowest_state = cost, (t, n)
            if cost.peak_gpu_bytes <= gpu_budget:
                return Search(cost, lowest, (t, n))
    for t, n in skipped:
        cost = reference_cost(tiers[t].pick(n), **common)
        if cpu_budget is None or cost.offloaded_bytes <= cpu_budget:
            if lowest is None or cost.peak_gpu_bytes < lowest.peak_gpu_bytes:
                lowest, lowest_state = cost, (t, n)
    if lowest is None:
        return Search(None, reference_cost(tiers[start[0]].pick(start[1]), **common), None, start)
    return Search(None, lowest, None, lowest_state)


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


def outcome(spec, gpu: int, cpu: int | None, search) -> str:
    """The plan file (JSON) or the error, planning with ``search`` as the budget search."""
    saved = planner.build.search
    planner.build.search = search
    try:
        return dump_model(planner.plan(spec, gpu_budget=gpu, cpu_budget=cpu), "json")
    except InfeasibleError as err:
        return f"infeasible {err.min_gpu_budget}: {err}"
    except (PlanningError, ValidationError) as err:
        return f"{type(err).__name__}: {err}"
    finally:
        planner.build.search = saved


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(0, 2000))
def test_plans_and_errors_identical_to_the_exhaustive_search(case, above):
    """At the drawn budget, and just below, at and above the smallest feasible one (where plans fit tightly)."""
    spec, gpu, cpu = case
    smallest = outcome(spec, 1, cpu, reference_search)
    budgets = [gpu]
    if smallest.startswith("infeasible") and not smallest.startswith("infeasible None"):
        least = int(smallest.split()[1].rstrip(":"))
        budgets += [least - 1, least, least + above]
    for budget in budgets:
        assert outcome(spec, budget, cpu, planner.build.search) == outcome(spec, budget, cpu, reference_search)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(["prefetch", "uva"]))
def test_search_result_identical_and_bound_holds(case, backend):
    spec, gpu, cpu = case
    m = planner.build._model(spec, spec.memory, spec.offload)
    if not m.candidates:
        return
    args = dict(total_bytes=m.total_bytes, num_layers=len(m.layers), backend=backend,
                step=m.step, gpu_budget=gpu, cpu_budget=cpu)
    assert planner.build.search(m.tiers, **args) == reference_search(m.tiers, **args)
    for t, tier in enumerate(m.tiers):
        bound = tier_bound(tier.base, tier.full, tier.members, total_bytes=m.total_bytes)
        for n in range(len(tier.members) + 1):
            picked = tier.pick(n)
            cost = reference_cost(picked, total_bytes=m.total_bytes, num_layers=len(m.layers), backend=backend,
                                  step=m.step)
            offloaded, layers = bound.offloaded(n)
            assert (offloaded, layers) == (cost.offloaded_bytes, len(picked))
            peak = bound.peak_bound(n, offloaded, layers, backend, m.step)
            assert peak <= cost.peak_gpu_bytes
            if backend == "uva":
                assert peak == cost.peak_gpu_bytes


def test_uniform_stack_bound_is_exact():
    """On a stack of identical blocks the bound is the peak: the search evaluates almost nothing."""
    spec = make_spec([{"a.weight": [8, 8], "b.weight": [8]}] * 40)
    m = planner.build._model(spec, spec.memory, spec.offload)
    tier = m.tiers[0]
    bound = tier_bound(tier.base, tier.full, tier.members, total_bytes=m.total_bytes)
    for step in (1, 2, 5):
        for n in range(41):
            cost = reference_cost(tier.pick(n), total_bytes=m.total_bytes, num_layers=len(m.layers),
                                  backend="prefetch", step=step)
            assert bound.peak_bound(n, *bound.offloaded(n), "prefetch", step) == cost.peak_gpu_bytes
