"""Errors the planner raises for a spec it cannot plan (the CLI maps them to exit codes)."""

from __future__ import annotations


class PlanningError(Exception):
    """The request makes no sense for this spec (e.g. strategy group on a spec with no block stack)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InfeasibleError(Exception):
    """No plan fits the budgets; ``min_gpu_budget`` is the smallest GPU budget that would (or None)."""

    def __init__(self, message: str, min_gpu_budget: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.min_gpu_budget = min_gpu_budget
