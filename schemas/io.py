"""Reading and writing spec and plan files (YAML or JSON), deterministically.

Loading parses fast without a line map (``yaml_plain.read_plain`` for plain block YAML, else
``yaml_lines.load_data``; duplicate keys still rejected) and re-reads the text with lines only when
validation fails, to point at the lines. A plan is checked against itself too (``schemas.plan_check``): every derived field
is recomputed, so a hand-edited plan that contradicts itself is refused. Plans are written compactly: fields equal to their default are left out (loading
fills them back in), except ``plan_version`` and each layer's ``offloaded``.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from schemas.errors import InputError, Problem, format_path, input_error_from_validation, line_of
from schemas.input_file import input_name, read_input
from schemas.plan import DEFER_CHECK, OLD_STEP_MESSAGE, Plan, old_step_version
from schemas.plan_content import PlanLayer
from schemas.plan_check import plan_findings
from schemas.routing import RoutingStats, file_sha256
from schemas.spec import SpecFile
from schemas.yaml_lines import YamlProblem, load_data, load_with_lines
from schemas.yaml_plain import read_plain
from schemas.yaml_write import dump_yaml

M = TypeVar("M", bound=BaseModel)


source_name = input_name  # how messages name a path ('-': <stdin>)


def read_text(path: str | Path) -> str:
    """The text of a file (``-``: stdin), or InputError saying plainly why it cannot be read
    (schemas/input_file.py: missing, a folder, unreadable, over the input cap)."""
    name = source_name(path)
    raw = read_input(path)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(f"{name}: not a text file (byte {err.start} is not UTF-8); "
                         "expected a YAML or JSON file") from None


_HINT = {  # by a file model's FILE_KIND
    "spec": "a spec file has the top-level keys model (required), memory, offload, workload and hardware",
    "plan": "a plan file has the top-level keys plan_version, summary, layers and buffer_pool; "
            "make one with `planner plan SPEC`",
    "hardware profile": "a hardware profile has the top-level keys name, source, h2d_gbps, uva_gbps, ...; "
                        "make one with `planner calibrate -o FILE`",
    "routing statistics": "a routing file has the top-level keys routing_version, model, source and layers; record "
                          "one with runtime.record_routing(model) (schemas/routing.py)",
}


def guess_kind(data: Any) -> str | None:
    """'spec', 'plan' or 'hardware profile' from the top-level keys of parsed data, or None."""
    if not isinstance(data, dict):
        return None
    if "plan_version" in data or ("summary" in data and "layers" in data):
        return "plan"
    if "routing_version" in data:
        return "routing statistics"
    if "model" in data:
        return "spec"
    if "h2d_gbps" in data or "uva_passes" in data:
        return "hardware profile"
    return None


def _yaml_problem(err: YamlProblem, name: str) -> InputError:
    return InputError(Problem(err.message, name, err.line, format_path(err.path)))


def parse_text(text: str, name: str) -> Any:
    """Parse YAML/JSON text into a non-empty mapping, or InputError."""
    data = read_plain(text)  # None: not plain block YAML, or not valid: PyYAML's parser reads it
    try:
        if data is None:
            data = load_data(text)
    except YamlProblem as err:
        raise _yaml_problem(err, name) from None
    if data is None:
        raise InputError(f"{name}: the file is empty; expected a YAML or JSON mapping")
    if not isinstance(data, dict):
        what = "a list" if isinstance(data, list) else f"a {type(data).__name__} ({data!r:.40})"
        raise InputError(Problem(f"the top level is {what}; expected a mapping of keys", name, 1))
    return data


def _validate(cls: type[M], data: Any, text: str, name: str) -> M:
    want = getattr(cls, "FILE_KIND", None)
    found = guess_kind(data)
    if want and found and found != want:
        raise InputError(Problem(f"this is a {found} file, not a {want}: {_HINT[want]}", name, 1))
    if cls is Plan and old_step_version(data):
        data, lines = _with_lines(text, name)
        raise InputError(Problem(OLD_STEP_MESSAGE, name, line_of(("plan_version",), data, lines)))
    try:
        model = cls.model_validate(data, context={DEFER_CHECK: True})
    except ValidationError as err:
        data, lines = _with_lines(text, name)
        raise input_error_from_validation(err, source=name, data=data, lines=lines, root=cls) from None
    if isinstance(model, Plan):
        _check_plan(model, text, name)
    return model


def _with_lines(text: str, name: str) -> tuple[Any, dict]:
    """The same data, now with the line of every node (read only when there is something to point at)."""
    try:
        return load_with_lines(text)
    except YamlProblem as problem:
        raise _yaml_problem(problem, name) from None


def _check_plan(plan: Plan, text: str, name: str) -> None:
    """The plan check (schemas/plan_check.py), each finding pointing at its line of the file."""
    findings = plan_findings(plan)
    if findings:
        data, lines = _with_lines(text, name)
        raise InputError([Problem(f.text, name, line_of(f.loc, data, lines), format_path(f.loc))
                          for f in findings])


@contextmanager
def gc_paused() -> Iterator[None]:
    """The body run with Python's cycle collector off (its state restored after, also on an error). Reading a
    10,000-layer spec creates about a million objects that all stay alive; the collector, triggered by the
    allocations, walks them again and again (a third of the load time) and finds nothing to free, since parsed
    data and validated models hold no reference cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_model(cls: type[M], path: str | Path, text: str | None = None) -> M:
    """Load and validate a spec or plan; every failure is an InputError naming file, line and field."""
    name = source_name(path)
    text = read_text(path) if text is None else text
    with gc_paused():
        return _validate(cls, parse_text(text, name), text, name)


def load_spec(path: str | Path) -> SpecFile:
    return load_model(SpecFile, path)


def load_plan(path: str | Path) -> Plan:
    return load_model(Plan, path)


def load_routing(path: str | Path) -> tuple[RoutingStats, str]:
    """Routing statistics and the sha256 of the file's bytes (a plan made with them names both)."""
    text = read_text(path)
    return load_model(RoutingStats, path, text), file_sha256(text.encode("utf-8"))


def load_spec_or_plan(path: str | Path) -> SpecFile | Plan:
    """A spec or a plan, told apart by the top-level keys (a spec when unclear)."""
    name = source_name(path)
    text = read_text(path)
    with gc_paused():
        data = parse_text(text, name)
        cls: type[SpecFile] | type[Plan] = Plan if guess_kind(data) == "plan" else SpecFile
        return _validate(cls, data, text, name)


_LAYER_FIELDS = tuple(PlanLayer.model_fields)


_NO_PARAMS = {"layers": {"__all__": {"params"}}}


def plan_data(plan: Plan) -> dict[str, Any]:
    """The plan as plain data for a file: fields equal to their default left out, except
    ``plan_version`` and each layer's ``offloaded`` (an empty list for a resident layer).

    Each param object is dumped once (a 1,000-layer plan lists some 20 distinct ones 20,000 times; dumping them
    with the plan was four fifths of its model_dump), layers listing the same params (names and param objects)
    share one ``params`` dict, and equal ``offloaded`` lists one list, so that the YAML writer lays each out
    once (schemas/yaml_write.py). Nothing here is changed after it is returned."""
    data = plan.model_dump(mode="json", exclude_defaults=True, exclude=_NO_PARAMS)
    data = {"plan_version": plan.plan_version, **data}
    dumped: dict[int, Any] = {}  # id(PlanParam) -> its data
    shared_params: dict[tuple[Any, ...], dict[str, Any]] = {}  # (names, ids of the params) -> a layer's params
    shared_lists: dict[tuple[str, ...], list[str]] = {}
    layers = data["layers"]
    for i, (model, layer) in enumerate(zip(plan.layers, layers)):
        key = (*model.params, *map(id, model.params.values()))
        params = shared_params.get(key)
        if params is None:
            params = shared_params[key] = {rel: _param_data(p, dumped) for rel, p in model.params.items()}
        offloaded = layer.get("offloaded")
        offloaded = [] if offloaded is None else shared_lists.setdefault(tuple(offloaded), offloaded)
        layer.update(params=params, offloaded=offloaded)
        layers[i] = {k: layer[k] for k in _LAYER_FIELDS if k in layer}
    return data


def _param_data(param: BaseModel, dumped: dict[int, Any]) -> Any:
    """``param`` as data (dumped once, by object)."""
    data = dumped.get(id(param))
    if data is None:
        data = dumped[id(param)] = param.model_dump(mode="json", exclude_defaults=True)
    return data


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"


def dump_model(model: BaseModel, fmt: str = "yaml") -> str:
    """A spec or plan as file text (``fmt``: yaml or json); plans in their compact form."""
    if isinstance(model, Plan):
        data = plan_data(model)
    else:
        data = model.model_dump(mode="json", exclude_none=True)
    return dump_json(data) if fmt == "json" else dump_yaml(data)
