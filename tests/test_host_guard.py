"""runtime/host_guard.py: a split layer's host computes as many of its host-memory experts as it can finish while the
GPU reads the others (fewer than the plan gave it when slower than planned, more when faster, every one but one at
most); a host too slow for even one expert
sends them all through UVA for a while. The marks (CUDA events on a GPU) are scripted here (``ScriptedMarks``, which
tests/test_cpu_experts.py also uses for the guard inside the cpu backend), and so is the host's own time."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from runtime.host_guard import DEADBAND, HOLD, MAX_HOLD, SAMPLE, HostGuard, balanced  # noqa: E402


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


class Machine:
    """A layer's two sides at fixed rates: the GPU reads an expert through UVA in ``link_ms``, the host computes
    one in ``host_ms`` (plus ``handoff_ms`` a call); the stream waits for whatever the host takes longer."""

    def __init__(self, link_ms: float, host_ms: float, handoff_ms: float = 0.0) -> None:
        self.link_ms, self.host_ms, self.handoff_ms = link_ms, host_ms, handoff_ms

    def step_ms(self, guard: HostGuard, level: int) -> float:
        gpu = self.link_ms * (guard.link + guard.host - level)
        return max(gpu, self.handoff_ms + self.host_ms * level) if level else gpu

    def call(self, guard: HostGuard) -> int:
        """One call of the layer as SplitForward makes it: the turn, the marks around the parts and the wait, and
        the host's own time when measured."""
        level = guard.host_turn()
        if level:
            gpu = self.link_ms * (guard.link + guard.host - level)
            host = self.handoff_ms + self.host_ms * level
            guard.marks.gpu_ms, guard.marks.wait_ms = gpu, max(0.0, host - gpu)
            measured = guard.measuring
            guard.before_parts(None)
            guard.after_parts(None)
            if measured:
                guard.host_done(host - self.handoff_ms)  # the thread's own figure leaves the hand-off out
            guard.after_wait(None)
        return level


def guard_of(host: int = 50, link: int = 78, **marks) -> HostGuard:
    return HostGuard("layers.3", host, link, ScriptedMarks(**marks))


def test_balanced_is_where_both_sides_take_as_long():
    # 50 host experts at 0.5 ms, 78 link experts + moved ones at 0.128 ms
    target = balanced(50, 78, 50, gpu_ms=0.128 * 78, host_ms=0.5 * 50)
    assert target * 0.5 == pytest.approx((128 - target) * 0.128)
    # measured at another level with the same rates: the same answer
    assert balanced(50, 78, 20, gpu_ms=0.128 * 108, host_ms=0.5 * 20) == pytest.approx(target)
    # a call already balanced stays where it is
    assert balanced(50, 78, 40, gpu_ms=0.1 * 88, host_ms=0.1 * 88) == pytest.approx(40)


def test_a_host_on_time_keeps_the_plan_and_is_sampled():
    guard = guard_of()
    machine = Machine(link_ms=0.128, host_ms=0.128 * 78 / 50)  # both sides 9.98 ms at the plan's split: on time
    assert all(machine.call(guard) == 50 for _ in range(100))
    assert guard.moves == 0 and guard.moved_calls == 0
    assert guard.marks.recorded.count("s") == 100 // SAMPLE  # one call in SAMPLE measured, three marks each
    assert len(guard.marks.recorded) == 3 * (100 // SAMPLE)
    summary = guard.summary()
    assert {k: summary[k] for k in ("planned", "now", "moved_calls", "all_uva_calls", "more_calls")} == \
        {"planned": 50, "now": 50, "moved_calls": 0, "all_uva_calls": 0, "more_calls": 0}
    assert summary["gpu_ms"] == pytest.approx(0.128 * 78, abs=1e-3)  # the last judged call, as the guard saw it
    assert summary["host_ms"] == pytest.approx(0.128 * 78, abs=1e-3) and summary["handoff_ms"] == 0.0


@pytest.mark.parametrize("host_ms", [0.03, 0.1, 0.15, 0.25, 0.5, 1.0])
def test_the_level_moves_until_both_sides_finish_together(caplog, host_ms):
    """A host slower than the plan's profile (0.25-1.0 ms an expert) hands experts to the link; one faster (0.03-0.15)
    takes experts from it, up to every one but one; either way the step settles within the deadband of the best."""
    guard = guard_of()
    machine = Machine(link_ms=0.128, host_ms=host_ms, handoff_ms=0.3)
    with caplog.at_level(logging.INFO, logger="runtime"):
        levels = [machine.call(guard) for _ in range(300)]
    planned, settled = machine.step_ms(guard, 50), machine.step_ms(guard, levels[-1])
    best = min(machine.step_ms(guard, k) for k in range(guard.top + 1))
    assert settled < planned and settled < machine.step_ms(guard, 0)
    assert settled <= best * (1 + 2 * DEADBAND)
    assert len(set(levels[-50:])) == 1  # settled: no more moves
    assert guard.summary()["now"] == levels[-1] and guard.top == 127
    assert guard.moved_calls == sum(k < 50 for k in levels) and guard.more_calls == sum(k > 50 for k in levels)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    if host_ms > 0.2:
        assert levels[-1] < 50 and guard.more_calls == 0
        assert len(warnings) == 1 and "layers.3" in warnings[0].getMessage()  # once; later moves at INFO
        assert guard.summary()["handoff_ms"] == pytest.approx(0.3, abs=1e-3)  # the stream waited: its view of it
    else:
        assert 50 < levels[-1] <= guard.top and guard.moved_calls == 0
        assert not warnings  # a faster host is no warning


def test_a_host_that_recovers_takes_its_experts_back_and_more_but_leaves_the_link_one():
    guard = guard_of()
    machine = Machine(link_ms=0.128, host_ms=0.6)
    for _ in range(100):
        machine.call(guard)
    assert guard.level < 30
    machine.host_ms = 0.001
    levels = [machine.call(guard) for _ in range(200)]
    assert levels[-1] == max(levels) == guard.top == 127


def test_a_host_that_first_takes_more_warns_once_when_it_falls_below_the_plan(caplog):
    """The warning names the first fall below the plan's split, whatever moves came before it."""
    guard = guard_of()
    machine = Machine(link_ms=0.128, host_ms=0.1)
    with caplog.at_level(logging.INFO, logger="runtime"):
        for _ in range(100):
            machine.call(guard)
        assert guard.level > 50 and not [r for r in caplog.records if r.levelno == logging.WARNING]
        machine.host_ms = 0.6
        for _ in range(200):
            machine.call(guard)
    assert guard.level < 50
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "slower" in warnings[0].getMessage()
    assert any("faster" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)  # the moves up


def test_a_host_slower_than_the_link_for_one_expert_is_bypassed_with_a_growing_hold():
    guard = guard_of()
    machine = Machine(link_ms=0.128, host_ms=200.0)  # one expert on the host outlasts the whole layer on the link
    levels = [machine.call(guard) for _ in range(3000)]
    first = levels.index(0)
    holds, run = [], 0
    for k in levels[first:]:
        if k == 0:
            run += 1
        elif run:
            holds.append(run)
            run = 0
    assert holds[:4] == [HOLD, 2 * HOLD, 4 * HOLD, 8 * HOLD]
    assert all(k in (0, 1) for k in levels[first:])  # between holds the host is tried with one expert
    assert guard.all_uva_calls == levels.count(0) and guard.summary()["all_uva_calls"] == guard.all_uva_calls
    for _ in range(20000):
        machine.call(guard)
    assert guard.next_hold == MAX_HOLD
    while guard.hold:  # let the hold run out
        machine.call(guard)
    machine.host_ms = 0.01
    for _ in range(3):  # one call not measured, one measured at one expert, then judged: fast again
        machine.call(guard)
    assert guard.next_hold == HOLD and guard.level == 1
    for _ in range(4):  # a second call asking for more experts: the host takes them
        machine.call(guard)
    assert guard.level > 1


def test_small_differences_do_not_move_the_level():
    guard = guard_of()
    # the host 4% slower than the link at the plan's level: inside the deadband
    machine = Machine(link_ms=0.1, host_ms=0.1 * 78 / 50 * (1 + DEADBAND * 0.8))
    assert all(machine.call(guard) == 50 for _ in range(100))


def measured_call(guard: HostGuard, host_ms: float | None) -> None:
    """Calls until one is measured; its host part reports ``host_ms`` (None: it failed)."""
    while True:
        guard.host_turn()
        measured = guard.measuring
        guard.before_parts(None), guard.after_parts(None)
        if measured and host_ms is not None:
            guard.host_done(host_ms)
        guard.after_wait(None)
        if measured:
            return


def test_marks_the_stream_has_not_passed_are_neither_read_nor_overwritten():
    guard = guard_of(gpu_ms=10.0, wait_ms=50.0, ready=False)
    measured_call(guard, 60.0)
    for _ in range(50):
        assert guard.host_turn() == 50  # never judged: never moved
        guard.before_parts(None), guard.after_parts(None), guard.after_wait(None)
    assert guard.marks.recorded == ["s", "a", "b"]  # one measured call, its events kept until read
    guard.marks.is_ready = True
    guard.host_turn()
    assert guard.vote is not None and guard.vote < 50  # judged: late (a second late call would move the level)


def test_a_measured_call_whose_host_part_failed_is_not_judged():
    guard = guard_of(gpu_ms=10.0, wait_ms=50.0)
    measured_call(guard, None)  # no host_done: the part failed
    assert guard.host_turn() == 50 and guard.vote is None and guard.moves == 0


def test_one_slow_call_moves_nothing():
    guard = guard_of(gpu_ms=10.0, wait_ms=50.0)
    measured_call(guard, 60.0)  # late once
    guard.marks.wait_ms = 0.0
    for _ in range(40):
        measured_call(guard, 10.0)  # then on time (both sides 10 ms)
    assert guard.moves == 0 and guard.level == 50


def test_a_host_slower_than_the_link_reading_every_expert_is_bypassed():
    """A decode at batch 1: the host's part is mostly its fixed cost (the hand-off), so it takes longer than the GPU
    would to read every host-memory expert, though the level where both sides balance is still many experts. Its
    experts all go through UVA after two measured calls (not halfway at a time), and the layer's time is then the
    link's for all of them, less than at any level the host keeps."""
    guard = guard_of()
    machine = Machine(link_ms=0.017, host_ms=0.03, handoff_ms=3.0)  # the GPU reads all 128 in 2.2 ms
    at_plan = machine.step_ms(guard, 50)
    assert balanced(50, 78, 50, gpu_ms=0.017 * 78, host_ms=3.0 + 0.03 * 50) > 10  # balance alone moves slowly
    levels = [machine.call(guard) for _ in range(12)]
    assert levels[-1] == 0 and guard.hold > 0
    assert machine.step_ms(guard, 0) < min(at_plan, min(machine.step_ms(guard, k) for k in range(1, 128)))
    while guard.hold:
        machine.call(guard)
    tried = []
    while not guard.hold and len(tried) < 12:  # tried again with one expert: still slower than the link for all
        tried.append(machine.call(guard))
    assert set(tried[:-1]) == {1} and tried[-1] == 0  # held again, longer (the call that judged is the hold's first)
    assert guard.hold == 2 * HOLD - 1 and guard.next_hold == 4 * HOLD


def test_a_host_whose_part_fits_beside_the_link_is_not_bypassed():
    """The same rule leaves a host alone when its part, hand-off included, is shorter than the GPU's read of every
    host-memory expert: the balanced level, as before."""
    guard = guard_of()
    machine = Machine(link_ms=0.128, host_ms=0.3, handoff_ms=0.5)  # at 50: host 15.5 ms, all 128 on the link 16.4
    for _ in range(200):
        machine.call(guard)
    assert guard.hold == 0 and 20 < guard.level < 50
