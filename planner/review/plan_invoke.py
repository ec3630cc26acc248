"""`planner plan` run from its click command in this process: a manifest line's words parsed by the
command's own option parser, and a check run with its output captured (planner/review/check_plans.py).

Typer 0.2x ships its own copy of click, whose exceptions are not click's; older typer uses click.
Both are handled here, so nothing else needs to know which one runs.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

from planner.cli import exit_codes

PROG = "planner plan"


def parse(plan_command: Any, words: Sequence[str]) -> Any:
    """The click context of `planner plan WORDS` (its ``params``: the values parsed and converted),
    or ValueError with the parser's message (an unknown or misspelled option, a value out of range)."""
    stop, usage_error = _exceptions()
    try:
        with redirect_stdout(io.StringIO()):  # what --help would print
            return plan_command.make_context(PROG, list(words))
    except stop:  # --help: it prints and stops
        raise ValueError("--help makes no plan") from None
    except usage_error as err:
        raise ValueError(err.format_message()) from None


def invoke(plan_command: Any, args: Sequence[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `planner plan ARGS`: a failure ends as on the command line,
    with its message and exit code (the command reports its own errors)."""
    stop, usage_error = _exceptions()
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            with plan_command.make_context(PROG, list(args)) as ctx:
                plan_command.invoke(ctx)
            code = exit_codes.OK
        except stop as done:
            code = done.exit_code
        except usage_error as bad:
            err.write(f"error: {bad.format_message()}\n")
            code = exit_codes.BAD_INPUT
    return code, out.getvalue(), err.getvalue()


def _exceptions() -> tuple[type[BaseException], type[BaseException]]:
    """(the exception that stops a command with an exit code, the usage error) of the click typer runs on."""
    import typer
    import typer.core

    bundled = getattr(typer.core, "_click", None)
    if bundled is None:
        import click as bundled
    return typer.Exit, bundled.ClickException
