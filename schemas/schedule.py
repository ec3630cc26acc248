"""The prefetch schedule: each offloaded layer's slot and the layer before which its copy starts.

This is the rule of docs/DESIGN.md ("Prefetch schedule"), the contract between planner and
runtime: the planner writes it into the plan and the plan check recomputes it. As vLLM's
``--offload-prefetch-step S``: ``S`` buffer slots, and the copy of an offloaded layer is issued
as soon as the previous user of its slot has finished. Positions are unrolled over forwards:
forward ``f`` runs layer ``p`` at ``f * L + p``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_PREFETCH_STEP = 2  # two slots: double buffering


@dataclass(frozen=True)
class Trigger:
    slot: int
    trigger: int  # unrolled position just after the slot's previous user, in (position - L, position]; negative = previous forward

    def copy_before(self, num_layers: int) -> int:
        return self.trigger % num_layers

    @property
    def previous_forward(self) -> bool:
        return self.trigger < 0


def num_slots(num_offloaded: int, step: int) -> int:
    """Slot ids for ``num_offloaded`` layers at prefetch step ``step``: the step is the number of slots."""
    return min(num_offloaded, step)


def schedule(positions: Sequence[int], num_layers: int, step: int) -> list[Trigger]:
    """Triggers for offloaded layers at sorted ``positions`` among ``num_layers`` layers, step ``step``.

    Offloaded layer ``j`` uses slot ``j % k`` (``k = min(N, step)`` slots); its copy is issued just
    before the layer that follows the slot's previous user runs: ``k`` offloaded layers back, or, for
    the first ``k``, the slot's last user in the previous forward (walking back cyclically). That is
    never more than one forward ahead: the previous user is at most ``N`` offloaded layers back.
    """
    n = len(positions)
    if n == 0:
        return []
    if step < 1:
        raise ValueError("prefetch step must be >= 1")
    k = num_slots(n, step)
    out = []
    for j in range(n):
        slot = j % k
        # the previous user of the slot: k back, or for the first k the slot's last user of the previous forward
        previous = j - k if j >= k else slot + k * ((n - 1 - slot) // k) - n
        unrolled = positions[previous % n] - (num_layers if previous < 0 else 0)
        out.append(Trigger(slot, unrolled + 1))
    return out
