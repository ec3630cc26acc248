"""The prefetch schedule against the invariant the runtime relies on, by simulating unrolled forwards."""

import pytest

from planner.schedule import num_slots, schedule
from planner.select import spread

FORWARDS = 3


def simulate(positions: list[int], num_layers: int, step: int, forwards: int = FORWARDS) -> None:
    """Run ``forwards`` forwards of the runtime's rule and assert the slot invariant.

    A slot holds at most one pending copy: a copy into it may only be issued once the previous copy's
    layer has run (so no layer using the slot runs between a copy's issue and its own layer), each
    layer finds its own data for this forward, and copies into a slot are issued in use order.
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
    for q, kind, j, f in events:
        slot = triggers[j].slot
        use = positions[j] + f * num_layers
        if kind == 0:
            assert q <= use
            assert pending[slot] is None, f"slot {slot} overwritten at {q} while {pending[slot]} has not run"
            assert use > last_use.get(slot, -1), "copies into a slot out of use order"
            last_use[slot] = use
            pending[slot] = (j, f)
        else:
            assert pending[slot] == (j, f), f"layer {j} forward {f} finds {pending[slot]} in slot {slot}"
            pending[slot] = None


LAYOUTS = {
    "contiguous": lambda n: (list(range(n)), n),
    "resident before and after": lambda n: (list(range(1, n + 1)), n + 3),
    "interleaved": lambda n: (list(range(1, 2 * n, 2)), 2 * n + 1),
    "spread with gaps": lambda n: (spread(n + n // 3 + 1, n), n + n // 3 + 1),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("step", range(1, 9))
def test_schedule_invariant_exhaustive(layout, step):
    for n in range(1, 201):
        positions, num_layers = LAYOUTS[layout](n)
        simulate(positions, num_layers, step)


def test_naive_target_would_break():
    """The naive (i + step) % N slot target races when N is not a multiple of step+1: ours does not."""
    positions = list(range(5))
    triggers = schedule(positions, 5, 2)
    assert [t.slot for t in triggers] == [0, 1, 2, 0, 1]
    # o_0 (slot 0) must wait for o_3 (slot 0) of the previous forward: copy right after o_3
    assert triggers[0].trigger == 3 - 5 + 1 and triggers[0].desired == 3 - 5
    assert triggers[0].trigger > triggers[0].desired
    simulate(positions, 5, 2)


def test_known_schedule():
    # layers 0..5, offloaded at 1, 2, 4; step 1 -> 2 slots
    triggers = schedule([1, 2, 4], 6, 1)
    # o_0 wants to start at o_2 of the previous forward (-2) but o_2 uses its slot: right after it
    assert [(t.slot, t.trigger) for t in triggers] == [(0, 4 - 6 + 1), (1, 1), (0, 2)]
    assert triggers[0].previous_forward and triggers[0].copy_before(6) == 5
    assert schedule([], 4, 1) == []
    one = schedule([0], 1, 3)
    assert (one[0].slot, one[0].trigger, one[0].previous_forward) == (0, 0, False)


def test_simulator_catches_a_race():
    from planner import schedule as mod

    real = mod.schedule(list(range(5)), 5, 2)
    broken = [mod.Trigger(t.slot, t.desired, t.desired) for t in real]  # ignore the slot's previous user
    import unittest.mock

    with unittest.mock.patch(f"{__name__}.schedule", lambda *a: broken):
        with pytest.raises(AssertionError):
            simulate(list(range(5)), 5, 2)
