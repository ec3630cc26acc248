"""The prefetch schedule: each offloaded layer's slot and the layer before which its copy starts.

This is the rule of docs/DESIGN.md ("Prefetch schedule"), the contract between planner and
runtime: the planner writes it into the plan and the plan check recomputes it. As vLLM's
``--offload-prefetch-step S``: ``S`` buffer slots, and the copy of an offloaded layer is issued
as soon as the previous user of its slot has finished. Positions are unrolled over forwards:
forward ``f`` runs layer ``p`` at ``f * L + p``.

A *spanning* layer (``span``) has no slot of its own: its buffers lie over the bytes of every slot
(the pool is then one arena, schemas/buffer_pool.py), so it conflicts with every other prefetched
layer. Its copy waits for the layer before it to finish, and the layers after it wait for it, the
same rule with "its slot" read as "any bytes it shares". This lets a layer no other layer is like
(an LM head) be prefetched without a buffer of its own.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

DEFAULT_PREFETCH_STEP = 2  # two slots: double buffering


@dataclass(frozen=True)
class Trigger:
    slot: int | None  # None: a spanning layer (its buffers lie over every slot's bytes)
    trigger: int  # unrolled position just after the slot's previous user, in (position - L, position]; negative = previous forward

    def copy_before(self, num_layers: int) -> int:
        return self.trigger % num_layers

    @property
    def previous_forward(self) -> bool:
        return self.trigger < 0

    @property
    def span(self) -> bool:
        return self.slot is None


def filled_once(triggers: Sequence[Trigger]) -> list[bool]:
    """Per offloaded layer: whether it is its slot's only user with no layer spanning the slots, so that its
    bytes, once copied, are never overwritten and need no copy again (vLLM's prefetch runtime skips the
    refill of such a slot; a plan says which layers it treats so: ``Prefetch.once``)."""
    if any(t.span for t in triggers):
        return [False] * len(triggers)
    users: dict[int | None, int] = {}
    for t in triggers:
        users[t.slot] = users.get(t.slot, 0) + 1
    return [users[t.slot] == 1 for t in triggers]


def num_slots(num_offloaded: int, step: int) -> int:
    """Slot ids for ``num_offloaded`` layers (spanning layers not counted) at prefetch step ``step``:
    the step is the number of slots."""
    return min(num_offloaded, step)


def schedule(positions: Sequence[int], num_layers: int, step: int, span: Collection[int] = ()) -> list[Trigger]:
    """Triggers for offloaded layers at sorted ``positions`` among ``num_layers`` layers, step ``step``;
    ``span``: the positions (among ``positions``) of spanning layers.

    The other layers take slots in turn: the ``i``-th uses slot ``i % k`` (``k = min(their number,
    step)``). A layer's copy is issued just before the layer that follows the previous user of its
    bytes runs: for a slotted layer the later of its slot's previous user (``k`` slotted layers back,
    or for the first ``k`` the slot's last user of the previous forward, walking back cyclically) and
    the last spanning layer before it; for a spanning layer the offloaded layer just before it. That is
    never more than one forward ahead: the previous user is at most one forward back.
    """
    slot_of, triggers = _unrolled(positions, num_layers, step, span)
    return [Trigger(slot_of.get(j), t) for j, t in enumerate(triggers)]


def unrolled_triggers(positions: Sequence[int], num_layers: int, step: int, span: Collection[int] = ()) -> list[int]:
    """``schedule``'s ``Trigger.trigger`` of each layer alone: what a simulated forward needs (no objects made).
    Without spanning layers the rule is two slices: the ``i``-th layer's copy follows the ``(i - k)``-th, and each of
    the first ``k`` follows the last user of its slot one forward back."""
    m = len(positions)
    if m == 0 or step < 1 or any(p in span for p in positions):
        return _unrolled(positions, num_layers, step, span)[1]
    k = num_slots(m, step)
    last = [positions[i + k * ((m - 1 - i) // k)] - num_layers + 1 for i in range(k)]
    return last + [p + 1 for p in positions[:m - k]]


def _unrolled(positions: Sequence[int], num_layers: int, step: int,
              span: Collection[int]) -> tuple[dict[int, int], list[int]]:
    """(index into ``positions`` -> slot, for the slotted layers; each layer's unrolled trigger): ``schedule``."""
    n = len(positions)
    if n == 0:
        return {}, []
    if step < 1:
        raise ValueError("prefetch step must be >= 1")
    spanning = [p in span for p in positions] if span else [False] * n
    slotted = [j for j in range(n) if not spanning[j]]
    k = num_slots(len(slotted), step)
    m = len(slotted)
    slot_of: dict[int, int] = {}
    previous: list[int] = [0] * n  # index (into positions) of the previous user; negative = previous forward
    for i, j in enumerate(slotted):
        slot_of[j] = i % k
        # k slotted layers back, or for the first k the slot's last slotted user of the previous forward
        back = i - k if i >= k else (i % k) + k * ((m - 1 - i % k) // k) - m
        previous[j] = slotted[back] if back >= 0 else slotted[back + m] - n
    if m < n:
        latest_span = max(j for j in range(n) if spanning[j]) - n  # the last spanning layer seen, unrolled
        for j in range(n):
            if spanning[j]:
                previous[j] = j - 1  # every layer shares its bytes: the one just before (-1: previous forward)
                latest_span = j
            else:
                previous[j] = max(previous[j], latest_span)
    triggers = [positions[prev] + 1 if prev >= 0 else positions[prev % n] - num_layers + 1 for prev in previous]
    return slot_of, triggers
