"""How a `planner` command ends on an exception: lines on stderr and an exit code.

A ``PlannerError`` (bad input, infeasible budget, ...) ends with its message and its own
``exit_code``; an ``InternalError`` is a bug; pydantic's ValidationError and an OSError (with the path) are bad input; a
closed stdout ends quietly; anything else is a bug: one line naming it as such (the
traceback with ``--debug`` or PLANNER_DEBUG=1) and the internal-error code.
Imported only when a command fails, so it may import the schemas.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Iterable, Mapping

from planner.cli import exit_codes

ONE_MB = 10**6  # a budget below this was most likely meant with a unit


class InternalError(Exception):
    """A failure that is the planner's own, not the input's (a plan it made is not valid): reported as a
    bug in ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def report(exc: BaseException, debug: bool = False) -> int:
    """Say on stderr why the command failed; the exit code it ends with."""
    if isinstance(exc, BrokenPipeError):
        silence_stdout()
        return exit_codes.BROKEN_PIPE
    text, code = explain(exc, debug)
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except BrokenPipeError:  # stderr is closed as well: nothing more can be said
        return exit_codes.BROKEN_PIPE
    return code


def explain(exc: BaseException, debug: bool = False) -> tuple[str, int]:
    """What a command that failed with ``exc`` says on stderr (``error:`` and ``hint:`` lines), and the exit
    code it ends with."""
    import yaml
    from pydantic import ValidationError

    from planner.errors import InfeasibleError
    from schemas.errors import PlannerError, problems_from_validation

    if isinstance(exc, InternalError):
        return _bug(exc.cause, debug)
    if isinstance(exc, InfeasibleError):
        return _infeasible(exc)
    if isinstance(exc, PlannerError):
        return lines(exc.message), exc.exit_code
    if isinstance(exc, ValidationError):
        return lines("\n".join(map(str, problems_from_validation(exc)))), exit_codes.BAD_INPUT
    if isinstance(exc, yaml.YAMLError):
        return lines(f"malformed YAML: {exc}"), exit_codes.BAD_INPUT
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return lines(f"{where}{exc.strerror or exc}"), exit_codes.BAD_INPUT
    return _bug(exc, debug)


def lines(message: str, hints: Iterable[str] = ()) -> str:
    """``error:`` before each line of ``message``, then a ``hint:`` line each; control characters from the input
    (a tensor name, a path) are written as escapes, never sent to the terminal."""
    said = [f"error: {_printable(line)}" for line in str(message).splitlines() or [""]]
    return "".join(f"{line}\n" for line in [*said, *(f"hint: {_printable(hint)}" for hint in hints)])


def _printable(text: str) -> str:
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _bug(exc: BaseException, debug: bool) -> tuple[str, int]:
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) if debug else ""
    text = str(exc).strip().splitlines()
    detail = type(exc).__name__ + (f": {text[0]}" if text else "")
    hint = [] if debug else [f"rerun with --debug (or {exit_codes.DEBUG_ENV}=1) to see the traceback"]
    return trace + lines(f"internal error, a bug in planner (please report it): {detail}", hint), \
        exit_codes.INTERNAL_ERROR


def _infeasible(exc: BaseException) -> tuple[str, int]:
    """An InfeasibleError with the smallest feasible GPU budget and how to rerun with it, then its hints."""
    message: str = exc.message  # type: ignore[attr-defined]
    need: int | None = exc.min_gpu_budget  # type: ignore[attr-defined]
    shown = list(exc.hints)  # type: ignore[attr-defined]
    if need is not None:
        if str(need) not in message:
            message += f"\nthe smallest feasible GPU budget is {need} bytes"
        shown.insert(0, f"rerun with --gpu-budget {size_up(need)} or more")
    return lines(message, shown), exc.exit_code  # type: ignore[attr-defined]


def size_up(n: int) -> str:
    """``n`` bytes rounded up to 2 decimals of the largest binary unit it reaches: ``4.46GiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{-(-n * 100 // scale) / 100:.2f}{unit}"
    return str(n)


_BARE_NUMBER = re.compile(r"\s*(\d+(?:\.\d+)?)\s*")


def missing_unit_hints(given: Mapping[str, object]) -> list[str]:
    """For each size given as a bare number below 1 MB (``{"--gpu-budget": "20"}``): a hint that
    a unit is probably missing."""
    hints = []
    for where, value in given.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            continue
        bare = _BARE_NUMBER.fullmatch(str(value))
        if bare and float(bare.group(1)) < ONE_MB:
            number = bare.group(1)
            hints.append(f"{where} {number}: did you mean {number}GB? a bare number is a number of bytes")
    return hints


def silence_stdout() -> None:
    """Point the process's stdout at /dev/null, so that flushing what is left of it at exit
    raises no second BrokenPipeError (a no-op when stdout is no file, as under a test runner)."""
    try:
        fd = sys.stdout.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
