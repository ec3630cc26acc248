"""Workload weights are relative shares: any weights the figure rule accepts (schemas/reals.py: 1e-6 to 1e6) give a
finite weighted step between the fastest and the slowest (two weights of 1e308 once summed to inf and made it nan;
such weights are now refused at the option), and a plan the planner builds that fails validation is a bug
(exit 70), never "SPEC with the command-line options: ..." (the user's input)."""

from __future__ import annotations

import functools
import math

import pytest
from cli_samples import invoke
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import planner
from schemas.io import load_spec
from schemas.workload import Workload, WorkloadItem

LLAMA = "examples/llama-3-8b.yaml"


@functools.lru_cache(maxsize=1)
def _plan():
    return planner.plan(load_spec(LLAMA), gpu_budget=12 * 10**9)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=1e-6, max_value=1e6), min_size=1, max_size=3))
def test_any_positive_weights_give_a_step_between_the_fastest_and_the_slowest(weights: list[float]) -> None:
    from planner.cost.predict import predict
    from planner.cost.predicted import chosen_profile

    spec_plan = _plan()
    names = ["decode", "prefill", "decode8"]
    tokens = [1, 2048, 8]
    workload = Workload({n: WorkloadItem(tokens=t, weight=w) for n, t, w in zip(names, tokens, weights)})
    preds = predict(spec_plan, chosen_profile(spec_plan, None), workload)
    steps = [p.step_ms for p in preds.workloads]
    assert math.isfinite(preds.weighted_step_ms)
    assert min(steps) - 1e-3 <= preds.weighted_step_ms <= max(steps) + 1e-3


def test_the_reported_weights_plan() -> None:
    out = invoke("plan", LLAMA, "-g", "12GB", "--workload", "decode:1e308", "--workload", "prefill:1e308")
    assert out.exit_code == 2 and "weight" in out.output and "1e308" in out.output, out.output
    assert "nan" not in out.output
    out = invoke("plan", LLAMA, "-g", "12GB", "--workload", "decode:1e6", "--workload", "prefill:1e6")
    assert out.exit_code == 0 and "nan" not in out.output, out.output


def test_an_invalid_plan_of_the_planner_is_a_bug_not_the_input(monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.build
    from schemas.prediction import Predictions

    def broken(*args: object, **kwargs: object) -> Predictions:
        return Predictions.model_validate({"weighted_step_ms": float("nan")})

    monkeypatch.setattr(planner.build, "predict", broken)
    out = invoke("plan", LLAMA, "-g", "12GB")
    assert out.exit_code == 70, out.output
    assert "internal error" in out.output and "with the command-line options" not in out.output
    with pytest.raises(ValidationError):
        broken()
