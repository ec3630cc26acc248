"""Uses of an applied prefetch plan outside one forward of the whole model (runtime/forward_gate.py, apply):
each either computes with the right weights or is refused before anything changes.

A group plan (2 layers of every 2 offloaded: layers 1 and 3 share one slot) makes a slot hold another layer's
weights between forwards, which is what each case would otherwise read."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

import planner  # noqa: E402
import runtime  # noqa: E402
from model_state import assert_same, snapshot  # noqa: E402
from models import LlamaConfig, make_llama  # noqa: E402
from runtime.errors import ApplyError  # noqa: E402
from runtime.errors import ConcurrentForwardError  # noqa: E402

CFG = LlamaConfig(vocab=64, dim=32, layers=4, heads=4, kv_heads=2, hidden=48)
IDS = torch.randint(0, 60, (2, 5), generator=torch.Generator().manual_seed(3))


def shared_slot_plan(model):
    plan = planner.plan(runtime.describe(model), strategy="group", group_size=2, num_in_group=1, prefetch_step=1,
                        backend="prefetch")
    slots = {layer.prefetch.slot for layer in plan.layers if layer.prefetch is not None}
    assert len([layer for layer in plan.layers if layer.prefetch is not None]) == 2 and slots == {0}
    return plan


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids)


def test_a_submodule_called_on_its_own_uses_its_own_layers_weights():
    model, ref = make_llama(CFG), make_llama(CFG)
    x = torch.randn(1, 3, CFG.dim, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(4))
    with runtime.apply(shared_slot_plan(model), model, device="cpu"):
        logits(model)  # the slot now holds layer 3's weights
        with torch.no_grad():
            assert torch.equal(model.model.layers[1].mlp(x), ref.model.layers[1].mlp(x))
            assert torch.equal(model.model.layers[1].self_attn.q_proj(x), ref.model.layers[1].self_attn.q_proj(x))
            assert torch.equal(model.model.layers[3].mlp(x), ref.model.layers[3].mlp(x))
        assert torch.equal(logits(model), logits(ref))  # and the next whole forward is right


def test_a_second_thread_is_refused_while_a_forward_runs_and_the_first_is_right():
    model, ref = make_llama(CFG), make_llama(CFG)
    want = logits(ref)
    inside, go_on = threading.Event(), threading.Event()
    layer = model.model.layers[2]

    def hold(_module, _args):  # the first forward waits in layer 2 until the second thread has tried
        if threading.current_thread().name == "first":
            inside.set()
            go_on.wait(10)

    outcome = {}

    def first():
        outcome["first"] = torch.equal(logits(model), want)

    with runtime.apply(shared_slot_plan(model), model, device="cpu"):
        hook = layer.register_forward_pre_hook(hold)
        t = threading.Thread(target=first, name="first")
        t.start()
        assert inside.wait(10)
        with pytest.raises(ConcurrentForwardError, match="running in another thread"):
            logits(model)
        go_on.set()
        t.join(10)
        hook.remove()
        assert outcome["first"] is True
        assert torch.equal(logits(model), want)  # the gate was given back


def test_a_forward_that_raises_gives_the_gate_back_without_an_order_warning(caplog):
    model, ref = make_llama(CFG), make_llama(CFG)

    def boom(_module, _args):
        raise RuntimeError("injected")

    with runtime.apply(shared_slot_plan(model), model, device="cpu"):
        hook = model.model.layers[2].register_forward_pre_hook(boom)
        with pytest.raises(RuntimeError, match="injected"):
            logits(model)
        hook.remove()
        errors = []
        t = threading.Thread(target=lambda: errors.append(torch.equal(logits(model), logits(ref))))
        t.start()
        t.join(10)
        assert errors == [True]  # another thread may run: the failed forward gave the gate back
        with caplog.at_level("WARNING", logger="runtime"):
            assert torch.equal(logits(model), logits(ref))
        assert "did not run in the plan's order" not in caplog.text


def test_a_backward_that_would_read_a_refilled_slot_is_refused_and_one_that_would_not_is_exact():
    model, ref = make_llama(CFG, dtype=torch.float32), make_llama(CFG, dtype=torch.float32)
    with runtime.apply(shared_slot_plan(model), model, device="cpu"):
        out = model(IDS)  # layer 3's refill overwrote layer 1's weights, which autograd saved
        assert torch.equal(out, ref(IDS))
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.pow(2).mean().backward()
        assert torch.equal(logits(model), logits(ref))  # inference goes on as before
        # a frozen backbone: only the head learns, so no slot's weights were saved for the backward
        model.zero_grad(set_to_none=True)  # the refused backward had reached the head already
        for p in [*model.parameters(), *ref.parameters()]:
            p.requires_grad_(False)
        model.lm_head.weight.requires_grad_(True)
        ref.lm_head.weight.requires_grad_(True)
        model(IDS).pow(2).mean().backward()
        ref(IDS).pow(2).mean().backward()
        assert torch.equal(model.lm_head.weight.grad, ref.lm_head.weight.grad)


def test_a_backward_through_a_kv_cache_or_a_hooked_activation_is_refused_too():
    model = make_llama(CFG, dtype=torch.float32)
    seen = []
    with runtime.apply(shared_slot_plan(model), model, device="cpu"):
        hook = model.model.norm.register_forward_hook(lambda _m, _a, out: seen.append(out))
        model(IDS)
        hook.remove()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            seen[0].sum().backward()


def test_a_forward_inside_the_models_own_forward_keeps_the_gate_until_the_outer_one_ends():
    model, ref = make_llama(CFG), make_llama(CFG)
    want = logits(ref)
    inner, started = [], []

    def nested(_module, _args, _out):
        if not started:
            started.append(True)
            inner.append(logits(model, IDS[:, :3]))

    with runtime.apply(shared_slot_plan(model), model, device="cpu") as handle:
        gate = handle.offloader.gate
        hook = model.model.layers[0].register_forward_hook(nested)
        owners = []
        probe = model.model.layers[2].register_forward_pre_hook(lambda *_: owners.append((gate.owner, gate.depth)))
        assert torch.equal(logits(model), want)
        hook.remove()
        probe.remove()
        # the outer forward still held it: the model's forward and its base model's (a caller, forward_gate.callers)
        assert owners and all(o is not None and d == 2 for o, d in owners[-1:])
        assert torch.equal(inner[0], logits(ref, IDS[:, :3]))
        assert gate.owner is None and not gate._lock.locked()


@pytest.mark.parametrize("second", ["base", "model"])
def test_a_base_model_forward_takes_the_gate_and_a_second_thread_is_refused(second):
    """``model.model(...)`` (the base model, no head) runs the plan's layers without the model's own forward: it
    holds the gate too, so a second thread's forward of either is refused, and both threads' outputs are right."""
    model, ref = make_llama(CFG), make_llama(CFG)
    with torch.no_grad():
        want = ref.model(IDS)
    inside, go_on = threading.Event(), threading.Event()

    def hold(_module, _args):
        if threading.current_thread().name == "first":
            inside.set()
            go_on.wait(10)

    outcome = {}

    def first():
        with torch.no_grad():
            outcome["first"] = torch.equal(model.model(IDS), want)

    with runtime.apply(shared_slot_plan(model), model, device="cpu") as handle:
        hook = model.model.layers[2].register_forward_pre_hook(hold)
        t = threading.Thread(target=first, name="first")
        t.start()
        assert inside.wait(10)
        with pytest.raises(ConcurrentForwardError, match="running in another thread"), torch.no_grad():
            model.model(IDS) if second == "base" else model(IDS)
        go_on.set()
        t.join(10)
        hook.remove()
        assert outcome["first"] is True
        assert handle.offloader.gate.owner is None and not handle.offloader.gate._lock.locked()
        assert torch.equal(logits(model), logits(ref))
    assert "forward" not in model.model.__dict__  # remove() took the base model's wrapper off too


def test_a_forward_ended_by_keyboard_interrupt_gives_the_gate_back():
    model, ref = make_llama(CFG), make_llama(CFG)

    def interrupt(_module, _args):
        raise KeyboardInterrupt

    with runtime.apply(shared_slot_plan(model), model, device="cpu") as handle:
        hook = model.model.layers[2].register_forward_pre_hook(interrupt)
        with pytest.raises(KeyboardInterrupt):
            logits(model)
        hook.remove()
        assert handle.offloader.gate.owner is None
        done = []
        t = threading.Thread(target=lambda: done.append(torch.equal(logits(model), logits(ref))))
        t.start()
        t.join(10)
        assert done == [True]


def test_the_gate_keeps_the_models_forward_signature_and_remove_takes_it_off():
    import inspect

    model = make_llama(CFG)
    before = inspect.signature(model.forward)
    with runtime.apply(shared_slot_plan(model), model, device="cpu"):
        assert "forward" in model.__dict__
        assert inspect.signature(model.forward) == before
    assert "forward" not in model.__dict__


def test_apply_and_remove_inside_inference_mode_leave_ordinary_tensors():
    model, ref = make_llama(CFG, dtype=torch.float32), make_llama(CFG, dtype=torch.float32)
    with torch.inference_mode():
        handle = runtime.apply(shared_slot_plan(model), model, device="cpu")
    assert torch.equal(logits(model), logits(ref))  # under no_grad: the slots are not inference tensors
    with torch.inference_mode():
        handle.remove()
    assert not any(p.is_inference() for p in model.parameters())
    model(IDS).sum().backward()  # the model trains again after remove
    assert all(p.grad is not None for p in model.parameters())


def test_a_parameter_shared_with_an_applied_model_is_refused_and_nothing_moves():
    a, b = make_llama(CFG), make_llama(CFG, seed=1)
    b.model.layers[3].mlp.up_proj.weight = a.model.layers[3].mlp.up_proj.weight
    want_a = logits(a)
    with runtime.apply(shared_slot_plan(a), a, device="cpu"):
        logits(a)
        before = snapshot(b)
        with pytest.raises(ApplyError, match="model.layers.3.mlp.up_proj.weight"):
            runtime.apply(shared_slot_plan(b), b, device="cpu")
        assert_same(b, before)
    assert torch.equal(logits(a), want_a)


def test_recording_routing_of_a_dense_model_is_refused():
    model = make_llama(CFG)
    before = snapshot(model)
    with pytest.raises(ApplyError, match="no layer of the plan holds an experts module"):
        runtime.apply(shared_slot_plan(model), model, device="cpu", record_routing=True)
    assert_same(model, before)


def test_an_expanded_param_is_named_and_refused_before_anything_moves():
    from runtime.errors import PlanMismatchError

    model = make_llama(CFG)
    w = model.model.layers[1].mlp.up_proj.weight
    model.model.layers[1].mlp.up_proj.weight = torch.nn.Parameter(w.detach()[:1].expand_as(w))
    before = snapshot(model)
    with pytest.raises(PlanMismatchError, match="model.layers.1.mlp.up_proj.weight': an expanded view"):
        runtime.apply(shared_slot_plan(model), model, device="cpu")
    assert_same(model, before)


def test_describe_names_what_it_was_given_instead_of_a_module():
    with pytest.raises(TypeError, match="got a NoneType"):
        runtime.describe(None)


def test_a_model_dropped_while_applied_gives_back_what_the_process_held():
    import gc

    import torch._dynamo.config as dynamo_config

    from runtime import capture, guard

    held = (guard._hook_guard_holds, capture._held, dynamo_config.skip_nnmodule_hook_guards)
    model = make_llama(CFG)
    runtime.apply(shared_slot_plan(model), model, device="cpu")
    assert guard._hook_guard_holds == held[0] + 1 and capture._held == held[1] + 1
    del model
    gc.collect()
    assert (guard._hook_guard_holds, capture._held, dynamo_config.skip_nnmodule_hook_guards) == held
    # and one removed by hand gives them back once
    model = make_llama(CFG)
    runtime.apply(shared_slot_plan(model), model, device="cpu").remove()
    del model
    gc.collect()
    assert (guard._hook_guard_holds, capture._held) == held[:2]


def test_a_grad_forward_under_saved_tensor_hooks_is_refused_where_a_slot_is_shared():
    model, ref = make_llama(CFG, dtype=torch.float32), make_llama(CFG, dtype=torch.float32)
    with runtime.apply(shared_slot_plan(model), model, device="cpu"):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            with pytest.raises(ApplyError, match="saved_tensors_hooks"):
                model(IDS)
            assert torch.equal(logits(model), logits(ref))  # no grad: nothing is saved, nothing refused
        assert torch.equal(logits(model), logits(ref))


def test_remove_keeps_a_forward_the_user_set_while_applied():
    model, ref = make_llama(CFG), make_llama(CFG)
    handle = runtime.apply(shared_slot_plan(model), model, device="cpu")
    gated = model.forward

    def mine(*args, **kwargs):
        return gated(*args, **kwargs)

    model.forward = mine
    handle.remove()
    assert model.__dict__["forward"] is mine
    assert torch.equal(logits(model), logits(ref))  # the gate inside it just calls through now


def test_a_layer_called_alone_before_the_first_forward_does_not_make_it_warn(caplog):
    model, ref = make_llama(CFG), make_llama(CFG)
    x = torch.randn(1, 3, CFG.dim, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(7))
    with runtime.apply(shared_slot_plan(model), model, device="cpu"):
        with torch.no_grad():
            assert torch.equal(model.model.layers[3].mlp(x), ref.model.layers[3].mlp(x))
            model.model.layers[3](x)
        with caplog.at_level("WARNING", logger="runtime"):
            assert torch.equal(logits(model), logits(ref))
        assert "did not run in the plan's order" not in caplog.text


def test_base_model_forwards_keep_their_statistics_and_the_order_check_stays_bounded(caplog):
    """A forward of the base model alone ends as a forward does (its copies joined, its statistics kept; dropped
    after an error), and the layer order it records is let go at its end: the check waits for a whole forward
    (no warning for the head the base model never runs), and nothing grows call after call."""
    model, ref = make_llama(CFG), make_llama(CFG)
    with torch.no_grad():
        want = ref.model(IDS)
    with runtime.apply(shared_slot_plan(model), model, device="cpu", stats=True) as handle, torch.no_grad():
        off = handle.offloader
        for _ in range(20):
            assert torch.equal(model.model(IDS), want)
        assert len(off.history) == 20 and all(f.bytes > 0 for f in off.history)
        assert off._order == []  # let go at each base forward's end
        one = off.history[-1].bytes

        def fail(_module, _args):
            raise RuntimeError("boom")

        hook = model.model.layers[3].register_forward_pre_hook(fail)
        with pytest.raises(RuntimeError, match="boom"):
            model.model(IDS)
        hook.remove()
        assert len(off.history) == 20 and off.current.bytes == 0  # the failed forward's partial statistics dropped
        with caplog.at_level("WARNING"):
            assert torch.equal(logits(model), logits(ref))
        assert "did not run in the plan's order" not in caplog.text
        assert one <= off.history[-1].bytes < 2 * one  # a whole forward's own, not the base forwards' added up
        assert not off.gate._lock.locked()


def test_remove_while_another_threads_forward_runs_is_refused_and_works_after():
    model, ref = make_llama(CFG), make_llama(CFG)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    want = logits(ref)
    inside, go_on, seen = threading.Event(), threading.Event(), {}

    def hold(_module, _args):
        if threading.current_thread().name == "first":
            inside.set()
            go_on.wait(10)

    handle = runtime.apply(shared_slot_plan(model), model, device="cpu")
    hook = model.model.layers[2].register_forward_pre_hook(hold)
    t = threading.Thread(target=lambda: seen.setdefault("first", torch.equal(logits(model), want)), name="first")
    t.start()
    assert inside.wait(10)
    with pytest.raises(ConcurrentForwardError, match="remove\\(\\) while a forward"):
        handle.remove()
    go_on.set()
    t.join(10)
    hook.remove()
    assert seen == {"first": True} and handle.active
    assert torch.equal(logits(model), want)
    handle.remove()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # bit-identical


def test_a_submodule_called_alone_meets_a_whole_forward_of_another_thread_and_both_are_right():
    """Thread B calls layer 3's mlp on its own and is held before its down projection (after the check of its gate
    projection) while thread A runs a whole forward, which refills the shared slot with layer 1: B's down
    projection takes the gate and copies layer 3 back inside it, so both are right."""
    model, ref = make_llama(CFG), make_llama(CFG)
    x = torch.randn(2, 5, CFG.dim, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with torch.no_grad():
        want, want_b = ref(IDS), ref.model.layers[3].mlp(x)
    inside, go_on, seen = threading.Event(), threading.Event(), {}

    def hold(_module, _args):
        if threading.current_thread().name == "B":
            inside.set()
            go_on.wait(10)

    with runtime.apply(shared_slot_plan(model), model, device="cpu"), torch.no_grad():
        logits(model)
        hook = model.model.layers[3].mlp.down_proj.register_forward_pre_hook(hold)

        def b():
            with torch.no_grad():
                seen["b"] = torch.equal(model.model.layers[3].mlp(x), want_b)

        t = threading.Thread(target=b, name="B")
        t.start()
        assert inside.wait(10)
        assert torch.equal(logits(model), want)  # A: its forward refills the slot with layer 1, then layer 3
        go_on.set()
        t.join(10)
        hook.remove()
        assert seen == {"b": True}
