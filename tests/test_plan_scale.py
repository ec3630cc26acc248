"""Planning a long stack works out each distinct param once, not once per layer (issue 18): counted, not
timed. A spec of 300 blocks listed one by one (bench/synthetic_spec.py), strategy auto."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import planner  # noqa: E402
from schemas import kinds  # noqa: E402
from planner.cost import layer as layer_cost
from schemas.io import load_model  # noqa: E402
from schemas.spec import SpecFile  # noqa: E402
from synthetic_spec import synthetic_spec_text  # noqa: E402
from conftest import weights_only  # noqa: E402

BLOCKS, PARAMS = 300, 20


def _spec() -> SpecFile:
    return weights_only(load_model(SpecFile, "synthetic.yaml", synthetic_spec_text(BLOCKS, PARAMS, hidden=64)))


def test_each_distinct_name_is_classified_once(monkeypatch) -> None:
    kinds._classify.cache_clear()
    plan = planner.plan(_spec(), gpu_budget=BLOCKS * 40_000)
    assert plan.summary.offloaded_layers > 0
    info = kinds._classify.cache_info()
    assert info.misses <= PARAMS + 10  # the block's 20 names, the embedding, the norm and the head
    # and the search reads the kinds once per distinct layer description, not once per layer (auto_order.like)
    assert 0 < info.hits < BLOCKS * PARAMS


def test_each_distinct_layer_is_costed_once_per_prediction(monkeypatch) -> None:
    calls = []
    real = layer_cost.layer_times

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(layer_cost, "layer_times", counted)
    plan = planner.plan(_spec(), gpu_budget=BLOCKS * 40_000)
    assert plan.summary.offloaded_layers > 0
    # the plan's prediction and the runner-ups' prices, of a few distinct layers each, not 3 x 303 layers
    assert len(calls) < 60, len(calls)


def test_a_plan_leaves_no_reference_cycles_for_the_collector() -> None:
    """``plan`` runs with the cycle collector paused; what it leaves in reference cycles (a search path holding its
    own bound methods: thousands of steps) would be walked by the first collection after it. None is left."""
    import gc

    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        plan = planner.plan(_spec(), gpu_budget=BLOCKS * 40_000, strategy="auto")
        assert plan.summary.offloaded_layers > 0
        assert gc.collect() < 50
    finally:
        if was:
            gc.enable()
