"""The runtime on the CPU: validation, slot mapping, hooks, schedule, restore (no GPU needed).

With ``device="cpu"`` the offloaders run the same code paths as on a GPU, with synchronous
copies: a slot overwritten too early or a wrong slot mapping changes the output, so every
test compares against the unoffloaded model, bit for bit.
"""

from __future__ import annotations

import copy
import gc

import pytest

torch = pytest.importorskip("torch")

import planner  # noqa: E402
import runtime  # noqa: E402
from models import LlamaConfig, make_llama  # noqa: E402
from runtime import prefetch_ops as ops  # noqa: E402
from runtime.apply import _ACTIVE  # noqa: E402
from runtime.errors import ApplyError, PlanMismatchError  # noqa: E402
from schemas import InputError  # noqa: E402

CFG = LlamaConfig(vocab=256, dim=64, layers=9, heads=4, kv_heads=2, hidden=160)


@pytest.fixture()
def model():
    return make_llama(CFG)


@pytest.fixture()
def spec(model):
    return runtime.describe(model, name="tiny-llama")


def snapshot(model):
    return {k: (v.detach().clone(), v.device, v.stride(), id(v)) for k, v in model.state_dict(keep_vars=True).items()}


def assert_restored(model, snap):
    now = model.state_dict(keep_vars=True)
    assert now.keys() == snap.keys()
    for k, (value, device, stride, ident) in snap.items():
        t = now[k]
        assert id(t) == ident, f"{k}: not the same Parameter object"
        assert t.device == device and t.stride() == stride, k
        assert torch.equal(t.detach(), value), f"{k}: values changed"
    hooks = [m for m in model.modules() if m._forward_pre_hooks or m._forward_hooks]
    assert not hooks, "hooks left behind"


def group_plan(spec, g, k, step, backend="prefetch"):
    return planner.plan(spec, strategy="group", group_size=g, num_in_group=k, prefetch_step=step, backend=backend)


IDS = torch.randint(0, 250, (2, 6), generator=torch.Generator().manual_seed(1))

# (group_size, num_in_group, prefetch_step = slots) over the 9 blocks: N offloaded layers in min(N, step) slots
GROUPS = [
    (1, 1, 1), (3, 2, 1), (3, 1, 1), (2, 1, 1), (9, 1, 1),  # one slot: 9, 6, 3, 4 and 1 offloaded layers
    (3, 2, 2), (4, 3, 2), (2, 1, 2),  # N a multiple of the slots
    (1, 1, 2), (1, 1, 4), (1, 1, 7), (2, 2, 5), (5, 2, 2), (2, 1, 3), (4, 3, 4), (3, 2, 4),  # N not a multiple
    (5, 2, 3), (1, 1, 9), (1, 1, 12),  # as many slots as offloaded layers
]


@pytest.mark.parametrize("g,k,step", GROUPS)
def test_prefetch_matches_unoffloaded(model, spec, g, k, step):
    want = copy.deepcopy(model)(IDS)
    plan = group_plan(spec, g, k, step)
    n = plan.summary.offloaded_layers
    assert plan.summary.prefetch_step == step and plan.buffer_pool.slots == min(n, step)
    snap = snapshot(model)
    with runtime.apply(plan, model, device="cpu", stats=True) as handle:
        for _ in range(3):  # wrap-around: later forwards use what the previous one prefetched
            assert torch.equal(model(IDS), want)
        forwards = handle.stats()["forwards"]
    assert len(forwards) == 3 and all(f["late_copies"] == 0 for f in forwards)  # every layer found its own weights
    assert_restored(model, snap)


def test_uva_matches_unoffloaded(model, spec):
    want = copy.deepcopy(model)(IDS)
    plan = group_plan(spec, 3, 2, 1, backend="uva")
    assert plan.summary.backend == "uva" and plan.summary.offloaded_bytes > 0
    snap = snapshot(model)
    with runtime.apply(plan, model, device="cpu"):
        assert torch.equal(model(IDS), want)
    assert_restored(model, snap)


def test_budget_plan_matches(model, spec):
    total = sum(layer.nbytes for layer in spec.model.expanded())
    from planner.errors import InfeasibleError

    try:
        plan = planner.plan(spec, gpu_budget=int(total * 0.7), backend="prefetch")
    except InfeasibleError as exc:
        plan = planner.plan(spec, gpu_budget=exc.min_gpu_budget, backend="prefetch")
    want = copy.deepcopy(model)(IDS)
    with runtime.apply(plan, model, device="cpu"):
        assert torch.equal(model(IDS), want)


def test_offloaded_params_point_into_slots(model, spec):
    plan = group_plan(spec, 3, 2, 2)
    h = runtime.apply(plan, model, device="cpu")
    pool = h.offloader.pool
    for layer in plan.layers:
        for rel in layer.offloaded:
            p = model.get_parameter(f"{layer.name}.{rel}")
            assert p.data_ptr() == pool.buffer(rel, layer.params[rel], layer.prefetch.slot).data_ptr()
        for rel in set(layer.params) - set(layer.offloaded):
            assert model.get_parameter(f"{layer.name}.{rel}").device.type == "cpu"
    h.remove()


def test_stats_count_each_offloaded_byte_once_per_forward(model, spec):
    plan = group_plan(spec, 2, 1, 1)
    with runtime.apply(plan, model, device="cpu", stats=True) as h:
        for _ in range(3):
            model(IDS)
        forwards = h.stats()["forwards"]
    assert len(forwards) >= 3
    assert all(f["bytes_copied"] == plan.summary.offloaded_bytes for f in forwards[-2:])
    assert all(f["late_copies"] == 0 for f in forwards)  # the schedule always delivered in time


def test_interrupted_forward_recovers(model, spec):
    """A forward that raises half-way leaves slots holding other layers' weights: the next
    forward must notice and copy what it needs."""
    want = copy.deepcopy(model)(IDS)
    plan = group_plan(spec, 2, 1, 2)
    with runtime.apply(plan, model, device="cpu"):
        boom = model.model.layers[4].register_forward_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
        with pytest.raises(RuntimeError, match="boom"):
            model(IDS)
        boom.remove()
        assert torch.equal(model(IDS), want)
        assert torch.equal(model(IDS), want)


def test_model_on_a_submodule_call(model, spec):
    """Calling only the backbone (no root post-hook) still gives right results."""
    want_backbone = copy.deepcopy(model).model(IDS)
    plan = group_plan(spec, 2, 1, 1)
    with runtime.apply(plan, model, device="cpu"):
        for _ in range(2):
            assert torch.equal(model.model(IDS), want_backbone)


def test_many_cycles_leave_nothing_behind(model, spec):
    plans = [group_plan(spec, 2, 1, 1), group_plan(spec, 3, 1, 1, backend="uva")]
    snap = snapshot(model)
    for i in range(100):
        h = runtime.apply(plans[i % 2], model, device="cpu")
        if i % 10 == 0:
            model(IDS)
        h.remove()
    gc.collect()
    assert_restored(model, snap)
    assert not ops._OFFLOADERS and not _ACTIVE


def test_remove_twice_is_harmless(model, spec):
    snap = snapshot(model)
    h = runtime.apply(group_plan(spec, 2, 1, 1), model, device="cpu")
    h.remove()
    h.remove()
    assert_restored(model, snap)


def test_plan_path_accepted(model, spec, tmp_path):
    from schemas import dump_model

    path = tmp_path / "plan.yaml"
    path.write_text(dump_model(group_plan(spec, 2, 1, 1)))
    want = copy.deepcopy(model)(IDS)
    with runtime.apply(str(path), model, device="cpu"):
        assert torch.equal(model(IDS), want)


# -- bad input: a clear error, and the model exactly as it was -------------------------------

def test_plan_for_another_model(model):
    other = make_llama(LlamaConfig(vocab=256, dim=96, layers=6, heads=4, kv_heads=2, hidden=160))
    plan = group_plan(runtime.describe(other), 2, 1, 1)
    snap = snapshot(model)
    with pytest.raises(PlanMismatchError) as err:
        runtime.apply(plan, model, device="cpu")
    msg = str(err.value)
    assert "shape" in msg and "nothing was moved" in msg
    assert len(err.value.problems) > 5  # every difference, not just the first
    assert_restored(model, snap)


def test_wrong_shape_and_dtype_listed_together(model, spec):
    plan = group_plan(spec, 2, 1, 1)
    model.model.layers[3].mlp.up_proj.weight.data = torch.zeros(10, 10, dtype=torch.bfloat16)
    model.model.layers[5].self_attn.q_proj.weight.data = model.model.layers[5].self_attn.q_proj.weight.data.float()
    snap = snapshot(model)
    with pytest.raises(PlanMismatchError) as err:
        runtime.apply(plan, model, device="cpu")
    text = str(err.value)
    assert "model.layers.3.mlp.up_proj.weight" in text and "shape [10, 10]" in text
    assert "model.layers.5.self_attn.q_proj.weight" in text and "dtype float32" in text
    assert_restored(model, snap)


def test_missing_layer(model, spec):
    plan = group_plan(spec, 2, 1, 1)
    del model.model.layers[8]
    with pytest.raises(PlanMismatchError, match="model.layers.8"):
        runtime.apply(plan, model, device="cpu")


def test_meta_device_params_are_named(spec):
    with torch.device("meta"):
        from models import Llama

        meta = Llama(CFG).to(torch.bfloat16)
    with pytest.raises(ApplyError, match="meta device.*model.embed_tokens.weight"):
        runtime.apply(group_plan(spec, 2, 1, 1), meta, device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_plan_without_cuda(model, spec):
    snap = snapshot(model)
    with pytest.raises(ApplyError, match="CUDA is not available"):
        runtime.apply(group_plan(spec, 2, 1, 1), model)  # default device is cuda
    assert_restored(model, snap)


def test_budget_smaller_than_buffer_pool(model, spec):
    plan = group_plan(spec, 2, 1, 1)
    bad = plan.model_copy(update={"summary": plan.summary.model_copy(update={"gpu_budget_bytes": 1000})})
    snap = snapshot(model)
    with pytest.raises(InputError, match="buffer pool .* larger than the plan's GPU budget"):
        runtime.apply(bad, model, device="cpu")  # a copy skips validation: apply checks the plan itself
    assert_restored(model, snap)


def test_failure_during_apply_rolls_back(model, spec, monkeypatch):
    from runtime.prefetch import PrefetchOffloader

    def fail(self):
        raise RuntimeError("injected failure after the weights moved")

    monkeypatch.setattr(PrefetchOffloader, "post_init", fail)
    snap = snapshot(model)
    with pytest.raises(RuntimeError, match="injected"):
        runtime.apply(group_plan(spec, 2, 1, 1), model, device="cpu")
    assert_restored(model, snap)
    assert not ops._OFFLOADERS and not _ACTIVE


# -- unusual tensors -----------------------------------------------------------------------

def test_tied_embeddings_stay_tied(spec):
    model = make_llama(LlamaConfig(vocab=256, dim=64, layers=4, heads=4, kv_heads=2, hidden=160,
                                   tie_embeddings=True))
    tspec = runtime.describe(model)
    tied = [(layer.name, t) for layer in tspec.model.expanded() for t in layer.tied.items()]
    assert tied == [("lm_head", ("weight", "model.embed_tokens.weight"))]
    want = copy.deepcopy(model)(IDS)
    plan = group_plan(tspec, 2, 1, 1)
    snap = snapshot(model)
    with runtime.apply(plan, model, device="cpu"):
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert torch.equal(model(IDS), want)
    assert_restored(model, snap)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_non_contiguous_params_and_buffers_round_trip():
    class Strided(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(48, 32).t())  # stride (1, 32)
            self.register_buffer("scale", torch.rand(32))

        def forward(self, x):
            return (x @ self.weight) * self.scale.sum()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(Strided() for _ in range(4))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)[..., :32]
            return x

    torch.manual_seed(0)
    net = Net()
    spec = runtime.describe(net)
    p = spec.model.layers[0].params["weight"]
    assert p.stride == [1, 32] and spec.model.layers[0].params["scale"].buffer
    x = torch.randn(3, 32)
    want = net(x)
    snap = snapshot(net)
    for backend in ("prefetch", "uva"):
        plan = group_plan(spec, 2, 1, 1, backend=backend)
        with runtime.apply(plan, net, device="cpu", read_only_buffers=True):  # the scales are never written
            assert torch.equal(net(x), want)
        assert_restored(net, snap)


def test_torch_compile_keeps_ops_in_order():
    """fullgraph=True: the custom ops compile without graph breaks and the result is exact."""
    model = make_llama(LlamaConfig(vocab=256, dim=64, layers=4, heads=4, kv_heads=2, hidden=160))
    want = copy.deepcopy(model)(IDS)
    plan = group_plan(runtime.describe(model), 2, 1, 1)
    with runtime.apply(plan, model, device="cpu"):
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(IDS), want)
        assert torch.equal(compiled(IDS), want)


def test_uva_fallback_copies_per_layer_with_a_warning(model, spec, monkeypatch):
    """Where UVA views are unavailable, weights are copied in before each layer and dropped after."""
    import runtime.uva as uva

    monkeypatch.setattr(uva, "uva_supported", lambda device: False)
    want = copy.deepcopy(model)(IDS)
    plan = group_plan(spec, 3, 2, 1, backend="uva")
    snap = snapshot(model)
    with pytest.warns(RuntimeWarning, match="UVA .* not available"):
        h = runtime.apply(plan, model, device="cpu")
    layer = next(layer for layer in plan.layers if layer.offloaded)
    param = model.get_parameter(f"{layer.name}.{layer.offloaded[0]}")
    assert param.numel() == 0  # only a placeholder between forwards
    assert torch.equal(model(IDS), want) and torch.equal(model(IDS), want)
    assert param.numel() == 0
    h.remove()
    assert_restored(model, snap)


def test_fp8_weights_with_scales_round_trip():
    """Quantized layers: fp8 weights and their float scales (a buffer), byte-exact through apply/remove."""
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no float8 in this torch")

    class Fp8Linear(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            w = torch.randn(n, n)
            scale = w.abs().amax(dim=1, keepdim=True) / 448
            self.weight = torch.nn.Parameter((w / scale).to(torch.float8_e4m3fn), requires_grad=False)
            self.register_buffer("weight_scale", scale)
            self.packed = torch.nn.Parameter(torch.randint(0, 255, (n, n // 2), dtype=torch.uint8),
                                             requires_grad=False)

        def forward(self, x):
            return x @ (self.weight.float() * self.weight_scale).t() + self.packed.float().mean()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(Fp8Linear(32) for _ in range(6))

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(layer(x))
            return x

    torch.manual_seed(0)
    net = Net()
    spec = runtime.describe(net)
    params = {t.name: t for t in spec.model.expanded()[0].params}
    assert params["weight"].dtype == "float8_e4m3fn" and params["weight_scale"].buffer
    assert params["packed"].dtype == "uint8" and params["weight_scale"].dtype == "float32"
    x = torch.randn(4, 32)
    want = net(x)
    snap = snapshot(net)
    for backend in ("prefetch", "uva"):
        plan = group_plan(spec, 2, 1, 1, backend=backend)
        assert plan.summary.offloaded_bytes == 3 * (32 * 32 + 32 * 4 + 32 * 16)
        with runtime.apply(plan, net, device="cpu", read_only_buffers=True):  # scales kept as buffers
            assert torch.equal(net(x), want)
        assert_restored(net, snap)


def test_execution_order_other_than_the_plan_is_reported_and_still_correct(model, spec, caplog):
    """A spec whose layer order is not the model's: results stay exact (late copies), and the
    first forward says so."""
    import logging

    class Reversed(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            x = self.inner.model.embed_tokens(ids)
            for layer in reversed(self.inner.model.layers):
                x = layer(x)
            return self.inner.lm_head(self.inner.model.norm(x))

    wrapped = Reversed(model)
    want = copy.deepcopy(wrapped)(IDS)
    plan = group_plan(runtime.describe(wrapped), 2, 1, 1)
    with caplog.at_level(logging.WARNING, logger="runtime"):
        with runtime.apply(plan, wrapped, device="cpu", stats=True) as h:
            assert torch.equal(wrapped(IDS), want) and torch.equal(wrapped(IDS), want)
            late = [f["late_copies"] for f in h.stats()["forwards"]]
    assert "did not run in the plan's order" in caplog.text
    assert caplog.text.count("did not run in the plan's order") == 1
    assert all(n > 0 for n in late)


def test_progress_and_summary_are_logged(model, spec, caplog):
    """Off a terminal, progress is a log line every 10%; one summary line says what moved where."""
    import logging

    plan = group_plan(spec, 2, 1, 1)
    with caplog.at_level(logging.INFO, logger="runtime"):
        with runtime.apply(plan, model, device="cpu", progress=True):
            pass
    progress = [r.message for r in caplog.records if r.message.startswith("apply offload plan:")]
    assert 5 <= len(progress) <= 11 and progress[-1].startswith("apply offload plan: 100%")
    summary = [r.message for r in caplog.records if r.message.startswith("offload applied")]
    assert len(summary) == 1
    n_off = sum(len(layer.offloaded) for layer in plan.layers)
    assert f"{n_off} offloaded to plain host memory" in summary[0] and "buffer pool" in summary[0]


def test_ties_between_distinct_parameter_objects():
    """Two Parameter objects sharing one storage (not the same object), the tied one listed
    first: they still share storage after apply and after remove."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(16, 40, bias=False)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
            self.embed = torch.nn.Embedding(40, 16)
            self.embed.weight = torch.nn.Parameter(self.head.weight.data)  # same storage, new object

        def forward(self, ids):
            x = self.embed(ids)
            for block in self.blocks:
                x = torch.relu(block(x))
            return self.head(x)

    torch.manual_seed(0)
    net = Net()
    assert net.embed.weight is not net.head.weight
    spec = runtime.describe(net)
    assert [(layer.name, dict(layer.tied)) for layer in spec.model.expanded() if layer.tied] == [
        ("embed", {"weight": "head.weight"})]
    ids = torch.randint(0, 40, (2, 5))
    want = net(ids)
    snap = snapshot(net)
    with runtime.apply(group_plan(spec, 2, 1, 1), net, device="cpu"):
        assert net.embed.weight.data_ptr() == net.head.weight.data_ptr()
        assert torch.equal(net(ids), want)
    assert_restored(net, snap)
    assert net.embed.weight.data_ptr() == net.head.weight.data_ptr()


def test_apply_finds_each_name_of_the_plan_once_and_each_slot_buffer_once(model, spec, monkeypatch):
    """One check resolves every param and tied name into one record (runtime/check.py); nothing after it looks
    a name up again, and the prefetch offloader looks each prefetched param's slot buffer up once."""
    from collections import Counter

    import runtime.check as check_mod
    import runtime.tensors as tensors_mod
    from runtime.gpu_buffers import BufferPool

    plan = group_plan(spec, 3, 1, 2)
    found: Counter = Counter()
    buffers: Counter = Counter()
    real_find, real_buffer = check_mod.resolve_in, BufferPool.buffer

    def counting_find(module, layer, rel):
        found[(layer, rel)] += 1
        return real_find(module, layer, rel)

    def counting_buffer(pool, rel, p, slot):
        buffers[rel] += 1
        return real_buffer(pool, rel, p, slot)

    monkeypatch.setattr(check_mod, "resolve_in", counting_find)
    monkeypatch.setattr(tensors_mod, "resolve", lambda *a: pytest.fail("a name looked up again"))
    monkeypatch.setattr(BufferPool, "buffer", counting_buffer)
    want = model(IDS)
    with runtime.apply(plan, model, device="cpu"):
        assert torch.equal(model(IDS), want)
    names = Counter((layer.name, rel) for layer in plan.layers for rel in {*layer.params, *layer.tied})
    assert found == names
    prefetched = Counter(rel for layer in plan.layers if layer.prefetch for rel in layer.prefetched)
    assert prefetched and buffers == prefetched
