"""Reading and writing spec and plan files (YAML or JSON), deterministically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

from schemas.plan import Plan
from schemas.spec import SpecFile

M = TypeVar("M", bound=BaseModel)


def _read_text(path: str | Path) -> str:
    if str(path) == "-":
        import sys

        return sys.stdin.read()
    return Path(path).read_text()


def load_model(cls: type[M], path: str | Path, text: str | None = None) -> M:
    text = _read_text(path) if text is None else text
    data = yaml.safe_load(text)
    return cls.model_validate(data)


def load_spec(path: str | Path) -> SpecFile:
    return load_model(SpecFile, path)


def load_plan(path: str | Path) -> Plan:
    return load_model(Plan, path)


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
