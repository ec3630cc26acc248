import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.layers import eligible_params, group_rule, longest_run, matches_segments
from planner.strategy.spread_order import last_first
from schemas import SpecFile


def test_segment_match_is_on_whole_segments():
    assert matches_segments("mlp.w2.weight", "w2")
    assert not matches_segments("mlp.w2_scale", "w2")
    assert matches_segments("mlp.experts.0.w1", "mlp.experts")
    assert not matches_segments("mlp.experts_gate.w1", "mlp.experts")
    assert not matches_segments("a.mlp", "mlp.a")
    assert matches_segments("mlp", "mlp")


def test_eligible_params_skip_shared_and_unmatched():
    spec = SpecFile.model_validate({"model": {"name": "t", "dtype": "bf16", "layers": [
        {"name": "b.0", "params": {"mlp.w1": [2], "mlp.w2_scale": [2], "attn.q": [2], "w2": [2]}}]}})
    layer = spec.model.expanded()[0]
    names = lambda ts: [t.name for t in ts]  # noqa: E731
    assert names(eligible_params(layer, None, set())) == ["mlp.w1", "mlp.w2_scale", "attn.q", "w2"]
    assert names(eligible_params(layer, ["mlp"], set())) == ["mlp.w1", "mlp.w2_scale"]
    assert names(eligible_params(layer, ["w2", "q"], {"w2"})) == ["attn.q"]


@pytest.mark.parametrize("m", range(1, 41))
def test_group_rule_matches_vllm_formula(m):
    for g in range(1, 13):
        for k in range(1, g + 1):
            chosen = group_rule(m, g, k)
            assert chosen == [i for i in range(m) if i % g >= g - k]
            # the last k of every full group of g
            for start in range(0, m - g + 1, g):
                assert [i for i in chosen if start <= i < start + g] == list(range(start + g - k, start + g))


@given(st.integers(1, 400), st.data())
def test_the_budget_spread_is_even_and_starts_at_the_last_layer(m, data):
    """The budget strategy's priority order (planner/strategy/budget.py): a permutation, the last layer first,
    and every prefix spread: no two gaps between taken layers differ by more than a factor of two plus one."""
    order = last_first(m)
    assert sorted(order) == list(range(m)) and order[0] == m - 1
    n = data.draw(st.integers(1, m))
    chosen = sorted(order[:n])
    if n < m:
        assert chosen != list(range(n))  # never simply the first ones
    gaps = [b - a for a, b in zip(chosen, chosen[1:])]
    if gaps:
        assert max(gaps) <= 2 * min(gaps) + 1


def test_the_budget_spread_of_powers_of_two_is_exact():
    assert last_first(1) == [0]
    assert sorted(last_first(32)[:8]) == [3, 7, 11, 15, 19, 23, 27, 31]
    for n in (2, 4, 8, 16):
        assert sorted(last_first(32)[:n]) == list(range(32 // n - 1, 32, 32 // n))


def _brute_run(positions, num_layers):
    on = [p in set(positions) for p in range(num_layers)]
    if all(on):
        return num_layers
    best = 0
    for start in range(num_layers):
        run = 0
        while run < num_layers and on[(start + run) % num_layers]:
            run += 1
        best = max(best, run)
    return best


def test_longest_run_wraps_around():
    assert longest_run([], 5) == 0
    assert longest_run([0, 1, 4], 5) == 3
    assert longest_run([1, 2, 3], 5) == 3
    for num_layers in range(1, 9):
        for r in range(num_layers + 1):
            for positions in itertools.combinations(range(num_layers), r):
                assert longest_run(list(positions), num_layers) == _brute_run(positions, num_layers)
