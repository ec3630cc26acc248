"""runtime/host_guard.py: a split layer's host experts go through UVA while the host keeps the GPU waiting longer than
their UVA reads would take, and come back when it keeps up. The marks (CUDA events on a GPU) are scripted here
(``ScriptedMarks``, which tests/test_cpu_experts.py also uses for the guard inside the cpu backend)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from runtime.host_guard import HOLD, MARGIN, MAX_HOLD, SAMPLE, STRIKES, HostGuard  # noqa: E402


class ScriptedMarks:
    """Marks whose measured call took ``gpu_ms`` on the GPU parts and waited ``wait_ms`` for the host."""

    def __init__(self, gpu_ms: float = 10.0, wait_ms: float = 0.0, ready: bool = True) -> None:
        self.gpu_ms, self.wait_ms, self.is_ready = gpu_ms, wait_ms, ready
        self.recorded: list[str] = []

    def record(self, name, stream) -> None:
        self.recorded.append(name)

    def ready(self) -> bool:
        return self.is_ready

    def ms(self, first, second) -> float:
        return {("s", "a"): self.gpu_ms, ("a", "b"): self.wait_ms}[(first, second)]


def call(guard: HostGuard) -> bool:
    """One call of the layer as SplitForward makes it: the turn, then the marks around the parts and the wait."""
    on_host = guard.host_turn()
    if on_host:
        guard.before_parts(None)
        guard.after_parts(None)
        guard.after_wait(None)
    return on_host


def test_a_host_on_time_is_never_rerouted_and_is_sampled():
    marks = ScriptedMarks(gpu_ms=10.0, wait_ms=2.0)  # 50 host / 78 link experts: UVA would take 6.4 ms more
    guard = HostGuard("layers.0", 50, 78, marks)
    assert all(call(guard) for _ in range(100))
    assert guard.rerouted == 0 and guard.reroutes == 0
    assert marks.recorded.count("s") == 100 // SAMPLE  # one call in SAMPLE measured, three marks each
    assert len(marks.recorded) == 3 * (100 // SAMPLE)


def test_the_threshold():
    guard = HostGuard("layers.0", 50, 100, ScriptedMarks())
    assert not guard.late(10.0, 5.0 * (1 + MARGIN))
    assert guard.late(10.0, 5.0 * (1 + MARGIN) + 1e-6)


def test_a_late_host_is_rerouted_then_tried_again_with_a_growing_hold(caplog):
    marks = ScriptedMarks(gpu_ms=10.0, wait_ms=20.0)  # late: UVA would take 6.4 ms, the host made it wait 20
    guard = HostGuard("layers.3", 50, 78, marks)
    with caplog.at_level(logging.INFO, logger="runtime"):
        routes = [call(guard) for _ in range(600)]
    # the first call measured, the next sampled at SAMPLE, then every call once suspicious: STRIKES late calls
    first = routes.index(False)
    assert all(routes[:first]) and routes[first:first + HOLD] == [False] * HOLD
    holds, run = [], 0
    for r in routes[first:]:
        if not r:
            run += 1
        elif run:
            holds.append(run)
            run = 0
    assert holds[:4] == [HOLD, 2 * HOLD, 4 * HOLD, 8 * HOLD][:len(holds[:4])]
    assert guard.reroutes >= 4 and guard.rerouted == routes.count(False)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "layers.3" in warnings[0].getMessage()  # once; later reroutes at INFO
    # between holds the host is tried STRIKES calls: each measured
    assert routes[first + HOLD:first + HOLD + STRIKES] == [True] * STRIKES


def test_the_hold_stops_growing_and_a_call_on_time_resets_it():
    marks = ScriptedMarks(gpu_ms=10.0, wait_ms=20.0)
    guard = HostGuard("layers.0", 50, 78, marks)
    for _ in range(20000):
        call(guard)
    assert guard.next_hold == MAX_HOLD
    while guard.hold:  # let the hold run out
        call(guard)
    marks.wait_ms = 0.0
    call(guard)  # measured
    call(guard)  # judged on time
    assert guard.next_hold == HOLD and guard.strikes == 0


def test_marks_the_stream_has_not_passed_are_neither_read_nor_overwritten():
    marks = ScriptedMarks(gpu_ms=10.0, wait_ms=20.0, ready=False)
    guard = HostGuard("layers.0", 50, 78, marks)
    assert all(call(guard) for _ in range(50))  # never judged: never rerouted
    assert marks.recorded == ["s", "a", "b"]  # one measured call, its events kept until read
    marks.is_ready = True
    call(guard)
    assert guard.strikes == 1
