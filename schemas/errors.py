"""Errors the project explains to its user, and bad input as one clean message.

``PlannerError`` is the base of every error the planner and the runtime raise on purpose:
it carries the ``message`` to show and the command line's ``exit_code``. ``InputError``
is what every loader raises for a file it cannot use: ``file:line: field.path: what is
wrong (did you mean ...?)``, built from a YAML problem, a pydantic ``ValidationError``
(whose ``loc`` paths are mapped back to lines with the map from ``schemas.yaml_lines``)
or a plain message. A validator says where below its value a problem is with
``LocatedValueError``.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, RootModel, ValidationError

from schemas.exit_codes import BAD_INPUT, INFEASIBLE

MAX_LISTED = 10


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where (source, line, field path) and what."""

    text: str
    source: str | None = None
    line: int | None = None
    field: str = ""

    def __str__(self) -> str:
        where = ""
        if self.source:
            where = f"{self.source}:{self.line}: " if self.line else f"{self.source}: "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.text}"


# exit codes of the `planner` command for the errors below (the whole table: schemas/exit_codes.py)
EXIT_NOT_POSSIBLE = INFEASIBLE  # a valid request that cannot be carried out (no plan fits the budget)
EXIT_BAD_INPUT = BAD_INPUT


class PlannerError(Exception):
    """An error the project raises on purpose: ``message`` says what is wrong (``str()`` is the
    same), ``exit_code`` is what the `planner` command exits with when it ends on it."""

    exit_code: int = EXIT_BAD_INPUT

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = str(message)


class LocatedValueError(ValueError):
    """Raised by a validator for a problem at ``loc`` below the value it validates (for a model
    validator of ``model``: ``("layers", 2)`` is ``model.layers[2]``), so the message names that
    field and line. pydantic passes it through as ``ctx['error']`` of a ``value_error``."""

    def __init__(self, message: str, loc: Sequence[str | int] = ()) -> None:
        super().__init__(message)
        self.loc = tuple(loc)


class InputError(PlannerError):
    """Input the planner cannot use. ``str()`` is the message to show, one problem a line."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problems: Problem | str | Sequence[Problem]) -> None:
        if isinstance(problems, (str, Problem)):
            problems = [problems if isinstance(problems, Problem) else Problem(problems)]
        self.problems = list(problems)
        shown = [str(p) for p in self.problems[:MAX_LISTED]]
        if len(self.problems) > MAX_LISTED:
            shown.append(f"... and {len(self.problems) - MAX_LISTED} more problems")
        super().__init__("\n".join(shown))


# ---------------------------------------------------------------------------
# field paths


def format_path(loc: Sequence[Any]) -> str:
    """``('model', 'layers', 1, 'params', 'mlp.w1', 'shape', 0)`` -> ``model.layers[1].params['mlp.w1'].shape[0]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and ("." in part or not part or " " in part):
            out += f"['{part}']"
        else:
            out += f".{part}" if out else str(part)
    return out


def line_of(loc: Sequence[Any], data: Any, lines: Mapping[tuple[Any, ...], int]) -> int | None:
    """The line of the deepest node of ``data`` that ``loc`` reaches.

    A ``loc`` component that names a field the YAML did not spell out (``shape`` of a
    param written as a bare list) is passed over.
    """
    path: tuple[Any, ...] = ()
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
            path += (part,)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            path += (part,)
        elif isinstance(node, list) and isinstance(part, str):
            continue  # a shorthand: the list stands for {part: list}
        else:
            break
    while path not in lines and path:
        path = path[:-1]
    return lines.get(path)


# ---------------------------------------------------------------------------
# walking the pydantic model classes along a loc, for the keys valid at a place


def _strip_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _strip_optional(args[0])
    if origin is typing.Annotated:
        return _strip_optional(typing.get_args(tp)[0])
    return tp


def model_at(root: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    """The model class whose fields are the keys valid at ``loc`` (None when not a model)."""
    tp: Any = root
    for part in loc:
        tp = _unwrap_root(_strip_optional(tp))
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return None
            tp = field.annotation
        elif origin in (list, tuple, Sequence) and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        elif origin in (dict, Mapping):
            tp = typing.get_args(tp)[1]
        else:
            return None
    tp = _unwrap_root(_strip_optional(tp))
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap_root(tp: Any) -> Any:
    """A RootModel stands for its root's type (its errors' locs have no ``root`` step)."""
    while isinstance(tp, type) and issubclass(tp, RootModel):
        tp = _strip_optional(tp.model_fields["root"].annotation)
    return tp


def suggest(word: str, choices: Iterable[str], *, n: int = 1, cutoff: float = 0.6) -> str:
    """The one "did you mean": `` (did you mean 'x'?)`` for the choice closest to ``word``, with ``n`` > 1 up to n
    of them (`` (did you mean one of 'x', 'y'?)``, never the whole list), or '' when none is close (``cutoff``:
    difflib's similarity, 0 to 1; a choice that differs only in case is close)."""
    choices = list(choices)
    close = difflib.get_close_matches(str(word), choices, n=n, cutoff=cutoff)
    if not close:
        close = [c for c in choices if c.lower() == str(word).lower()][:1]
    if not close:
        return ""
    quoted = ", ".join(f"'{c}'" for c in close)
    return f" (did you mean {quoted}?)" if len(close) == 1 else f" (did you mean one of {quoted}?)"


# ---------------------------------------------------------------------------
# one pydantic error -> one readable sentence


def _got(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if value is None:
        return "nothing (null)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown_key(key: Any, loc: Sequence[Any], root: type[BaseModel] | None) -> str:
    model = model_at(root, loc[:-1]) if root is not None else None
    if model is None:
        return "unknown key"
    valid = list(model.model_fields)
    hint = suggest(str(key), valid)
    return f"unknown key{hint}" if hint else f"unknown key; expected one of: {', '.join(valid)}"


def _literal(err: Mapping[str, Any]) -> str:
    expected = str(err.get("ctx", {}).get("expected", ""))
    options = re.findall(r"'([^']*)'", expected)
    hint = suggest(str(err["input"]), options) if isinstance(err["input"], str) else ""
    return f"expected {expected} (got {_got(err['input'])}){hint}"


_SIZE_HINT = "expected a size such as 20GB, 12 GiB, 1.5TB or a number of bytes"

# error type -> sentence; {got} is the offending value, other fields come from pydantic's ctx
_TEMPLATES: dict[str, str] = {
    "missing": "required key is missing",
    "greater_than": "must be > {gt} (got {got})",
    "greater_than_equal": "must be >= {ge} (got {got})",
    "too_short": "must have at least {min_length} item(s) (got {got})",
    "string_too_short": "must not be empty (got {got})",
    "byte_size": _SIZE_HINT + " (got {got})",
    "byte_size_unit": _SIZE_HINT + " (got {got})",
    "int_parsing": "expected a whole number (got {got})",
    "int_type": "expected a whole number (got {got})",
    "int_from_float": "expected a whole number (got {got})",
    "float_type": "expected a number (got {got})",
    "float_parsing": "expected a number (got {got})",
    "model_type": "expected a mapping of keys (got {got})",
    "dict_type": "expected a mapping of keys (got {got})",
    "model_attributes_type": "expected a mapping of keys (got {got})",
    "list_type": "expected a list (got {got})",
    "string_type": "expected a string (got {got})",
}


def _sentence(err: Mapping[str, Any], root: type[BaseModel] | None) -> str:
    kind, ctx, value = err["type"], err.get("ctx", {}), err.get("input")
    loc = err["loc"]
    if kind == "extra_forbidden":
        return _unknown_key(loc[-1] if loc else "?", loc, root)
    if kind == "value_error":
        return str(ctx.get("error", err["msg"])).removeprefix("Value error, ")
    if kind == "literal_error":
        return _literal(err)
    if kind.startswith("byte_size") and str(value).strip().startswith("-"):
        return f"a size must be positive (got {_got(value)})"
    if kind in _TEMPLATES:
        return _TEMPLATES[kind].format(got=_got(value), **ctx)
    msg = str(err["msg"])
    return f"{msg[:1].lower()}{msg[1:]} (got {_got(value)})"


def _layer_entry(data: Any, loc: tuple[Any, ...], layer: str) -> tuple[Any, ...] | None:
    """The loc of the entry of ``<loc>.layers`` that is (or expands to) the layer named ``layer``."""
    node = data
    for part in loc:
        node = node.get(part) if isinstance(node, dict) else None
    entries = node.get("layers") if isinstance(node, dict) else None
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and re.fullmatch(re.escape(name).replace(r"\{i\}", r"\d+"), layer):
            return loc + ("layers", i)
    return None


def _refine(loc: tuple[Any, ...], err: Mapping[str, Any], data: Any,
            lines: Mapping[tuple[Any, ...], int] | None) -> tuple[Any, ...]:
    """Where an error really is. A validator's ``LocatedValueError`` says so; a model validator's
    plain ValueError sits on the whole model, so when its message names a list entry below it
    (``layers[2]`` or ``layer 'model.layers.3'``), point at that entry instead (a fallback for
    validators that do not say where)."""
    if err["type"] != "value_error":
        return loc
    located = err.get("ctx", {}).get("error")
    if isinstance(located, LocatedValueError):
        return loc + located.loc
    if not lines:
        return loc
    msg = str(err["msg"])
    for name, index in reversed(re.findall(r"(\w+)\[(\d+)\]", msg)):
        deeper = loc + (name, int(index))
        if deeper in lines:
            return deeper
    named = re.match(r"(?:Value error, )?layer '([^']+)'", msg)
    if named:
        return _layer_entry(data, loc, named.group(1)) or loc
    return loc


def problems_from_validation(
    err: ValidationError,
    source: str | None = None,
    data: Any = None,
    lines: Mapping[tuple[Any, ...], int] | None = None,
    root: type[BaseModel] | None = None,
    prefix: Sequence[Any] = (),
) -> list[Problem]:
    """Each error of ``err`` as a Problem; ``prefix`` is prepended to the field paths."""
    out = []
    for e in err.errors(include_url=False):
        loc = _refine(tuple(e["loc"]), e, data, lines)
        line = line_of(loc, data, lines) if lines else None
        out.append(Problem(_sentence(e, root), source, line, format_path(tuple(prefix) + loc)))
    out.sort(key=lambda p: (p.line is None, p.line or 0))
    return out


def input_error_from_validation(err: ValidationError, **kwargs: Any) -> InputError:
    return InputError(problems_from_validation(err, **kwargs))
