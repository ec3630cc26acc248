"""The prefetch schedule: each offloaded layer's slot and the layer before which its copy starts.

This is the trigger rule of docs/DESIGN.md, the contract between planner and runtime: the
planner writes it into the plan and the plan check recomputes it. Positions are unrolled over
forwards: forward ``f`` runs layer ``p`` at ``f * L + p``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Trigger:
    slot: int
    trigger: int  # unrolled position, in (position - L, position]; negative = previous forward
    desired: int  # where the copy would start if the slot were free (less overlap when trigger > desired)

    def copy_before(self, num_layers: int) -> int:
        return self.trigger % num_layers

    @property
    def previous_forward(self) -> bool:
        return self.trigger < 0


def num_slots(num_offloaded: int, step: int) -> int:
    return min(num_offloaded, step + 1)


def schedule(positions: Sequence[int], num_layers: int, step: int) -> list[Trigger]:
    """Triggers for offloaded layers at sorted ``positions`` among ``num_layers`` layers, step ``step``.

    Offloaded layer ``j`` uses slot ``j % k``; its copy starts ``step`` offloaded layers ahead, but
    not before the previous user of its slot (walking back cyclically, into the previous forward)
    has run, and not more than one forward ahead.
    """
    n = len(positions)
    if n == 0:
        return []
    if step < 1:
        raise ValueError("prefetch step must be >= 1")
    k = num_slots(n, step)

    def pos(m: int) -> int:  # unrolled position of offloaded index m (negative = earlier forwards)
        return positions[m % n] + num_layers * (m // n)

    out = []
    for j in range(n):
        earliest = positions[j] - num_layers + 1
        desired = max(pos(j - step), earliest) if step < n else earliest
        slot = j % k
        # the previous user of the slot: k back, or for the first k the slot's last user of the previous forward
        previous = j - k if j >= k else slot + k * ((n - 1 - slot) // k) - n
        out.append(Trigger(slot, max(desired, pos(previous) + 1), desired))
    return out
