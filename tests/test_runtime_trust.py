"""The runtime never leaves a model computing with wrong weights.

A failed apply leaves the model exactly as it was (failures injected at every step);
remove() restores everything it can, raises only afterwards and can be retried; guards
refuse conversions while applied and leave nothing behind; state_dict() while applied is
the truth. Misuse sequences with one wrong call each are in tests/corpus/runtime_calls.py.
"""

from __future__ import annotations

import copy
import gc
import importlib
import logging
import pickle
import weakref

import pytest

torch = pytest.importorskip("torch")

import planner  # noqa: E402
import runtime  # noqa: E402
from model_state import assert_same, differences, snapshot  # noqa: E402
from models import LlamaConfig, make_llama  # noqa: E402
from runtime import prefetch_ops as ops  # noqa: E402
from runtime.apply import _ACTIVE  # noqa: E402
from runtime.guard import AppliedModelError, handle_of  # noqa: E402
from runtime.placement import Placement  # noqa: E402
from schemas.spec_hash import spec_sha256  # noqa: E402
from runtime.teardown import RemoveError  # noqa: E402
from schemas import Plan  # noqa: E402

apply_mod = importlib.import_module("runtime.apply")  # the package exports the function under that name
check_mod = importlib.import_module("runtime.check")

CFG = LlamaConfig(vocab=64, dim=32, layers=5, heads=4, kv_heads=2, hidden=48)
IDS = torch.randint(0, 60, (2, 5), generator=torch.Generator().manual_seed(2))


def group_plan(model, backend="prefetch", g=2, k=1, step=1):
    return planner.plan(runtime.describe(model), strategy="group", group_size=g, num_in_group=k,
                        prefetch_step=step, backend=backend)


@pytest.fixture()
def model():
    return make_llama(CFG)


def out(model):
    with torch.no_grad():
        return model(IDS)


def nothing_registered():
    gc.collect()
    return not ops._OFFLOADERS and not _ACTIVE


def offloaded_names(plan):
    return {f"{layer.name}.{r}" for layer in plan.layers for r in layer.offloaded}


# -- a failed apply leaves the model exactly as it was ------------------------------------------

class Injected(Exception):
    pass


def _fail_on_call(n):
    """A wrapper factory: the n-th call (1-based) of the wrapped function raises Injected."""
    def wrap(fn):
        calls = [0]

        def wrapped(*args, **kwargs):
            calls[0] += 1
            if calls[0] == n:
                raise Injected(f"injected at call {n} of {fn.__qualname__}")
            return fn(*args, **kwargs)
        return wrapped
    return wrap


INJECTION_POINTS = [
    # (where, attribute holder, name, which call fails, whether any storage may have moved)
    ("first offloaded layer", "runtime.placement.Placement", "offload_layer", 1, False),
    ("second offloaded layer", "runtime.placement.Placement", "offload_layer", 2, True),
    ("packing a layer", "runtime.placement", "pack", 2, True),
    ("moving a resident param", "runtime.placement.Placement", "move", 7, True),
    ("moving unplanned tensors", "runtime.apply", "_move_unplanned", 1, True),
    ("creating the offloader", "runtime.apply", "make_offloader", 1, True),
    ("registering hooks", "runtime.prefetch.PrefetchOffloader", "wrap_modules", 1, True),
    ("pointing params at slots", "runtime.prefetch.PrefetchOffloader", "post_init", 1, True),
    ("a module's guards", "runtime.guard", "_held", 9, True),
    ("installing guards", "runtime.apply", "install", 1, True),
]


@pytest.mark.parametrize("where,holder,name,n,moved", INJECTION_POINTS, ids=[p[0] for p in INJECTION_POINTS])
def test_failed_apply_leaves_the_model_exactly_as_it_was(model, monkeypatch, where, holder, name, n, moved):
    if holder.endswith("PrefetchOffloader"):
        target = importlib.import_module("runtime.prefetch").PrefetchOffloader
    elif holder.endswith("Placement"):
        target = Placement
    else:
        target = importlib.import_module(holder)
    monkeypatch.setattr(target, name, _fail_on_call(n)(getattr(target, name)))
    plan = group_plan(model)
    want = out(model)
    snap = snapshot(model)
    with pytest.raises(Injected):
        runtime.apply(plan, model, device="cpu")
    assert_same(model, snap, same_storage=False)
    # resident params never move on the CPU; offloaded ones keep their storage when nothing moved yet
    may_move = offloaded_names(plan) if moved else set()
    kept = [n for n, p in model.named_parameters() if n not in may_move and p.data_ptr() != snap["tensors"][n][6]]
    assert not kept, kept
    assert handle_of(model) is None and nothing_registered()
    monkeypatch.undo()
    with runtime.apply(plan, model, device="cpu"):  # and the model can still be offloaded
        assert torch.equal(out(model), want)
    assert_same(model, snap, same_storage=False)


def test_keyboard_interrupt_during_apply_rolls_back(model, monkeypatch):
    from runtime.prefetch import PrefetchOffloader

    def interrupt(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(PrefetchOffloader, "post_init", interrupt)
    snap = snapshot(model)
    with pytest.raises(KeyboardInterrupt):
        runtime.apply(group_plan(model), model, device="cpu")
    assert_same(model, snap, same_storage=False)
    assert nothing_registered()


def test_resident_storage_is_kept_through_a_failed_apply(model, monkeypatch):
    from runtime.prefetch import PrefetchOffloader

    monkeypatch.setattr(PrefetchOffloader, "post_init", _fail_on_call(1)(PrefetchOffloader.post_init))
    plan = group_plan(model)
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    with pytest.raises(Injected):
        runtime.apply(plan, model, device="cpu")
    off = offloaded_names(plan)
    assert off and all(p.data_ptr() == ptrs[n] for n, p in model.named_parameters() if n not in off)


# -- remove() ---------------------------------------------------------------------------------

def test_remove_restores_everything_else_then_raises_and_can_be_retried(model, monkeypatch):
    from runtime.pinned import HostArena

    snap = snapshot(model)
    h = runtime.apply(group_plan(model), model, device="cpu")
    real_close = HostArena.close
    monkeypatch.setattr(HostArena, "close", _fail_on_call(1)(real_close))
    with pytest.raises(RemoveError, match="weights: .*injected") as err:
        h.remove()
    assert len(err.value.problems) == 1
    # every weight is back (the failing arena's values were copied before close), hooks and guards gone
    assert not h.active and handle_of(model) is None
    assert_same(model, snap, same_storage=False)
    assert len(h._placement.arenas) == 1  # the arena that failed to close is still held
    h.remove()  # retries only that
    assert not h._placement.arenas and not h._pending
    h.remove()  # and is then a no-op
    assert_same(model, snap, same_storage=False)
    assert nothing_registered()


def test_remove_continues_past_a_failing_hook_removal(model, monkeypatch):
    snap = snapshot(model)
    h = runtime.apply(group_plan(model), model, device="cpu")
    real = h.offloader.remove
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("hook removal failed")
        real()

    h._pending[0] = ("hooks", flaky)
    with pytest.raises(RemoveError, match="hooks: RuntimeError: hook removal failed"):
        h.remove()
    # weights and guards were restored although the first step failed
    assert handle_of(model) is None
    assert [p for p in differences(model, snap, same_storage=False) if not p.startswith("modules changed")] == []
    assert model.model.layers[1]._forward_pre_hooks  # only the offloader's hooks are still there
    h.remove()
    assert_same(model, snap, same_storage=False)


def test_a_param_packed_twice_is_restored_once(model):
    """The original bug: a plan naming a param twice made remove() raise AttributeError and leave
    the handle active. The placement packs a tensor once however often it is named."""
    from runtime.tensors import resolve

    snap = snapshot(model)
    placement = Placement()
    ref = resolve(model, "model.layers.1", "mlp.up_proj.weight")
    offloaded = placement.offload_layer([ref, ref, resolve(model, "model.layers.1", "mlp.up_proj.weight")], pin=False)
    assert len(offloaded) == 1 and len(placement.arenas) == 1
    assert placement.offload_layer([ref], pin=False) == []  # already offloaded
    assert placement.restore() == [] and placement.restore() == []
    assert_same(model, snap, same_storage=False)


def test_a_duplicate_plan_that_slips_past_the_checks_still_removes_cleanly(model, monkeypatch):
    plan = group_plan(model)
    i = next(i for i, layer in enumerate(plan.layers) if layer.offloaded)
    twice = plan.layers[i].model_construct(**{**dict(plan.layers[i]), "offloaded": plan.layers[i].offloaded * 2})
    bad = Plan.model_construct(**{**dict(plan), "layers": [*plan.layers[:i], twice, *plan.layers[i + 1:]]})
    monkeypatch.setattr(check_mod, "naming_problems", lambda plan, refs: [])
    monkeypatch.setattr(check_mod, "plan_problems", lambda plan: [])
    want, snap = out(model), snapshot(model)
    h = runtime.apply(bad, model, device="cpu")
    assert torch.equal(out(model), want)
    h.remove()
    assert not h.active
    assert_same(model, snap, same_storage=False)


def test_remove_after_a_forward_that_raised_midway(model):
    snap, want = snapshot(model), out(model)
    h = runtime.apply(group_plan(model, step=2), model, device="cpu")
    boom = model.model.layers[3].register_forward_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        out(model)
    boom.remove()
    h.remove()
    assert_same(model, snap, same_storage=False)
    assert torch.equal(out(model), want)


def test_fifty_cycles_leave_no_hooks_and_identical_weights(model):
    snap, want = snapshot(model), out(model)
    plans = [group_plan(model), group_plan(model, "uva", 3, 2), group_plan(model, "prefetch", 5, 3, 2)]
    for i in range(50):
        h = runtime.apply(plans[i % 3], model, device="cpu")
        if i % 7 == 0:
            assert torch.equal(out(model), want)
        h.remove()
    assert_same(model, snap, same_storage=False)
    assert nothing_registered()


def test_two_models_applied_at_once_are_both_right():
    a, b = make_llama(CFG, seed=1), make_llama(LlamaConfig(vocab=64, dim=48, layers=4, heads=4, kv_heads=2,
                                                           hidden=64), seed=2)
    want_a, want_b, snap_a, snap_b = out(a), out(b), snapshot(a), snapshot(b)
    ha = runtime.apply(group_plan(a), a, device="cpu")
    hb = runtime.apply(group_plan(b, "uva"), b, device="cpu")
    for _ in range(2):
        assert torch.equal(out(a), want_a) and torch.equal(out(b), want_b)
    ha.remove()
    assert torch.equal(out(b), want_b)
    hb.remove()
    assert_same(a, snap_a, same_storage=False)
    assert_same(b, snap_b, same_storage=False)


def test_a_dropped_handle_lives_as_long_as_its_model(model):
    snap, want = snapshot(model), out(model)
    runtime.apply(group_plan(model), model, device="cpu")  # handle not kept
    gc.collect()
    assert torch.equal(out(model), want) and torch.equal(out(model), want)
    h = handle_of(model)
    assert h is not None and h.active and handle_of(model.model.layers[2]) is h
    h.remove()
    assert_same(model, snap, same_storage=False)


def test_a_model_dropped_while_applied_is_freed():
    for backend in ("prefetch", "uva"):
        m = make_llama(CFG)
        runtime.apply(group_plan(m, backend), m, device="cpu")
        ref = weakref.ref(m)
        del m
        gc.collect()
        assert ref() is None, backend
    assert nothing_registered()


# -- guards while applied -------------------------------------------------------------------

@pytest.mark.parametrize("backend,fallback", [("prefetch", False), ("uva", False), ("uva", True)])
def test_state_dict_while_applied_is_the_true_weights(model, monkeypatch, backend, fallback):
    import runtime.uva as uva

    if fallback:  # offloaded params are empty placeholders between forwards
        monkeypatch.setattr(uva, "uva_supported", lambda device: False)
    truth = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(RuntimeWarning) if fallback else _nothing():
        h = runtime.apply(group_plan(model, backend), model, device="cpu")
    out(model)  # slots now hold the last layers' weights
    for sd in (model.state_dict(), model.model.state_dict(prefix="model.")):
        for k, v in sd.items():
            assert torch.equal(v, truth[k]) and v.dtype == truth[k].dtype, k
    h.remove()


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def test_refused_calls_change_nothing_and_every_guard_goes_with_remove(model):
    snap, want = snapshot(model), out(model)
    other = make_llama(CFG, seed=5).state_dict()
    h = runtime.apply(group_plan(model), model, device="cpu")
    calls = [lambda: model.half(), lambda: model.model.layers[4].to(torch.float64), lambda: copy.deepcopy(model),
             lambda: pickle.dumps(model), lambda: model.load_state_dict(other),
             lambda: model.state_dict(keep_vars=True), lambda: runtime.apply(group_plan(model), model, device="cpu")]
    for call in calls:
        with pytest.raises(AppliedModelError) as err:
            call()
        assert err.value.handle is h and "remove()" in str(err.value)
        assert torch.equal(out(model), want)
    h.remove()
    assert_same(model, snap, same_storage=False)
    assert type(model).__name__ == "Llama" and "_apply" not in model.__dict__
    twin = copy.deepcopy(model)  # copying, pickling and converting work again
    assert torch.equal(out(pickle.loads(pickle.dumps(model))), want) and torch.equal(out(twin), want)
    model.float()
    assert model.lm_head.weight.dtype == torch.float32


def test_guards_on_a_module_with_its_own_instance_attribute_are_put_back(model):
    def own_apply(fn, recurse=True):
        return type(model.lm_head)._apply(model.lm_head, fn, recurse)

    model.lm_head.__dict__["_apply"] = own_apply
    snap = snapshot(model)
    with runtime.apply(group_plan(model), model, device="cpu"):
        with pytest.raises(AppliedModelError):
            model.lm_head.half()
    assert model.lm_head.__dict__["_apply"] is own_apply
    assert_same(model, snap, same_storage=False)


# -- what the plan must cover ---------------------------------------------------------------------

def test_unplanned_move_is_an_explicit_opt_in(caplog):
    small, big = make_llama(LlamaConfig(vocab=64, dim=32, layers=3, heads=4, kv_heads=2, hidden=48)), \
        make_llama(LlamaConfig(vocab=64, dim=32, layers=6, heads=4, kv_heads=2, hidden=48))
    plan = group_plan(small)
    snap, want = snapshot(big), out(big)
    with pytest.raises(runtime.PlanMismatchError, match="not in the plan"):
        runtime.apply(plan, big, device="cpu")
    assert_same(big, snap)
    with caplog.at_level(logging.WARNING, logger="runtime"):
        with runtime.apply(plan, big, device="cpu", unplanned="move"):
            assert torch.equal(out(big), want)
    assert "not in the plan's memory accounting" in caplog.text
    assert_same(big, snap, same_storage=False)


def test_non_persistent_buffers_need_no_plan_entry(model):
    model.model.register_buffer("inv_freq", torch.arange(8.0), persistent=False)
    snap = snapshot(model)
    plan = group_plan(model)  # describe() leaves non-persistent buffers out
    assert all("inv_freq" not in p for layer in plan.layers for p in layer.params)
    with runtime.apply(plan, model, device="cpu"):
        pass
    assert_same(model, snap, same_storage=False)


def test_spec_hash_is_the_planners(model):
    from planner.build import spec_sha256 as planner_sha

    spec = runtime.describe(model)
    assert spec_sha256(spec) == planner_sha(spec)
    plan = planner.plan(spec, strategy="group", group_size=2, num_in_group=1, prefetch_step=1)
    with runtime.apply(plan, model, device="cpu", spec=spec):
        pass
    edited = spec.model_copy(update={"model": spec.model.model_copy(update={"name": "renamed"})})
    with pytest.raises(runtime.PlanMismatchError, match="another spec"):
        runtime.apply(plan, model, device="cpu", spec=edited)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend,origin", [("prefetch", "cpu"), ("uva", "cpu"), ("prefetch", "cuda")])
def test_on_cuda_guards_hold_and_state_dict_is_true(backend, origin):
    model = make_llama(CFG, device=origin)
    ids = IDS.to("cuda")
    with torch.no_grad():
        want = copy.deepcopy(model).cuda()(ids)
    truth = {k: v.clone() for k, v in model.state_dict().items()}
    snap = snapshot(model)
    h = runtime.apply(group_plan(model, backend), model, device="cuda")
    with torch.no_grad():
        assert torch.equal(model(ids), want)
    with pytest.raises(AppliedModelError):
        model.half()
    with pytest.raises(AppliedModelError):
        model.load_state_dict(truth)
    sd = model.state_dict()
    h.remove()
    torch.cuda.synchronize()
    # read after remove(): offloaded entries are copies, not views of the released pinned memory
    assert all(torch.equal(sd[k].cpu(), truth[k].cpu()) for k in truth)
    assert_same(model, snap, same_storage=False)
