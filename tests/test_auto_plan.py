"""strategy auto end to end: valid plans within the budget, mixed where it pays, stable as the budget grows."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import weights_only
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from planner.errors import InfeasibleError
from schemas import load_spec
from schemas.io import dump_model, load_model
from schemas.plan import Plan
from schemas.workload import Workload, WorkloadItem

GENERATED = Path(__file__).resolve().parent.parent / "examples" / "generated"
DECODE = Workload({"decode": WorkloadItem(tokens=1)})
PREFILL = Workload({"prefill": WorkloadItem(tokens=2048)})


@pytest.fixture(scope="module")
def specs():
    return {name: weights_only(load_spec(GENERATED / f"{name}.yaml"))
            for name in ("llama-3-8b", "qwen3-30b-a3b", "llama-3.2-1b")}


def _placement(plan: Plan) -> dict[str, str]:
    out = {}
    for layer in plan.layers:
        for p in layer.offloaded:
            out[f"{layer.name}.{p}"] = "uva" if p in layer.uva else "prefetch"
    return out


@pytest.mark.parametrize("budget", [4e9, 8e9, 12e9])
def test_auto_plans_fit_reload_and_beat_or_match_the_budget_strategy(specs, budget):
    spec = specs["llama-3-8b"]
    plan = planner.plan(spec, gpu_budget=int(budget), strategy="auto", workload=DECODE)
    assert plan.summary.strategy == "auto" and plan.summary.peak_gpu_bytes <= budget
    assert load_model(Plan, "p.yaml", dump_model(plan)) == plan  # the plan check passes on the file too
    assert _placement(plan)["model.embed_tokens.weight"] == "uva"  # a lookup reads T rows: nearly free
    runner = [n for n in plan.summary.notes if n.startswith("auto: runner-up")]
    assert runner, plan.summary.notes
    theirs, ours = (float(x) for x in runner[0].split("predicted ")[1].replace(" ms a step against ", " ")
                    .removesuffix(" ms").split())
    assert ours <= theirs * 1.001


def test_moe_decode_puts_routed_experts_on_uva_and_prefill_prefetches_them(specs):
    spec = specs["qwen3-30b-a3b"]
    decode = _placement(planner.plan(spec, gpu_budget=24 * 10**9, strategy="auto", workload=DECODE))
    experts = {k: v for k, v in decode.items() if ".mlp.experts." in k}
    assert experts and set(experts.values()) == {"uva"}
    prefill = _placement(planner.plan(spec, gpu_budget=24 * 10**9, strategy="auto", workload=PREFILL))
    assert {v for k, v in prefill.items() if ".mlp.experts." in k} == {"prefetch"}


def test_tied_embeddings_never_move(specs):
    plan = planner.plan(specs["llama-3.2-1b"], gpu_budget=10**9, strategy="auto", workload=DECODE)
    tied_targets = {owner for layer in plan.layers for owner in layer.tied.values()}
    assert tied_targets and not tied_targets & set(_placement(plan))


def test_below_the_smallest_pool_every_param_is_read_in_place(specs):
    plan = planner.plan(specs["llama-3-8b"], gpu_budget=10**6, strategy="auto", workload=DECODE)
    assert plan.summary.backend == "uva" and plan.summary.peak_gpu_bytes <= 10**6
    assert any("every eligible param read in place through UVA (no buffers)" in n for n in plan.summary.notes)


def test_an_impossible_budget_is_infeasible_with_the_smallest_that_fits(specs):
    spec = specs["llama-3.2-1b"]  # its tied embedding never moves
    with pytest.raises(InfeasibleError) as err:
        planner.plan(spec, gpu_budget=10**6, strategy="auto", workload=DECODE)
    plan = planner.plan(spec, gpu_budget=err.value.min_gpu_budget, strategy="auto", workload=DECODE)
    assert plan.summary.peak_gpu_bytes <= err.value.min_gpu_budget


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["llama-3-8b", "qwen3-30b-a3b"]), st.sampled_from([DECODE, PREFILL]),
       st.floats(0.1, 0.9), st.floats(1.01, 1.6))
def test_raising_the_budget_never_moves_a_param_from_gpu_to_host(specs, name, workload, low, factor):
    spec = specs[name]
    total = sum(layer.nbytes for layer in spec.model.expanded())
    try:
        small_plan = planner.plan(spec, gpu_budget=int(total * low), strategy="auto", workload=workload)
    except InfeasibleError:
        return
    small = _placement(small_plan)
    large = _placement(planner.plan(spec, gpu_budget=int(total * low * factor), strategy="auto", workload=workload))
    assert set(large) <= set(small)
    if not any("below the smallest prefetch buffer pool" in n for n in small_plan.summary.notes):
        assert all(small[k] == v for k, v in large.items())  # and never changes backend
