"""The eager hot path and captures, on the CPU: eager hooks call the offloader directly (the custom ops are
for torch.compile only), stats cost nothing when off, and a CUDA graph capture that ends before the forward
does joins the copies issued in it (runtime/capture.py). The GPU side is in tests/test_generate_gpu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import runtime  # noqa: E402
from runtime import capture  # noqa: E402
from runtime import prefetch_ops as ops  # noqa: E402
from test_runtime_cpu import IDS, assert_restored, group_plan, model, snapshot, spec  # noqa: E402,F401 (fixtures)


def test_eager_hooks_do_not_go_through_the_custom_ops(model, spec, monkeypatch):
    with torch.no_grad():
        want = model(IDS)
    plan = group_plan(spec, 1, 1, 2)
    with runtime.apply(plan, model, "cpu") as handle:
        monkeypatch.setattr(ops, "_OFFLOADERS", {})  # any call through an op would now fail (KeyError)
        with torch.no_grad():
            got = model(IDS)
        assert torch.equal(got, want)
        assert handle.offloader.issued == set() and handle.offloader.captured == set()


def test_stats_off_allocates_no_history(model, spec):
    with runtime.apply(group_plan(spec, 1, 1, 2), model, "cpu") as handle:
        with torch.no_grad():
            for _ in range(3):
                model(IDS)
        assert handle.offloader.history == [] and handle.offloader.current.bytes == 0
        assert handle.stats()["forwards"] == []


def test_stats_on_still_counts_every_forward(model, spec):
    with runtime.apply(group_plan(spec, 1, 1, 2), model, "cpu", stats=True) as handle:
        with torch.no_grad():
            for _ in range(3):
                model(IDS)
        forwards = handle.stats()["forwards"]
        assert len(forwards) == 3
        assert all(f["bytes_copied"] == forwards[0]["bytes_copied"] > 0 for f in forwards)


class _FakeOffloader:
    def __init__(self) -> None:
        self.joined = 0

    def join_capture(self) -> None:
        self.joined += 1


def test_capture_end_joins_pending_offloaders_then_ends(monkeypatch):
    original = torch.cuda.CUDAGraph.capture_end
    ended = []
    capture.hold()
    try:
        assert torch.cuda.CUDAGraph.capture_end is capture._capture_end
        monkeypatch.setattr(capture, "_original", lambda graph: ended.append(graph))
        a, b = _FakeOffloader(), _FakeOffloader()
        capture.captured_copies(a)
        capture.captured_copies(b)
        capture.captured_copies(a)
        graph = object()
        torch.cuda.CUDAGraph.capture_end(graph)
        assert (a.joined, b.joined) == (1, 1) and ended == [graph]
        torch.cuda.CUDAGraph.capture_end(graph)  # nothing pending: only the original runs
        assert (a.joined, b.joined) == (1, 1) and ended == [graph, graph]
        monkeypatch.undo()
    finally:
        capture.release()
    assert torch.cuda.CUDAGraph.capture_end is original


def test_capture_hook_is_held_while_any_plan_is_applied(model, spec):
    original = torch.cuda.CUDAGraph.capture_end
    snap = snapshot(model)
    h1 = runtime.apply(group_plan(spec, 1, 1, 2), model, "cpu")
    assert torch.cuda.CUDAGraph.capture_end is capture._capture_end
    import copy

    other = copy.deepcopy(spec)
    from models import make_llama
    from test_runtime_cpu import CFG

    second = make_llama(CFG, seed=1)
    h2 = runtime.apply(group_plan(other, 2, 1, 1), second, "cpu")
    h1.remove()
    assert torch.cuda.CUDAGraph.capture_end is capture._capture_end  # the second plan still needs it
    h2.remove()
    assert torch.cuda.CUDAGraph.capture_end is original
    assert_restored(model, snap)


def test_join_capture_marks_only_the_captured_copies_landed(model, spec):
    with runtime.apply(group_plan(spec, 1, 1, 2), model, "cpu") as handle:
        off = handle.offloader
        off.issued.update({0, 1, 2})
        off.captured.update({1, 2})
        off.join_capture()
        assert off.issued == {0} and off.captured == set()
        off.join_after_forward()
        assert off.issued == set()


def test_token_clock_median_skips_the_first_steps():
    from runtime.token_clock import TokenClock

    clock = TokenClock("cpu", skip=2)
    clock.marks = [0.0, 1.0, 2.0, 2.010, 2.020, 2.030]  # two slow steps (compile), then 10 ms each
    assert clock.intervals_ms()[:2] == [1000.0, 1000.0]
    assert abs(clock.ms_per_token() - 10.0) < 1e-6
    short = TokenClock("cpu", skip=8)
    short.marks = [0.0, 0.5]
    assert short.ms_per_token() == 500.0  # fewer steps than skip: all of them
    assert TokenClock("cpu").ms_per_token() is None


def test_a_failure_after_the_handle_exists_gives_back_the_capture_hook(model, spec, monkeypatch):
    import sys

    apply_module = sys.modules["runtime.apply"]  # (the package's ``apply`` is the function)
    original = torch.cuda.CUDAGraph.capture_end
    held = capture._held

    def fail(*_a, **_k):
        raise RuntimeError("injected failure while installing the guards")

    monkeypatch.setattr(apply_module, "install", fail)
    snap = snapshot(model)
    with pytest.raises(RuntimeError, match="injected"):
        runtime.apply(group_plan(spec, 2, 1, 1), model, device="cpu")
    assert_restored(model, snap)
    assert capture._held == held and torch.cuda.CUDAGraph.capture_end is original
    assert not apply_module._ACTIVE
