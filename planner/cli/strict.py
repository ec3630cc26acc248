"""The `planner` commands' option parser, stricter than click's: no value is empty, none is dropped.

``--hardware ''`` would otherwise mean "no --hardware" (the default profile), ``-o ''`` "stdout", ``--params ''``
"no filter": an empty value is always a slip (an unset shell variable, a stray quote). Refused here, at parse
time, for every option and argument of every command, so a manifest line (``parse_words`` parses it with the
same command) is refused the same way. And an option that takes one value may be given once:
click keeps the last of ``show -w a -w b`` and drops the first without a word; an option that accumulates
(``plan --workload``) is declared as a list and keeps every value.

Start-up: typer 0.2x converts each value through a pydantic TypeAdapter that it builds for the parameter on
first use, also for an option not given (whose value, None, it passes through untouched); `planner plan` has
some thirty options, and building their adapters took 0.03-0.05 s of every run. ``_coerce_given_only``
builds a parameter's coercion only when a value comes.
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _coerce_given_only(param)

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


def _coerce_given_only(param: Any) -> None:
    """Give ``param`` (a typer parameter) a coercion that handles a missing value (None) as typer's does and
    builds typer's own coercion for the first value given. Typer versions without lazy coercion
    (``_runtime_param``) are left as they are."""
    try:
        from typer._coercion import PassThroughRuntimeParam, build_runtime_param
    except ImportError:
        return
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "_runtime_param", False) is not None:
        return
    # typer's rule for None (RuntimeParam.coerce) comes before any conversion: the same in every RuntimeParam
    unset = PassThroughRuntimeParam(annotation=descriptor.annotation, parameter_info=descriptor.parameter_info)

    class GivenOnly:
        def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
            if value is None:
                return unset.coerce(value, param=param, ctx=ctx)
            param._runtime_param = build_runtime_param(descriptor)
            return param._runtime_param.coerce(value, param=param, ctx=ctx)

    param._runtime_param = GivenOnly()


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
