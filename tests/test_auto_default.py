"""strategy auto is the default, with or without prefer."""

import pytest
from conftest import make_spec
from pydantic import ValidationError

import planner
from planner.errors import InfeasibleError
from schemas.spec import OffloadSection

MLP = {"attn.w": [8, 8], "mlp.w1": [32, 8], "mlp.w2": [8, 32]}


def test_the_default_strategy_is_auto():
    assert OffloadSection().strategy == "auto"
    plan = planner.plan(make_spec([dict(MLP)] * 4), gpu_budget=3000)
    assert plan.summary.strategy == "auto" and plan.summary.peak_gpu_bytes <= 3000


def test_prefer_keeps_the_default_strategy_and_group_refuses_it():
    assert OffloadSection(prefer=["dense_mlp"]).strategy == "auto"
    spec = make_spec([dict(MLP)] * 4, offload={"prefer": ["dense_mlp"]})
    assert spec.offload.strategy == "auto"
    assert planner.plan(make_spec([dict(MLP)] * 4), gpu_budget=3000, prefer=["dense_mlp"]).summary.strategy == "auto"
    assert OffloadSection(prefer=["dense_mlp"], strategy="budget").strategy == "budget"
    with pytest.raises(ValidationError, match="strategy 'group' does not use it"):
        OffloadSection(prefer=["dense_mlp"], strategy="group", group_size=2)


def test_auto_backend_none_and_group_size():
    spec = make_spec([dict(MLP)] * 4)
    none = planner.plan(spec, gpu_budget=10**6, backend="none")
    assert none.summary.backend == "none" and none.summary.offloaded_bytes == 0
    with_group_size = planner.plan(spec, gpu_budget=3000, group_size=2)  # accepted, unused by auto
    assert with_group_size.summary.strategy == "auto"


def test_auto_infeasible_names_the_smallest_feasible_budget():
    spec = make_spec([dict(MLP)] * 4)
    with pytest.raises(InfeasibleError) as err:
        planner.plan(spec, gpu_budget=20, params=["attn"])
    need = err.value.min_gpu_budget
    assert need is not None and f"the smallest feasible gpu_budget is {need} bytes" in err.value.message
    assert planner.plan(spec, gpu_budget=need, params=["attn"]).summary.peak_gpu_bytes <= need
