"""The command line in progress spelled back as the user gave it (for a "run this instead" hint).

Read from click's context, so an option added to a command is spelled back without a change here:
arguments in order, then each option the user gave (not those left at their default) under its
long name, a repeatable option once per value.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def words_given(ctx: Any, leave_out: Collection[str] = ()) -> list[str]:
    """The words of ``ctx``'s command line (typer's click Context) after the command name, unquoted;
    parameters named in ``leave_out`` (by their Python name) are left out."""
    arguments: list[str] = []
    options: list[str] = []
    for param in ctx.command.params:
        name = param.name
        value = ctx.params.get(name)
        source = ctx.get_parameter_source(name)
        if name in leave_out or value is None or source is None or source.name == "DEFAULT":
            continue
        values = list(value) if param.multiple or param.nargs != 1 else [value]
        if param.param_type_name == "argument":
            arguments += [_word(v) for v in values]
            continue
        flag = max(param.opts, key=lambda o: (o.startswith("--"), len(o)))  # the long name
        for v in values:
            if getattr(param, "is_flag", False):
                options += [flag] if v else list(param.secondary_opts[:1])
            else:
                options += [flag, _word(v)]
    return arguments + options


def _word(value: object) -> str:
    return str(getattr(value, "value", value))  # an Enum choice by its value
