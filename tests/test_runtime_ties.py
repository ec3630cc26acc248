"""Ties by storage: views of one storage are tied, counted once, never offloaded, and share one
storage again after ``remove()`` (aliasing in, aliasing out)."""

from __future__ import annotations

import pytest
from conftest import weights_only

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

import planner  # noqa: E402
import runtime  # noqa: E402
from model_state import assert_same, snapshot  # noqa: E402
from runtime.ties import rehome  # noqa: E402


class TiedHead(nn.Module):
    """An embedding whose transpose is the head's weight (one storage, two views)."""

    def __init__(self, vocab: int = 40, dim: int = 20, layers: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.head = nn.Module()
        self.head.weight = nn.Parameter(self.emb.weight.t())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return x @ self.head.weight


IDS = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(1))


def partition(model: nn.Module) -> set[frozenset[str]]:
    """The model's tensor names grouped by the storage they view."""
    groups: dict[int, set[str]] = {}
    for name, t in model.named_parameters(remove_duplicate=False):
        groups.setdefault(t.untyped_storage().data_ptr(), set()).add(name)
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize("strategy", ["group", "budget", "auto"])
def test_a_weight_and_its_transpose_are_tied_counted_once_and_kept_together(strategy):
    model = TiedHead()
    spec = weights_only(runtime.describe(model))  # a toy: its budget is about weights
    head = next(layer for layer in spec.model.expanded() if layer.name == "head")
    assert head.tied == {"weight": "emb.weight"} and not head.params
    unique = 40 * 20 * 4 + 3 * (20 * 20 + 20) * 4
    kw = ({"group_size": 1, "num_in_group": 1} if strategy == "group" else {"gpu_budget": unique // 2})
    plan = planner.plan(spec, strategy=strategy, **kw)
    assert plan.summary.total_bytes == unique  # 8,240 bytes, not 11,440
    assert not any(r in ("weight",) and layer.name in ("emb", "head") for layer in plan.layers for r in layer.offloaded)
    with torch.no_grad():
        want = model(IDS)
    snap, groups = snapshot(model), partition(model)
    with runtime.apply(plan, model, device="cpu"):
        with torch.no_grad():
            assert torch.equal(model(IDS), want)
        assert model.head.weight.data_ptr() == model.emb.weight.data_ptr()  # (offloaded ones share slots)
    assert_same(model, snap, same_storage=False)
    assert partition(model) == groups and model.head.weight.data_ptr() == model.emb.weight.data_ptr()


def test_a_slice_of_a_bigger_param_is_tied_to_it():
    model = TiedHead()
    model.head.weight = nn.Parameter(model.emb.weight[8:28].t())  # part of the embedding, transposed
    spec = runtime.describe(model)
    assert {layer.name: layer.tied for layer in spec.model.expanded()}["head"] == {"weight": "emb.weight"}
    plan = planner.plan(spec, strategy="group", group_size=1, num_in_group=1)
    assert plan.summary.total_bytes == 40 * 20 * 4 + 3 * (20 * 20 + 20) * 4
    snap = snapshot(model)
    with runtime.apply(plan, model, device="cpu"):
        pass
    assert_same(model, snap, same_storage=False)
    assert model.head.weight.untyped_storage().data_ptr() == model.emb.weight.untyped_storage().data_ptr()


def test_the_owner_is_the_view_that_covers_the_others_even_when_named_later():
    model = TiedHead()
    big = torch.randn(3, 20, 20)
    for i, layer in enumerate(model.layers):
        layer.weight = nn.Parameter(big[i])
    model.fused = nn.Module()  # registered last: the one holding every byte
    model.fused.weight = nn.Parameter(big)
    ties = {layer.name: layer.tied for layer in runtime.describe(model).model.expanded() if layer.tied}
    assert ties["layers.0"] == {"weight": "fused.weight"} and ties["layers.2"] == {"weight": "fused.weight"}


# -- random tie and view structures ------------------------------------------------------------------

VIEWS = ["whole", "t", "rows", "cols", "flat", "narrow_t"]


def _view(base: torch.Tensor, kind: str, a: int, b: int) -> torch.Tensor:
    rows = base.shape[0]
    lo, hi = sorted((a % rows, b % rows))
    hi = max(hi, lo + 1)
    return {"whole": lambda: base, "t": lambda: base.t(), "rows": lambda: base[lo:hi],
            "cols": lambda: base[:, lo % base.shape[1]:], "flat": lambda: base.view(-1),
            "narrow_t": lambda: base[lo:hi].t()}[kind]()


class Views(nn.Module):
    def __init__(self, bases: list[tuple[int, int]], members: list[tuple[int, str, int, int, int]], layers: int):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        stores = [torch.randn(r, c, generator=g) for r, c in bases]
        self.layers = nn.ModuleList(nn.Module() for _ in range(layers))
        for i, layer in enumerate(self.layers):
            layer.own = nn.Parameter(torch.randn(4, generator=g))  # something each layer may offload
        for j, (b, kind, x, y, where) in enumerate(members):
            setattr(self.layers[where % layers], f"v{j}", nn.Parameter(_view(stores[b % len(stores)], kind, x, y)))


def _span(t: torch.Tensor) -> tuple[int, int]:
    lo = t.storage_offset() * t.element_size()
    last = sum((s - 1) * st_ for s, st_ in zip(t.shape, t.stride()))
    return lo, lo + (last + 1) * t.element_size()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bases=st.lists(st.tuples(st.integers(2, 6), st.integers(2, 6)), min_size=1, max_size=3),
       members=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(VIEWS), st.integers(0, 9), st.integers(0, 9),
                                  st.integers(0, 5)), min_size=1, max_size=6),
       layers=st.integers(2, 4), backend=st.sampled_from(["prefetch", "uva"]))
def test_random_views_round_trip_with_their_aliasing_and_bytes_once(bases, members, layers, backend):
    model = Views(bases, members, layers)
    named = dict(model.named_parameters(remove_duplicate=False))
    groups: dict[int, list[torch.Tensor]] = {}
    for t in named.values():
        groups.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    spans = {k: [_span(t) for t in ts] for k, ts in groups.items()}
    covered = all(any(s == (min(a for a, _ in ss), max(b for _, b in ss)) for s in ss) for ss in spans.values())
    if not covered:
        with pytest.raises(ValueError, match="views of one storage, and none of them covers the others"):
            runtime.describe(model)
        return
    spec = runtime.describe(model)
    plan = planner.plan(spec, strategy="group", group_size=2, num_in_group=1, prefetch_step=1, backend=backend)
    # bytes once: each storage counts the bytes its views span
    assert plan.summary.total_bytes == sum(max(b for _, b in ss) - min(a for a, _ in ss) for ss in spans.values())
    offloaded = {f"{layer.name}.{r}" for layer in plan.layers for r in layer.offloaded}
    shared = {n for n, t in named.items() if len(groups[t.untyped_storage().data_ptr()]) > 1}
    assert not offloaded & shared  # a view of a shared storage never moves alone
    snap, before = snapshot(model), partition(model)
    with runtime.apply(plan, model, device="cpu"):
        now = partition(model)  # offloaded tensors share slots or arenas; the shared storages are intact
        assert all(any(g <= h for h in now) for g in before if len(g) > 1)
    assert_same(model, snap, same_storage=False)
    assert partition(model) == before
    for ts in groups.values():  # moving a group (as apply does across devices) keeps it one storage
        values, strides = [t.detach().clone() for t in ts], [t.stride() for t in ts]
        rehome(ts, torch.device("cpu"))
        assert len({t.untyped_storage().data_ptr() for t in ts}) == 1
        assert [t.stride() for t in ts] == strides and all(torch.equal(t, v) for t, v in zip(ts, values))


# -- on the GPU (the lead runs these on an H200) ---------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["prefetch", "uva"])
def test_on_cuda_views_move_as_one_and_come_back_as_one(backend):
    model = TiedHead()
    model.extra = nn.Module()
    model.extra.weight = nn.Parameter(model.emb.weight[4:12])  # a slice of the same storage, too
    with torch.no_grad():
        want = model(IDS)
    snap, groups = snapshot(model), partition(model)
    plan = planner.plan(runtime.describe(model), strategy="group", group_size=1, num_in_group=1, backend=backend)
    with runtime.apply(plan, model, device="cuda"):
        assert model.head.weight.is_cuda and {"head.weight", "emb.weight", "extra.weight"} in partition(model)
        assert model.head.weight.data_ptr() == model.emb.weight.data_ptr()
        assert model.extra.weight.data_ptr() == model.emb.weight[4:12].data_ptr()
        with torch.no_grad():
            assert torch.allclose(model(IDS.cuda()).cpu(), want, atol=1e-5)
    assert_same(model, snap, same_storage=False)
    assert partition(model) == groups and not model.emb.weight.is_cuda


@pytest.mark.parametrize("backend", ["prefetch", "uva"])
def test_describe_while_applied_sees_the_values_not_the_slots(backend):
    """Offloaded tensors share slots and host arenas while applied: not ties, and not their shapes."""
    from models import LlamaConfig, make_llama

    model = make_llama(LlamaConfig(vocab=64, dim=32, layers=4, heads=4, kv_heads=2, hidden=48, tie_embeddings=True))
    spec = runtime.describe(model)
    plan = planner.plan(spec, strategy="group", group_size=2, num_in_group=1, prefetch_step=1, backend=backend)
    with runtime.apply(plan, model, device="cpu"):
        assert runtime.describe(model) == spec
        assert runtime.describe(nn.Sequential(model.model.layers[1])).model.layers[0].params  # a part, in a new container
