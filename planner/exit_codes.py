"""The exit codes of the `planner` command (README, "Errors and exit codes", has the same table).

Light on purpose: the CLI reads it at start-up for its --help text. The errors that end a
command carry their own code (``schemas.errors.PlannerError.exit_code``) with these values.
"""

from __future__ import annotations

OK = 0
CHANGED = 1  # `planner diff`: the plans differ
INFEASIBLE = 1  # no plan fits the budget
BAD_INPUT = 2  # a file, an option or an output path the command cannot use
INTERNAL_ERROR = 70  # a bug in planner (EX_SOFTWARE of sysexits.h)
INTERRUPTED = 130  # Ctrl-C (SIGINT), as a shell reports 128 + 2; no output file is left half-written
BROKEN_PIPE = 141  # stdout was closed early (`planner show plan.yaml | head`), as a shell reports SIGPIPE

DEBUG_ENV = "PLANNER_DEBUG"  # set to 1: an internal error shows its traceback, as --debug does

INTERNAL_NOTE = f"{INTERNAL_ERROR} internal error (a bug: --debug or {DEBUG_ENV}=1 shows the traceback)"
INTERRUPTED_NOTE = f"{INTERRUPTED} interrupted (Ctrl-C; no output file is left half-written)"
BROKEN_PIPE_NOTE = f"{BROKEN_PIPE} stdout closed early (| head), quietly"


def exit_codes_note(*codes: str, closed_pipe: bool = False) -> str:
    """``Exit codes: 0 ok, ..., 70 internal error (...).`` for a command's --help."""
    notes = (*codes, INTERNAL_NOTE, INTERRUPTED_NOTE) + ((BROKEN_PIPE_NOTE,) if closed_pipe else ())
    return f"Exit codes: {', '.join(notes)}."
