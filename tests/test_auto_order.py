"""strategy auto's order of moves: what goes to UVA, what is prefetched, spread, and stability."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.strategy.auto_order import build_order, where
from planner.strategy.fit import Fit, NoFit, Reckoning, first_fit
from planner.strategy.peaks import peaks
from planner.strategy.spread_order import van_der_corput as _van_der_corput
from planner.layers import build_graph, tied_owners
from planner.layers import eligible_params
from schemas import load_spec
from schemas.hardware import load_hardware
from schemas.workload import Workload, WorkloadItem

HW = load_hardware("h200")
GENERATED = Path(__file__).resolve().parent.parent / "examples" / "generated"
DECODE = Workload({"decode": WorkloadItem(tokens=1)})
PREFILL = Workload({"prefill": WorkloadItem(tokens=2048)})


def _order(name: str, workload: Workload, slots: int = 2):
    spec = load_spec(GENERATED / f"{name}.yaml")
    layers = spec.model.expanded()
    shared = tied_owners(build_graph(layers))
    eligible = {layer.index: eligible_params(layer, None, shared.get(layer.name, set())) for layer in layers}
    return layers, build_order(layers, eligible, HW, workload, slots), sum(layer.nbytes for layer in layers)


def _fit(order, total: int, budget: int):
    """The prefix fit on the order's own prefixes (one slot count: the order's)."""
    table = peaks(order, total)
    return first_fit(range(len(order.moves) + 1), Reckoning(peak=table.__getitem__), budget, None)


def test_van_der_corput_prefixes_are_spread():
    order = _van_der_corput(32)
    assert sorted(order) == list(range(32)) and order[:4] == [0, 16, 8, 24]
    for n in (2, 4, 8, 16):  # every power-of-two prefix is exactly evenly spaced
        assert sorted(order[:n]) == list(range(0, 32, 32 // n))


def test_embedding_goes_to_uva_first_and_dense_blocks_are_prefetched():
    layers, order, _ = _order("llama-3-8b", DECODE)
    first = order.moves[0]
    assert layers[first.position].name == "model.embed_tokens" and first.backend == "uva"
    blocks = [m for m in order.moves if m.backend == "prefetch"]
    assert len(blocks) == 32 and all(layers[m.position].name.startswith("model.layers.") for m in blocks)
    # the LM head is unique (no slot sharing): never prefetched, on UVA last if at all
    head = [m for m in order.moves if layers[m.position].name == "lm_head"]
    assert head and head[0].backend == "uva" and order.moves.index(head[0]) > order.moves.index(blocks[-1])


def test_routed_experts_go_to_uva_for_decode_and_are_prefetched_for_prefill():
    layers, decode, _ = _order("qwen3-30b-a3b", DECODE)
    experts = [m for m in decode.moves if "routed_experts" in m.kinds]
    assert experts and all(m.backend == "uva" for m in experts)
    assert all(decode.moves.index(m) < len(decode.moves) - 1 for m in experts)
    _, prefill, _ = _order("qwen3-30b-a3b", PREFILL)
    assert all(m.backend == "prefetch" for m in prefill.moves if "routed_experts" in m.kinds)


def test_the_peak_bound_is_the_pool_of_the_prefix():
    layers, order, total = _order("llama-3-8b", PREFILL, slots=2)
    table = peaks(order, total)
    block = next(m for m in order.moves if m.backend == "prefetch").nbytes
    k = next(i for i, m in enumerate(order.moves) if m.backend == "prefetch")
    # before the first prefetch move there is no pool; with three or more blocks, two slots' worth
    offloaded = sum(m.nbytes for m in order.moves[:k + 3])
    assert table[k][0] == total - sum(m.nbytes for m in order.moves[:k])
    assert table[k + 3][0] == total - offloaded + 2 * block


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["llama-3-8b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite"]),
       st.sampled_from([DECODE, PREFILL]), st.integers(1, 3), st.floats(0.05, 1.2), st.floats(1.0, 1.5))
def test_raising_the_budget_never_moves_a_param_to_the_host(name, workload, slots, low, factor):
    layers, order, total = _order(name, workload, slots)
    placements = []
    for budget in (int(total * low), int(total * low * factor)):
        found = _fit(order, total, budget)
        placements.append(where(order, found.step, layers) if isinstance(found, Fit) else None)
    small, large = placements
    if small is None or large is None:
        return
    for layer, params in large.items():  # everything on the host at the larger budget is there at the smaller
        for param, backend in params.items():
            assert small.get(layer, {}).get(param) == backend


def test_an_impossible_budget_names_the_smallest_peak_and_it_fits():
    layers, order, total = _order("llama-3-8b", DECODE)
    low = _fit(order, total, 10**6)
    assert isinstance(low, NoFit)
    need = low.peak
    assert _fit(order, total, need) == Fit(low.lowest, need)
    assert isinstance(_fit(order, total, need - 1), NoFit)
