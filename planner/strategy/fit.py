"""The one prefix fit: which step of a path a budget takes, or the lowest peak of any when none fits.

A *path* is a sequence of steps, each a plan a strategy may choose, in the order of what they move:
for the budget strategy its ladder (each step on each backend it may use), for the group strategy its
layers on each backend, for auto the prefixes of its order of moves with each slot count. Along a path
the moved params never shrink (steps moving the same params may come in any order).

``first_fit`` takes the first step that fits. ``choose`` takes the first step that fits and that is
*kept*: a step is dropped when a later kept step fits its peak and predicts a faster step, or as fast
a step moving the same params at a lower peak (the walk from the end of the path defines it). So at every budget the plan taken is no later on the path than
at a smaller budget (a larger budget never moves a param from the GPU to the host) and predicts no
slower a step (the plan a smaller budget takes is a candidate at the larger one). Why: if budgets
``b1 < b2`` took steps ``c2`` before ``c1`` with ``c2`` slower, ``c1`` (kept, later, faster) must peak
above ``c2``, or it would have dropped ``c2``; then ``c2`` fits ``b1`` too and, being kept and earlier,
would be taken there.

``Reckoning`` says what a step holds: ``peak(step)`` its exact (peak, pinned bytes); optionally
``upper(step)`` and ``lower(step)``, cheap bounds on the peak (planner/strategy/peaks.py) that let
the fit skip most exact reckonings. ``Speed`` says how fast it is: its predicted step and a floor under
the predicted step of it and every later step (the search stops looking for a faster later step there).
The result depends on the exact peaks and predicted steps only.
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


def _slack(ms: float) -> float:
    """How far apart two predicted steps may be and still count as equal: sums in another order differ."""
    return 1e-9 * abs(ms)


@dataclass(frozen=True)
class Speed(Generic[S]):
    step_ms: Callable[[S], float]  # the predicted (weighted) step
    floor: Callable[[S], float] | None = None  # a lower bound on step_ms of this step and of every later one
    moves: Callable[[S], object] | None = None  # equal for steps moving the same params: a tie goes to the lower peak


@dataclass(frozen=True)
class Chosen(Fit[S]):
    passed: int = 0  # steps before it that fit but that a later step beats


def choose(steps: Sequence[S], reckon: Reckoning[S], gpu_budget: int | None, cpu_budget: int | None,
           speed: Speed[S]) -> Chosen[S] | NoFit[S]:
    """The first step of ``steps`` that fits the budgets and is kept (module docstring); the step of lowest peak
    within the CPU budget when none fits (as ``first_fit``)."""
    return Walk(steps, reckon, cpu_budget, speed).choose(gpu_budget)


class Walk(Generic[S]):
    """``choose`` at any number of GPU budgets over one path and CPU budget: which steps are kept does not
    depend on the GPU budget, so it is worked out once."""

    def __init__(self, steps: Sequence[S], reckon: Reckoning[S], cpu_budget: int | None, speed: Speed[S]):
        self.path = _Path(steps, reckon, cpu_budget, speed)

    def choose(self, gpu_budget: int | None) -> Chosen[S] | NoFit[S]:
        path, steps, reckon = self.path, self.path.steps, self.path.reckon
        passed = 0
        for i in range(path.n):
            if not path.fits(i, gpu_budget):
                continue
            if path.kept(i):
                return Chosen(steps[i], reckon.peak(steps[i])[0], passed)
            passed += 1
        if not path.n:
            return NoFit(steps[0], reckon.peak(steps[0])[0])
        return _lowest(steps, list(range(path.n)), reckon)


class _Path(Generic[S]):
    """The steps within the CPU budget (a prefix: pinned bytes never shrink along a path), with memos."""

    def __init__(self, steps: Sequence[S], reckon: Reckoning[S], cpu_budget: int | None, speed: Speed[S]):
        pinned = reckon.pinned or (lambda s: reckon.peak(s)[1])
        n = 0
        while n < len(steps) and (cpu_budget is None or pinned(steps[n]) <= cpu_budget):
            n += 1
        self.steps, self.reckon, self.speed, self.n = steps, reckon, speed, n
        self._ms: dict[int, float] = {}
        self._kept: dict[int, bool] = {}

    def fits(self, i: int, budget: int | None) -> bool:
        if budget is None:
            return True
        step, r = self.steps[i], self.reckon
        if r.lower is not None and r.lower(step) > budget:
            return False
        if r.upper is not None and r.upper(step) <= budget:
            return True
        return r.peak(step)[0] <= budget

    def ms(self, i: int) -> float:
        if i not in self._ms:
            self._ms[i] = self.speed.step_ms(self.steps[i])
        return self._ms[i]

    def _same(self, j: int, x: int) -> bool:
        same = self.speed.moves
        return same is not None and same(self.steps[j]) == same(self.steps[x])

    def _beats(self, j: int, x: int, ms: float, peak: int) -> bool:
        """Does step ``j`` (later, fitting ``x``'s peak) predict a faster step than ``x``, or as fast a step moving
        the same params at a lower peak? (Steps within a relative 1e-9 of each other predict as fast a step.)"""
        other = self.ms(j)
        if other < ms - _slack(ms):
            return True
        return other <= ms + _slack(ms) and self._same(j, x) and self.reckon.peak(self.steps[j])[0] < peak

    def kept(self, i: int) -> bool:
        """Does no later kept step fit step ``i``'s peak and predict a faster step? (walked without recursion)"""
        floor = self.speed.floor
        stack = [i]
        resume: dict[int, int] = {}
        while stack:
            x = stack[-1]
            if x in self._kept:
                stack.pop()
                continue
            ms, peak = self.ms(x), self.reckon.peak(self.steps[x])[0]
            verdict, waiting = True, False
            j = resume.get(x, x + 1)
            while j < self.n:
                if floor is not None:
                    least = floor(self.steps[j])
                    if least > ms + _slack(ms) or (least >= ms - _slack(ms) and not self._same(j, x)):
                        break  # no step from here on beats x (steps moving x's params are next to it)
                if self.fits(j, peak) and self._beats(j, x, ms, peak):
                    if j not in self._kept:
                        resume[x] = j
                        stack.append(j)
                        waiting = True
                        break
                    if self._kept[j]:
                        verdict = False
                        break
                j += 1
            if not waiting:
                self._kept[x] = verdict
                stack.pop()
        return self._kept[i]
