"""Reading and writing spec and plan files (YAML or JSON), deterministically."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from schemas.errors import InputError, Problem, format_path, input_error_from_validation
from schemas.plan import Plan
from schemas.spec import SpecFile
from schemas.yaml_lines import YamlProblem, load_with_lines

M = TypeVar("M", bound=BaseModel)


def source_name(path: str | Path) -> str:
    return "<stdin>" if str(path) == "-" else str(path)


def read_text(path: str | Path) -> str:
    """The text of a file (``-``: stdin), or InputError saying plainly why it cannot be read."""
    name = source_name(path)
    try:
        raw = sys.stdin.buffer.read() if str(path) == "-" else Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a directory, not a file") from None
    except PermissionError:
        raise InputError(f"{name}: permission denied") from None
    except OSError as err:
        raise InputError(f"{name}: cannot read: {err.strerror or err}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(f"{name}: not a text file (byte {err.start} is not UTF-8); "
                         "expected a YAML or JSON file") from None


_KIND = {SpecFile: "spec", Plan: "plan"}
_HINT = {
    "spec": "a spec file has the top-level keys model (required), memory and offload",
    "plan": "a plan file has the top-level keys plan_version, summary, layers and buffer_pool; "
            "make one with `planner plan SPEC`",
}


def guess_kind(data: Any) -> str | None:
    """'spec' or 'plan' from the top-level keys of parsed data, or None."""
    if not isinstance(data, dict):
        return None
    if "plan_version" in data or ("summary" in data and "layers" in data):
        return "plan"
    if "model" in data:
        return "spec"
    return None


def parse_text(text: str, name: str) -> tuple[Any, dict[tuple[Any, ...], int]]:
    """Parse YAML/JSON text into a non-empty mapping and its line map, or InputError."""
    try:
        data, lines = load_with_lines(text)
    except YamlProblem as err:
        raise InputError(Problem(err.message, name, err.line, format_path(err.path))) from None
    if data is None:
        raise InputError(f"{name}: the file is empty; expected a YAML or JSON mapping")
    if not isinstance(data, dict):
        what = "a list" if isinstance(data, list) else f"a {type(data).__name__} ({data!r:.40})"
        raise InputError(Problem(f"the top level is {what}; expected a mapping of keys", name, 1))
    return data, lines


def load_model(cls: type[M], path: str | Path, text: str | None = None) -> M:
    """Load and validate a spec or plan; every failure is an InputError naming file, line and field."""
    name = source_name(path)
    text = read_text(path) if text is None else text
    data, lines = parse_text(text, name)
    want = _KIND.get(cls)
    found = guess_kind(data)
    if want and found and found != want:
        raise InputError(Problem(f"this is a {found} file, not a {want}: {_HINT[want]}", name, 1))
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise input_error_from_validation(err, source=name, data=data, lines=lines, root=cls) from None


def load_spec(path: str | Path) -> SpecFile:
    return load_model(SpecFile, path)


def load_plan(path: str | Path) -> Plan:
    return load_model(Plan, path)


def load_spec_or_plan(path: str | Path) -> SpecFile | Plan:
    """A spec or a plan, told apart by the top-level keys (a spec when unclear)."""
    name = source_name(path)
    text = read_text(path)
    data, _ = parse_text(text, name)
    cls: type[SpecFile] | type[Plan] = Plan if guess_kind(data) == "plan" else SpecFile
    return load_model(cls, path, text)


class _FlowListDumper(yaml.SafeDumper):
    """Writes short lists of scalars (shapes, strides) on one line; everything else block style."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_FlowListDumper.add_representer(list, _represent_list)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_FlowListDumper, sort_keys=False, allow_unicode=True, width=100)


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"


def dump_model(model: BaseModel, fmt: str = "yaml") -> str:
    data = model.model_dump(mode="json", exclude_none=True)
    return dump_json(data) if fmt == "json" else dump_yaml(data)
