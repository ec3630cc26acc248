"""Errors the planner raises for a spec it cannot plan; each carries its exit code (schemas.errors)."""

from __future__ import annotations

from schemas.errors import EXIT_BAD_INPUT, EXIT_NOT_POSSIBLE, PlannerError


class PlanningError(PlannerError):
    """The request makes no sense for this spec (e.g. strategy group on a spec with no block stack)."""

    exit_code = EXIT_BAD_INPUT


class InfeasibleError(PlannerError):
    """No plan fits the budgets; ``min_gpu_budget`` is the smallest GPU budget that would (or None); ``hints``:
    what the command line adds when it reports it (a budget given without a unit)."""

    exit_code = EXIT_NOT_POSSIBLE

    def __init__(self, message: str, min_gpu_budget: int | None = None) -> None:
        super().__init__(message)
        self.min_gpu_budget = min_gpu_budget
        self.hints: list[str] = []
