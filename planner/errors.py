"""Errors the planner raises for a spec it cannot plan; each carries its exit code (schemas.errors)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.errors import EXIT_BAD_INPUT, EXIT_NOT_POSSIBLE, PlannerError

if TYPE_CHECKING:
    from planner.strategy.infeasible import Infeasible


class PlanningError(PlannerError):
    """The request makes no sense for this spec (e.g. strategy group on a spec with no block stack)."""

    exit_code = EXIT_BAD_INPUT


class InfeasibleError(PlannerError):
    """No plan fits the budgets. ``record`` says what does not fit and the smallest GPU budget that would
    (planner/strategy/infeasible.py; the message is its words, planner/words/infeasible.py), or None where the
    message was composed around another's (the memory model's, planner/memory/parts.py);
    ``min_gpu_budget``: the smallest GPU budget that would fit (None: none would); ``hints``: what the command
    line adds when it reports it (a budget given without a unit)."""

    exit_code = EXIT_NOT_POSSIBLE

    def __init__(self, reason: Infeasible | str, min_gpu_budget: int | None = None) -> None:
        if isinstance(reason, str):
            super().__init__(reason)
            self.record: Infeasible | None = None
            self.min_gpu_budget = min_gpu_budget
        else:
            from planner.words.infeasible import message

            super().__init__(message(reason))
            self.record = reason
            self.min_gpu_budget = reason.smallest
        self.hints: list[str] = []
