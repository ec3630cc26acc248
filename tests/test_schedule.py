"""The prefetch schedule against the invariant the runtime relies on, by simulating unrolled forwards."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.schedule import num_slots, schedule, unrolled_triggers

FORWARDS = 3


def simulate(positions: list[int], num_layers: int, step: int, forwards: int = FORWARDS) -> None:
    """Run ``forwards`` forwards of the runtime's rule and assert the slot invariant.

    A slot holds at most one pending copy: a copy into it may only be issued once the previous copy's
    layer has run (so no layer using the slot runs between a copy's issue and its own layer), each
    layer finds its own data for this forward, and copies into a slot are issued in use order. And
    as early as that allows (vLLM's rule): a copy is issued right after the slot's previous user ran.
    """
    triggers = schedule(positions, num_layers, step)
    n, k = len(positions), num_slots(len(positions), step)
    assert len(triggers) == n
    events = []
    pending: dict[int, tuple[int, int] | None] = {s: None for s in range(k)}
    for j, (p, t) in enumerate(zip(positions, triggers)):
        assert t.slot == j % k
        assert p - num_layers < t.trigger <= p, "a copy is issued within one forward before its layer"
        assert t.copy_before(num_layers) == t.trigger % num_layers
        if t.previous_forward:  # primed at apply time
            assert pending[t.slot] is None, "two layers primed into one slot"
            pending[t.slot] = (j, 0)
        for f in range(forwards + 1):
            issue = t.trigger + f * num_layers
            if 0 <= issue < forwards * num_layers:
                events.append((issue, 0, j, f))
            if f < forwards:
                events.append((p + f * num_layers, 1, j, f))
    events.sort()  # at one position the hook issues copies before the layer runs
    last_use: dict[int, int] = {}
    last_run: dict[int, int] = {}  # slot -> position of the last layer that ran from it
    for q, kind, j, f in events:
        slot = triggers[j].slot
        use = positions[j] + f * num_layers
        if kind == 0:
            assert q <= use
            assert pending[slot] is None, f"slot {slot} overwritten at {q} while {pending[slot]} has not run"
            assert use > last_use.get(slot, -1), "copies into a slot out of use order"
            if slot in last_run:
                assert q == last_run[slot] + 1, f"slot {slot} free after {last_run[slot]}, copy issued at {q}"
            last_use[slot] = use
            pending[slot] = (j, f)
        else:
            assert pending[slot] == (j, f), f"layer {j} forward {f} finds {pending[slot]} in slot {slot}"
            pending[slot] = None
            last_run[slot] = q


def _spread(num_layers: int, n: int) -> list[int]:
    """n of num_layers positions spread evenly, the last one included."""
    return [-(-(j + 1) * num_layers // n) - 1 for j in range(n)]


LAYOUTS = {
    "contiguous": lambda n: (list(range(n)), n),
    "resident before and after": lambda n: (list(range(1, n + 1)), n + 3),
    "interleaved": lambda n: (list(range(1, 2 * n, 2)), 2 * n + 1),
    "spread with gaps": lambda n: (_spread(n + n // 3 + 1, n), n + n // 3 + 1),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("step", range(1, 9))
def test_schedule_invariant_exhaustive(layout, step):
    for n in range(1, 201):
        positions, num_layers = LAYOUTS[layout](n)
        simulate(positions, num_layers, step)


def test_one_slot():
    """prefetch_step 1: one slot, each copy issued right after the previous offloaded layer ran."""
    # layers 0..5, offloaded at 1, 2, 4
    triggers = schedule([1, 2, 4], 6, 1)
    assert num_slots(3, 1) == 1
    # o_0 waits for o_2 of the previous forward (at 4 - 6): copy before layer 5 of that forward
    # o_1 follows o_0 directly: its copy is issued before itself (no overlap); o_2 after o_1, before layer 3
    assert [(t.slot, t.trigger) for t in triggers] == [(0, 4 - 6 + 1), (0, 2), (0, 3)]
    assert [t.copy_before(6) for t in triggers] == [5, 2, 3]
    assert [t.previous_forward for t in triggers] == [True, False, False]
    simulate([1, 2, 4], 6, 1)
    # every layer offloaded, one slot: each copy right before its own layer, the first at the forward's start
    assert [(t.slot, t.trigger) for t in schedule([0, 1, 2], 3, 1)] == [(0, 0), (0, 1), (0, 2)]
    one = schedule([0], 1, 1)
    assert (one[0].slot, one[0].trigger, one[0].previous_forward) == (0, 0, False)


def test_two_slots_three_layers_wrap_around():
    """N = 3 is not a multiple of 2 slots: slots 0, 1, 0, and o_0 waits for o_2 (slot 0) of the previous forward."""
    triggers = schedule([0, 1, 2], 3, 2)
    assert [t.slot for t in triggers] == [0, 1, 0]
    # o_0: slot 0's last user is o_2 at the very end of the previous forward, so the copy is issued before
    # layer 0 itself; o_1: slot 1's only user is o_1, free right after it ran in the previous forward
    # (before layer 2 there); o_2: right after o_0
    assert [t.trigger for t in triggers] == [0, 2 - 3, 1]
    assert [(t.copy_before(3), t.previous_forward) for t in triggers] == [(0, False), (2, True), (1, False)]
    simulate([0, 1, 2], 3, 2)
    # with resident layers around them: 5 layers, offloaded at 1, 2, 3
    triggers = schedule([1, 2, 3], 5, 2)
    assert [(t.slot, t.trigger) for t in triggers] == [(0, 3 - 5 + 1), (1, 2 - 5 + 1), (0, 2)]
    simulate([1, 2, 3], 5, 2)


def test_known_schedule():
    # layers 0..5, offloaded at 1, 2, 4; step 2 -> 2 slots: slot 0 for o_0, o_2 and slot 1 for o_1
    triggers = schedule([1, 2, 4], 6, 2)
    # o_0: slot 0's previous user is o_2 of the previous forward (4 - 6); o_1: itself, one forward back (2 - 6);
    # o_2: o_0 (at 1)
    assert [(t.slot, t.trigger) for t in triggers] == [(0, 4 - 6 + 1), (1, 2 - 6 + 1), (0, 2)]
    assert triggers[0].previous_forward and triggers[0].copy_before(6) == 5
    # as many slots as layers: each copy starts right after the same layer of the previous forward
    many = schedule([1, 2, 4], 6, 8)
    assert [(t.slot, t.trigger) for t in many] == [(0, 1 - 6 + 1), (1, 2 - 6 + 1), (2, 4 - 6 + 1)]
    assert schedule([], 4, 1) == []
    one = schedule([0], 1, 3)
    assert (one[0].slot, one[0].trigger, one[0].previous_forward) == (0, 0, False)
    with pytest.raises(ValueError, match=">= 1"):
        schedule([0], 1, 0)


def _naive(positions: list[int], num_layers: int, step: int) -> list:
    """The copy of o_j issued when o_{j-step} (cyclically) finishes, whatever else uses the slot."""
    from schemas import schedule as mod

    n = len(positions)
    k = num_slots(n, step)
    return [mod.Trigger(j % k, positions[(j - k) % n] - (num_layers if j < k else 0) + 1) for j in range(n)]


def test_naive_target_would_break():
    """The naive target (o_{j-step} cyclically) races when N is not a multiple of the slots: ours does not."""
    triggers = schedule(list(range(5)), 5, 2)
    assert [t.slot for t in triggers] == [0, 1, 0, 1, 0]
    # o_0 (slot 0) must wait for o_4 (slot 0) of the previous forward, the last layer: not o_3
    assert triggers[0].trigger == 0 and _naive(list(range(5)), 5, 2)[0].trigger == 3 - 5 + 1
    simulate(list(range(5)), 5, 2)


def test_simulator_catches_a_race():
    import unittest.mock

    with unittest.mock.patch(f"{__name__}.schedule", _naive):
        simulate(list(range(6)), 6, 2)  # 6 layers in 2 slots: the naive rule is right
        with pytest.raises(AssertionError, match="overwritten"):
            simulate(list(range(5)), 5, 2)


def test_simulator_catches_a_late_copy():
    """A copy issued later than right after the slot's previous user is safe but not the rule."""
    import unittest.mock

    late = [t if t.trigger < 0 else type(t)(t.slot, t.trigger + 1) for t in schedule([0, 2, 4, 6], 8, 2)]
    with unittest.mock.patch(f"{__name__}.schedule", lambda *a: late):
        with pytest.raises(AssertionError, match="copy issued at"):
            simulate([0, 2, 4, 6], 8, 2)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1)))),
       st.integers(1, 6), st.booleans())
def test_unrolled_triggers_are_the_schedules(layout, step, spanning):
    """The triggers a simulated forward reads (two slices without spanning layers) are ``schedule``'s."""
    num_layers, chosen = layout
    positions = sorted(chosen)
    span = set(positions[-1:]) if spanning else ()
    want = [t.trigger for t in schedule(positions, num_layers, step, span)]
    assert unrolled_triggers(positions, num_layers, step, span) == want
