"""The one prefix fit: the first step of a path whose plan fits the budgets, or the lowest peak of any.

A *path* is a sequence of steps, each a plan that a strategy may choose: for the budget strategy a
prefix of its ladder on one backend, for the group strategy its layers on one backend, for auto a
(slots, prefix, spanning layer) triple of its slot path. Along a path the moved bytes never shrink, so
the first step that fits a budget is no later on the path than the first that fits a smaller one: a
larger budget never moves a param from the GPU to the host.

``Reckoning`` says what a step holds: ``peak(step)`` its exact (peak, pinned bytes); optionally
``upper(step)`` and ``lower(step)``, cheap bounds on the peak (planner/strategy/peaks.py) that let
the fit skip most exact reckonings. The result depends on the exact peaks only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

S = TypeVar("S")


@dataclass(frozen=True)
class Reckoning(Generic[S]):
    peak: Callable[[S], tuple[int, int]]  # (peak GPU bytes, pinned host bytes)
    pinned: Callable[[S], int] | None = None  # cheaper than peak()[1], when known
    upper: Callable[[S], int] | None = None  # an upper bound on the peak
    lower: Callable[[S], int] | None = None  # a lower bound on the peak


@dataclass(frozen=True)
class Fit(Generic[S]):
    step: S
    peak: int


@dataclass(frozen=True)
class NoFit(Generic[S]):
    """Nothing fits: the step of lowest peak within the CPU budget (the first such on the path; the path's
    first step when every step pins too much) and its peak."""

    lowest: S
    peak: int


def first_fit(steps: Sequence[S], reckon: Reckoning[S], gpu_budget: int | None,
              cpu_budget: int | None) -> Fit[S] | NoFit[S]:
    """The first step of ``steps`` whose peak is within ``gpu_budget`` (None: any) and whose pinned bytes
    are within ``cpu_budget`` (None: any); else the step of lowest peak within the CPU budget."""
    pinned = reckon.pinned or (lambda s: reckon.peak(s)[1])
    within: list[int] = []  # indices of the steps within the CPU budget: a prefix of the path
    for i, step in enumerate(steps):
        if cpu_budget is not None and pinned(step) > cpu_budget:
            break
        within.append(i)
        if gpu_budget is None:
            return Fit(step, reckon.peak(step)[0])
        if reckon.lower is not None and reckon.lower(step) > gpu_budget:
            continue
        if reckon.upper is not None and reckon.upper(step) <= gpu_budget:
            return Fit(step, reckon.peak(step)[0])
        peak = reckon.peak(step)[0]
        if peak <= gpu_budget:
            return Fit(step, peak)
    if not within:
        return NoFit(steps[0], reckon.peak(steps[0])[0])
    return _lowest(steps, within, reckon)


def _lowest(steps: Sequence[S], within: list[int], reckon: Reckoning[S]) -> NoFit[S]:
    """The step of lowest exact peak among ``within`` (the first on the path among equals), reckoning exactly
    only the steps whose lower bound does not rule them out."""
    lower = reckon.lower
    ranked = sorted(within, key=lambda i: (lower(steps[i]), i)) if lower is not None else within
    best: tuple[int, int] | None = None  # (peak, index)
    for i in ranked:
        if best is not None and lower is not None and lower(steps[i]) > best[0]:
            break
        found = (reckon.peak(steps[i])[0], i)
        if best is None or found < best:
            best = found
    assert best is not None
    return NoFit(steps[best[1]], best[0])
