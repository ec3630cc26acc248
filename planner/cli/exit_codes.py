"""The `planner` command's exit-code notes for --help and the debug switch; the codes themselves are
``schemas/exit_codes.py`` (re-exported here for the CLI)."""

from __future__ import annotations

from schemas.exit_codes import (BAD_INPUT, BROKEN_PIPE, CHANGED, INFEASIBLE, INTERNAL_ERROR,  # noqa: F401
                                 INTERRUPTED, OK)

DEBUG_ENV = "PLANNER_DEBUG"  # set to 1: an internal error shows its traceback, as --debug does

INTERNAL_NOTE = f"{INTERNAL_ERROR} internal error (a bug: --debug or {DEBUG_ENV}=1 shows the traceback)"
INTERRUPTED_NOTE = f"{INTERRUPTED} interrupted (Ctrl-C; no output file is left half-written)"
BROKEN_PIPE_NOTE = f"{BROKEN_PIPE} stdout closed early (| head), quietly"


def exit_codes_note(*codes: str, closed_pipe: bool = False) -> str:
    """``Exit codes: 0 ok, ..., 70 internal error (...).`` for a command's --help."""
    notes = (*codes, INTERNAL_NOTE, INTERRUPTED_NOTE) + ((BROKEN_PIPE_NOTE,) if closed_pipe else ())
    return f"Exit codes: {', '.join(notes)}."
