"""The `planner` commands' option parser, stricter than click's: no value is empty, none is dropped.

``--hardware ''`` would otherwise mean "no --hardware" (the default profile), ``-o ''`` "stdout", ``--params ''``
"no filter": an empty value is always a slip (an unset shell variable, a stray quote). Refused here, at parse
time, for every option and argument of every command, so a manifest line (``parse_words`` parses it with the
same command) is refused the same way. And an option that takes one value may be given once:
click keeps the last of ``show -w a -w b`` and drops the first without a word; an option that accumulates
(``plan --workload``) is declared as a list and keeps every value.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from contextlib import redirect_stdout
from typing import Any

import typer
import typer.core


class StrictCommand(typer.core.TyperCommand):
    """A typer command whose values given on the command line are never empty (or only spaces)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args:  # the order the parser meets the options in: one entry per use (--help and bad input: below)
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
            _refuse_repeats(ctx, order)
        rest = super().parse_args(ctx, args)
        for param in self.params:
            source = ctx.get_parameter_source(param.name)
            if getattr(source, "name", "") != "COMMANDLINE":
                continue
            value = ctx.params.get(param.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, str) and not v.strip() for v in values):
                raise typer.BadParameter(f"an empty value; {_expected(param)}", ctx=ctx, param=param)
        return rest


def _refuse_repeats(ctx: Any, order: list[Any]) -> None:
    """An option that takes one value given twice: click would keep the last one silently."""
    for i, param in enumerate(order):
        takes_one = param.param_type_name == "option" and not (param.multiple or param.is_flag or param.count)
        if takes_one and param in order[:i]:
            raise typer.BadParameter("given twice; it takes one value", ctx=ctx, param=param)


def _expected(param: Any) -> str:
    """What to give instead, as the help names the value."""
    metavar = getattr(param, "metavar", None)
    if param.param_type_name == "argument":
        return f"give {metavar or param.name.upper()}"
    return f"give {metavar or 'a value'}, or leave the option out"


def parse_words(command: Any, words: Sequence[str], prog: str = "planner plan") -> Any:
    """The click context of ``command`` given ``words`` (its ``params``: the values parsed and converted, as
    when the command runs), or ValueError with the parser's message (an unknown or misspelled option, a value out
    of range). A manifest line is parsed so (planner/review/manifest.py)."""
    stop, usage_error = usage_exceptions()
    try:
        with redirect_stdout(io.StringIO()):  # what --help would print
            return command.make_context(prog, list(words))
    except stop:  # --help: it prints and stops
        raise ValueError("--help makes no plan") from None
    except usage_error as err:
        raise ValueError(err.format_message()) from None


def usage_exceptions() -> tuple[type[BaseException], type[BaseException]]:
    """(the exception that stops a command with an exit code, the usage error) of the click typer runs on:
    typer 0.2x ships its own copy of click, whose exceptions are not click's; older typer uses click."""
    bundled = getattr(typer.core, "_click", None)
    if bundled is None:
        import click as bundled
    return typer.Exit, bundled.ClickException
