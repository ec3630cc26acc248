"""``build_pool`` (schemas/buffer_pool.py) is the slot rule itself: the i-th slotted layer takes slot i % k, a key has
a buffer in each slot one of its layers takes, and a spanning layer adds one buffer per key of its own; layers that
share a signature object are grouped by identity, which changes nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.buffer_pool import PoolKey, build_pool

KEYS = [PoolKey(f"p{i}", (4, i + 1), "bfloat16", None) for i in range(5)]
SIGS = [tuple((KEYS[i], 8 * (i + 1)) for i in chosen) for chosen in ([0], [0, 1], [1, 2, 3], [4], [0, 4])]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(SIGS) - 1), st.booleans(), st.booleans()), max_size=30),
       st.integers(1, 5), st.booleans())
def test_the_pool_is_the_slot_rule(layers, step, every_slot):
    # each layer: its signature (shared objects, or an equal copy), spanning or not
    signatures = [SIGS[s] if shared else tuple(list(SIGS[s])) for s, shared, _ in layers]
    span = [spans for _, _, spans in layers]
    slotted = [sig for sig, spans in zip(signatures, span) if not spans]
    k = step if every_slot else max(1, min(len(slotted), step))
    want: dict[PoolKey, tuple[int, set[int], bool]] = {}
    for i, sig in enumerate(slotted):
        for key, nbytes in sig:
            want.setdefault(key, (nbytes, set(), False))[1].add(i % k)
    for sig in (sig for sig, spans in zip(signatures, span) if spans):
        for key, nbytes in sig:
            nb, slots, _ = want.get(key, (nbytes, set(), True))
            want[key] = (nb, slots, True)
    entries = build_pool(signatures, k, span, every_slot)
    assert [e.key for e in entries] == sorted(want, key=PoolKey.sort_key)
    for e in entries:
        nbytes, slots, spans = want[e.key]
        assert (e.nbytes, e.span) == (nbytes, spans)
        assert e.slots == (tuple(range(k)) if every_slot else tuple(sorted(slots)))
