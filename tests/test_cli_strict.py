"""Every option and argument of every `planner` command (planner/cli/strict.py): an empty value is refused, and
an option that takes one value is refused when given twice (click would silently keep the last); a repeatable
option keeps every value."""

from __future__ import annotations

from typing import Any

import pytest
from cli_samples import invoke
from typer.main import get_command

from planner.cli.app import app
from planner.cli.strict import usage_exceptions

ROOT = get_command(app)
COMMANDS = sorted(ROOT.commands.items())  # type: ignore[attr-defined]
_, USAGE_ERROR = usage_exceptions()


CANDIDATES = ("1", "x", "yaml", "text", "auto", "vllm", "spec", "graph", "throughput")  # one of them suits each option's type


def _value(name: str, cmd: Any, param: Any, before: list[str] = ()) -> str:
    """A value the option's type accepts."""
    for value in CANDIDATES:
        if "Invalid value" not in _parse_error(name, cmd, [*before, param.opts[0], value]):
            return value
    raise AssertionError(f"no candidate value suits {param.opts[0]}")


def _required(name: str, cmd: Any, leave: Any = None) -> list[str]:
    """Every required option and argument with a value (``leave``: that one given as '')."""
    out: list[str] = []
    for param in cmd.params:
        if param.required and param.param_type_name == "option":
            out += [param.opts[0], "" if param is leave else _value(name, cmd, param)]
        elif param.required:
            out.append("" if param is leave else "x")
    return out


def _parse_error(name: str, cmd: Any, args: list[str]) -> str:
    try:
        cmd.make_context(name, args)
    except USAGE_ERROR as err:
        return err.format_message()
    return ""


def _cases(kind: str) -> list[Any]:
    cases = []
    for name, cmd in COMMANDS:
        for param in cmd.params:
            if param.param_type_name == "option" and not (param.is_flag or param.count or param.is_eager):
                if kind == "twice" and param.multiple:
                    continue
                cases.append(pytest.param(name, cmd, param, id=f"{name} {param.opts[0]}"))
            elif kind == "empty" and param.param_type_name == "argument":
                cases.append(pytest.param(name, cmd, param, id=f"{name} {param.name.upper()}"))
    return cases


@pytest.mark.parametrize(("name", "cmd", "param"), _cases("empty"))
def test_an_empty_value_is_refused(name: str, cmd: Any, param: Any) -> None:
    args = _required(name, cmd, leave=param)
    if param.param_type_name == "argument" and not param.required:
        args.append("")
    elif param.param_type_name == "option" and not param.required:
        args += [param.opts[0], ""]
    said = _parse_error(name, cmd, args)
    assert said.startswith("Invalid value for"), (args, said)  # ours, or the type's own refusal (an int, a choice)
    assert any(w in said for w in ("an empty value", "is not one of", "valid integer")), said


@pytest.mark.parametrize(("name", "cmd", "param"), _cases("twice"))
def test_a_one_value_option_given_twice_is_refused(name: str, cmd: Any, param: Any) -> None:
    args = _required(name, cmd)
    value = _value(name, cmd, param)
    args += [param.opts[-1], value] if param.required else [param.opts[0], value, param.opts[-1], value]
    said = _parse_error(name, cmd, args)
    assert "given twice; it takes one value" in said, said


def test_a_repeatable_option_keeps_every_value() -> None:
    out = invoke("plan", "examples/llama-3-8b.yaml", "-g", "12GB", "-w", "decode", "--workload", "prefill")
    assert out.exit_code == 0, out.output
    assert "workload: decode" in out.output and "workload: prefill" in out.output


def test_the_reported_cases() -> None:
    hardware = invoke("plan", "examples/llama-3-8b.yaml", "-g", "12GB", "--hardware", "")
    assert hardware.exit_code == 2 and "'--hardware': an empty value; give NAME|FILE" in hardware.output
    show = invoke("show", "plan.yaml", "--workload", "decode", "--workload", "prefill")
    assert show.exit_code == 2 and "'--workload': given twice" in show.output


def _typers_own(cmd: Any, name: str, args: list[str]) -> Any:
    """The params typer itself parses for ``args`` (every parameter's coercion built up front, as typer does), or
    its usage message."""
    from typer._coercion import build_runtime_param

    kept = [(param, param._runtime_param) for param in cmd.params]
    try:
        for param in cmd.params:
            param._runtime_param = build_runtime_param(param.type_descriptor)
        return cmd.make_context(name, args).params
    except USAGE_ERROR as err:
        return err.format_message()
    finally:
        for param, runtime in kept:
            param._runtime_param = runtime


@pytest.mark.parametrize("args", [
    ["spec.yaml"],
    ["spec.yaml", "-g", "12GB", "-w", "decode", "-w", "prefill=2048", "--group-size", "4", "--format", "json",
     "--backend", "uva", "--tp", "2", "--context", "4096"],
])
def test_options_not_given_parse_as_typer_parses_them(args: list[str]) -> None:
    """Coercion is built only for a value given (start-up time); what a command gets is what typer gives."""
    cmd = dict(COMMANDS)["plan"]
    assert cmd.make_context("plan", list(args)).params == _typers_own(cmd, "plan", list(args))


@pytest.mark.parametrize("args", [["--group-size", "0"], ["--format", "xml"], ["--tp", "two"], ["--context", "0"]])
def test_a_bad_value_gets_typers_message(args: list[str]) -> None:
    cmd = dict(COMMANDS)["plan"]
    said = _parse_error("plan", cmd, ["spec.yaml", *args])
    assert said.startswith("Invalid value for") and said == _typers_own(cmd, "plan", ["spec.yaml", *args])
