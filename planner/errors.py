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
    """No plan fits the budgets: ``record`` says what does not fit and the smallest GPU budget that would
    (planner/strategy/infeasible.py); the message is its words (planner/words/infeasible.py)."""

    exit_code = EXIT_NOT_POSSIBLE

    def __init__(self, record: Infeasible) -> None:
        from planner.words.infeasible import message

        super().__init__(message(record))
        self.record = record

    @property
    def min_gpu_budget(self) -> int | None:
        """The smallest GPU budget that would fit (None: none would)."""
        return self.record.smallest
