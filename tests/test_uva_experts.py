"""Layers whose routed experts are all read through UVA: prefill-sized calls padded to torch's tall tiles
(schemas/grouped_tiles.py, runtime/uva_experts.py). The tile arithmetic, and on the CPU the forward's install,
dispatch and removal; tests/test_uva_experts_gpu.py checks the outputs on a GPU."""

from __future__ import annotations

import pytest

from schemas.grouped_tiles import SHORT_TILE_ROWS, padded_rows, tall_tiles

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_tall_tiles_above_the_short_tiles_rows_a_group():
    assert not tall_tiles(128 * 128, 128)  # a 2,048-token prefill at top-8 of 128: short tiles
    assert tall_tiles(129 * 128, 128)
    assert tall_tiles(16384, 64)  # half the experts in a call of their own, every pair's row in it
    assert not tall_tiles(16384, 0)


@pytest.mark.parametrize("rows, groups, want", [
    (16384, 128, 129 * 128),  # 128 a group: padded just past the short tile's rows
    (65 * 128, 128, 129 * 128),  # just over half: at most about twice the rows
    (64 * 128, 128, 64 * 128),  # half or less: each expert's rows fit one short tile anyway
    (256, 128, 256),  # a decode step: untouched
    (129 * 128, 128, 129 * 128),  # tall already
    (300, 0, 300),
])
def test_padded_rows(rows, groups, want):
    got = padded_rows(rows, groups)
    assert got == want
    assert got >= rows and (got == rows or tall_tiles(got, groups))
    assert got <= 2 * rows  # never more than twice the call's rows
    assert SHORT_TILE_ROWS == 128


def _uva_plan(model):
    import planner
    import runtime

    spec = runtime.describe(model)  # weights only: every expert off the GPU
    spec = spec.model_copy(update={"memory": spec.memory.model_copy(update={"workspace": 0, "activations": 0})})
    return planner.plan(spec, strategy="budget", backend="uva", kinds=["routed_experts"], gpu_budget=468_480)


def test_the_forward_is_installed_on_uva_experts_and_removed_with_the_plan():
    import runtime
    from moe_models import make_moe
    from runtime.uva_experts import TallTileForward

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    plan = _uva_plan(model)
    layers = model.model.layers
    assert all(set(f"mlp.experts.{n}" for n in ("gate_up_proj", "down_proj")) <= set(plan.layer(f"model.layers.{i}").uva)
               for i in range(len(layers)))
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
    with runtime.apply(plan, model, device="cpu"):
        assert all(isinstance(layer.mlp.experts.__dict__.get("forward"), TallTileForward) for layer in layers)
        with torch.no_grad():
            got = model(ids).logits
    assert torch.equal(got, want)  # on the CPU every call is the module's own
    assert all("forward" not in layer.mlp.experts.__dict__ for layer in layers)


def test_a_split_layer_keeps_its_own_forward():
    """Layers whose experts are split by expert (runtime/cpu_experts.py) are not the tall-tile forward's."""
    from moe_models import make_moe, split_plan
    from runtime.uva_experts import uva_experts_modules

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    assert list(uva_experts_modules(split_plan(model), model)) == []
    assert len(list(uva_experts_modules(_uva_plan(model), model))) == len(model.model.layers)


def test_tensor_parallel_shards_keep_the_modules_forward(monkeypatch):
    """Experts held as DTensor shards (a rank plan) keep transformers' forward: the runtime's grouped path reads
    plain tensors."""
    import runtime.uva_experts as ue
    from moe_models import make_moe

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    plan = _uva_plan(model)
    assert list(ue.uva_experts_modules(plan, model))
    monkeypatch.setattr(ue, "is_dtensor", lambda t: t is not None)
    assert list(ue.uva_experts_modules(plan, model)) == []


def test_the_tall_tile_path_gives_the_modules_rows(monkeypatch):
    """Where it applies (a GPU's prefill; forced here on the CPU) the forward runs the runtime's grouped path over
    every expert: the module's output."""
    import runtime.uva_experts as ue
    from moe_models import make_moe

    model = make_moe("qwen3_moe", implementation="grouped_mm").float()
    experts = model.model.layers[0].mlp.experts
    own = experts.forward
    forward = ue.TallTileForward(experts, own)
    g = torch.Generator().manual_seed(2)
    tokens, k = 64, model.config.num_experts_per_tok
    hidden = torch.randn(tokens, model.config.hidden_size, generator=g)
    index = torch.stack([torch.randperm(experts.num_experts, generator=g)[:k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, k, generator=g), -1)
    calls = []
    monkeypatch.setattr(ue, "tall_tiles_apply", lambda *a: calls.append(a) or True)
    with torch.no_grad():
        got = forward(hidden, index, weights)
        want = own(hidden, index, weights)
    assert calls
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(ue, "tall_tiles_apply", lambda *a: False)
    with torch.no_grad():
        assert torch.equal(forward(hidden, index, weights), want)


def test_compiling_keeps_the_modules_forward(monkeypatch):
    """While torch.compile traces (``torch.compiler.is_compiling``), a call the tall tiles would take runs the module's
    own forward: inductor rounds the padded path otherwise than the resident model's compiled forward."""
    import runtime.uva_experts as ue
    from moe_models import make_moe

    model = make_moe("qwen3_moe", implementation="grouped_mm").float()
    experts = model.model.layers[0].mlp.experts
    seen = []
    forward = ue.TallTileForward(experts, lambda *a: seen.append("own") or a[0])
    monkeypatch.setattr(ue, "tall_tiles_apply", lambda *a: True)
    monkeypatch.setattr(ue, "part_rows", lambda *a: seen.append("tall") or a[4].repeat_interleave(2, 0))
    monkeypatch.setattr(ue, "join_rows", lambda rows, tokens, dtype: rows[:tokens])
    hidden = torch.zeros(4, model.config.hidden_size)
    index = torch.zeros(4, 2, dtype=torch.long)
    weights = torch.ones(4, 2)
    forward(hidden, index, weights)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    forward(hidden, index, weights)
    assert seen == ["tall", "own"]


def test_a_failed_apply_takes_the_forwards_away(monkeypatch):
    """An apply that fails after the forwards went on (here the write watch's install) leaves every experts module
    as it was: no forward of its own, the same logits."""
    import runtime
    from moe_models import make_moe
    from runtime.writes import WriteWatch

    model = make_moe("qwen3_moe", implementation="grouped_mm")
    ids = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(ids).logits

    def boom(*_a, **_k):
        raise RuntimeError("injected")

    monkeypatch.setattr(WriteWatch, "install", boom)
    with pytest.raises(RuntimeError, match="injected"):
        runtime.apply(_uva_plan(model), model, device="cpu")
    assert all("forward" not in layer.mlp.experts.__dict__ for layer in model.model.layers)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
