"""Errors raised by the runtime. Each says everything that is wrong at once."""

from __future__ import annotations

from schemas.errors import EXIT_BAD_INPUT, EXIT_NOT_POSSIBLE, PlannerError


class PlanMismatchError(PlannerError, ValueError):
    """The plan does not describe this model (names, shapes, dtypes, ties). Nothing was moved."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problems: list[str], model_name: str = "model") -> None:
        self.problems = problems
        shown = problems[:20]
        more = f"\n  … and {len(problems) - 20} more" if len(problems) > 20 else ""
        body = "\n".join(f"  - {p}" for p in shown)
        super().__init__(
            f"the plan does not match the {model_name} ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}); nothing was moved:\n{body}{more}"
        )


class ApplyError(PlannerError, RuntimeError):
    """apply() could not run (no CUDA, not enough memory, …). The model was left as it was."""

    exit_code = EXIT_NOT_POSSIBLE
