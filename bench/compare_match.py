"""Matching a plan of ours to another contender's measured GPU memory: when to try again, at what budget,
and which attempt to report (pure decisions: no torch; compare_ours_at.py runs the attempts).

The target of a workload is the other contender's measured peak. The first attempt plans at that peak
minus the activations the floor measured (its peak minus the weights). The runtime's measured peak lands
off the target (on the H200, 0.44 GB against diffusers' 1.05 GB on decode: memory left unused), so when the
first attempt's peak is more than ``SLACK_MIN`` below the target, or above it, a second attempt plans at
what the target leaves after the activations the first attempt measured (its peak less its plan's own
peak), less ``MARGIN``. The row reported under the contender's name is the
fastest attempt whose measured peak is within the target (the first when none is, with a note); every
attempt is its own flagged row (``attempt_of``) and is listed in the reported row's ``attempts``.

A second plan the budget cannot hold (the planner raises the budget, or fails) is not run: the first
attempt stands. Nor is one equal to the first attempt's plan (nothing to learn from running it again).
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20
SLACK_MIN = 32 * MiB  # a first attempt this close below the target is kept as it is
MARGIN = 0  # what the second attempt leaves below the target: the activations were byte-for-byte equal across
# attempts and runs on the H200 (Llama prefill: 1,067,451,392 bytes in all four), so none is needed
EQUAL_WITHIN = 64 * 1024  # peaks this close count as equal: a few of the caching allocator's 512-byte blocks.
# On the H200 this project's Llama prefill peak was 1 KiB above diffusers': two 512-byte blocks alive at the
# LM head (the rotary embedding's frequency buffers, which the runtime leaves on the GPU and diffusers moves
# with their group; bench/probe_peak.py). The rows give both peaks to the byte.


@dataclass
class Attempt:
    """One plan tried for one workload: its budget and what came of it."""

    number: int
    budget: int
    raised: int | None = None  # the budget the planner raised it to (the plan was made there)
    layout: str | None = None  # compare_ours.layout_key of the plan; None when not planned
    row: dict | None = None  # the row written for it; None when it was not run
    reason: str | None = None  # why it was not run

    @property
    def planned(self) -> int | None:
        """The plan's own peak (resident weights and buffers), as its row recorded it."""
        return (self.row or {}).get("info", {}).get("plan_peak_gpu_bytes")

    @property
    def peak(self) -> int | None:
        """The GPU peak it measured (None unless it ran and was measured)."""
        return self.row.get("peak_gpu_bytes") if self.row and self.row.get("status") == "ok" else None

    def record(self) -> dict:
        """What the reported row lists of this attempt."""
        row = self.row or {}
        return {"attempt": self.number, "budget": self.budget, "budget_raised_to": self.raised,
                "status": row.get("status", "not run"), "peak_gpu_bytes": row.get("peak_gpu_bytes"),
                "step_ms": row.get("step_ms"), "predicted_ms": row.get("predicted_ms"),
                "offloaded_bytes": row.get("offloaded_bytes"),
                "reason": self.reason or row.get("reason") or row.get("error")}


def next_budget(budget: int, target: int, measured: int | None, planned: int | None = None, *,
                slack_min: int = SLACK_MIN, margin: int = MARGIN, equal_within: int = EQUAL_WITHIN) -> int | None:
    """The budget of a second attempt after a first at ``budget`` measured ``measured`` against ``target``
    (peaks, bytes). With ``planned`` (the first plan's own peak: resident weights and buffers), what the
    target leaves after the activations the first attempt measured (``measured - planned``), less
    ``margin``: a plan that used less than its budget must not be given the whole difference. Without it,
    ``budget`` moved by the difference, less ``margin``. None when there is nothing to correct: no measured
    peak, a peak within ``slack_min`` below the target, or no budget left to move to."""
    if measured is None:
        return None
    slack = target - measured
    if 0 <= slack <= slack_min:
        return None
    moved = target + equal_within - (measured - planned) - margin if planned is not None else budget + slack - margin
    return moved if moved >= 1 and moved != budget else None


def choose(target: int, attempts: list[dict], equal_within: int = EQUAL_WITHIN) -> int | None:
    """The index of the attempt to report: the fastest measured one whose peak is within ``target`` (to
    ``EQUAL_WITHIN``; the earlier of equals); None when none is (the caller reports the first, saying so)."""
    within = [i for i, a in enumerate(attempts) if a.get("status") == "ok" and a.get("peak_gpu_bytes") is not None
              and a["peak_gpu_bytes"] <= target + equal_within and a.get("step_ms") is not None]
    return min(within, key=lambda i: (attempts[i]["step_ms"], i)) if within else None
