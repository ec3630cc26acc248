"""How a `planner` command ends on an exception: lines on stderr and an exit code.

A ``PlannerError`` (bad input, infeasible budget, ...) ends with its message and its own
``exit_code``; pydantic's ValidationError and an OSError (with the path) are bad input; a
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


def say(message: str, hints: Iterable[str] = ()) -> None:
    for line in str(message).splitlines() or [""]:
        print(f"error: {line}", file=sys.stderr)
    for hint in hints:
        print(f"hint: {hint}", file=sys.stderr)
    sys.stderr.flush()


def report(exc: BaseException, debug: bool = False) -> int:
    """Say on stderr why the command failed; the exit code it ends with."""
    try:
        return _report(exc, debug)
    except BrokenPipeError:  # stderr is closed as well: nothing more can be said
        return exit_codes.BROKEN_PIPE


def _report(exc: BaseException, debug: bool) -> int:
    if isinstance(exc, BrokenPipeError):
        silence_stdout()
        return exit_codes.BROKEN_PIPE
    import yaml
    from pydantic import ValidationError

    from planner.errors import InfeasibleError
    from schemas.errors import PlannerError, problems_from_validation

    if isinstance(exc, InfeasibleError):
        return report_infeasible(exc)
    if isinstance(exc, PlannerError):
        say(exc.message)
        return exc.exit_code
    if isinstance(exc, ValidationError):
        say("\n".join(map(str, problems_from_validation(exc))))
        return exit_codes.BAD_INPUT
    if isinstance(exc, yaml.YAMLError):
        say(f"malformed YAML: {exc}")
        return exit_codes.BAD_INPUT
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        say(f"{where}{exc.strerror or exc}")
        return exit_codes.BAD_INPUT
    return report_bug(exc, debug)


def report_bug(exc: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    text = str(exc).strip().splitlines()
    detail = type(exc).__name__ + (f": {text[0]}" if text else "")
    hint = [] if debug else [f"rerun with --debug (or {exit_codes.DEBUG_ENV}=1) to see the traceback"]
    say(f"internal error, a bug in planner (please report it): {detail}", hint)
    return exit_codes.INTERNAL_ERROR


def report_infeasible(exc: BaseException, hints: Iterable[str] = ()) -> int:
    """An InfeasibleError: its record in words (which name the smallest feasible GPU budget where one
    exists) and how to rerun with that budget."""
    from planner.words.infeasible import message

    record = exc.record  # type: ignore[attr-defined]
    shown = list(hints)
    if record.smallest is not None:
        shown.insert(0, f"rerun with --gpu-budget {size_up(record.smallest)} or more")
    say(message(record), shown)
    return exc.exit_code  # type: ignore[attr-defined]


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
