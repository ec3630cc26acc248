"""``planner calibrate``'s grouped expert figures (runtime/calibrate.py ``moe_experts``): the routing it times."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("tokens", [16, 2048])
def test_calibrate_routes_uniformly_at_random(tokens):
    """``moe_experts`` times grouped expert calls under the cost model's uniform routing: each token picks 8
    distinct experts, every expert about equally often (not exactly: the rows' spread is what costs re-reads)."""
    from runtime.calibrate import _uniform_routing

    index = _uniform_routing(128, 8, tokens, torch.Generator().manual_seed(tokens))
    assert index.shape == (tokens, 8)
    assert all(len(set(row.tolist())) == 8 for row in index)
    counts = torch.bincount(index.flatten(), minlength=128).float()
    assert counts.sum() == tokens * 8
    if tokens == 2048:  # 128 rows an expert on average, spread as a binomial's (sd about 11)
        assert 80 < counts.min() and counts.max() < 180 and counts.std() > 3
