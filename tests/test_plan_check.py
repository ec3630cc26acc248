"""The plan check (schemas/plan_check.py): plans the planner makes pass it, hand edits that
contradict the rest of a plan do not, and random single edits are refused or change nothing
the runtime uses (a hypothesis property)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from corpus.plans import valid_plan_data
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import planner
from planner.errors import InfeasibleError, PlanningError
from schemas import InputError, Plan, SpecFile, load_spec
from schemas.buffer_pool import PoolKey, build_pool, signature
from schemas.dtypes import DTYPE_BYTES
from schemas.io import dump_model, load_model, load_plan
from schemas.plan_check import plan_findings
from schemas.schedule import schedule
from schemas.yaml_write import dump_yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml")) + sorted((ROOT / "examples" / "generated").glob("*.yaml"))


def load_text(text: str) -> Plan:
    return load_model(Plan, "plan.yaml", text=text)


def findings(data: dict[str, Any]) -> list[str]:
    """The findings of the plan check on ``data`` (which must be structurally valid)."""
    return [str(f) for f in plan_findings(Plan.model_validate(data, context={"defer_plan_check": True}))]


# -- every plan the planner makes passes ----------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem if p.parent.name == "examples" else f"generated-{p.stem}"
                                                for p in EXAMPLES])
def test_plans_for_every_example_pass_the_check(path: Path) -> None:
    spec = load_spec(path)
    total = sum(layer.nbytes for layer in spec.model.expanded())
    made = 0
    for backend in ("auto", "prefetch", "uva", "none"):
        for share in (0.35, 0.6, 0.9, None):
            budget = None if share is None else int(total * share)  # None: the spec's own budget
            try:
                plan = planner.plan(spec, gpu_budget=budget, backend=backend)  # Plan() runs the check
            except InfeasibleError:
                continue
            assert plan_findings(plan) == []
            again = load_text(dump_model(plan, "yaml"))
            assert again == plan
            made += 1
    group = planner.plan(spec, strategy="group", group_size=3, num_in_group=2, prefetch_step=2, backend="prefetch")
    assert load_text(dump_model(group, "json")) == group
    assert made >= 6


def test_a_valid_plan_has_no_findings() -> None:
    for kind in ("prefetch", "uva", "none"):
        assert findings(valid_plan_data(kind)) == []


# -- each hand edit the issue lists ----------------------------------------------------------


def edit(kind: str, path: str, value: Any) -> dict[str, Any]:
    data = valid_plan_data(kind)
    *parents, last = path.split("/")
    node: Any = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return data


EDITS = [  # (plan, path, value, a fragment of the finding)
    ("prefetch", "summary/prefetch_step", 0, "summary.prefetch_step: must be >= 1 (got 0)"),
    ("prefetch", "layers/1/params/mlp.w1/bytes", 1,
     "layers[1].params['mlp.w1'].bytes: 1 in the file, 256 from shape [16, 8], dtype float16"),
    ("uva", "layers/4/resident_bytes", 5, "layers[4].resident_bytes: 5 in the file, 0 from"),
    ("uva", "layers/4/offloaded_bytes", 5, "layers[4].offloaded_bytes: 5 in the file, 1152 from"),
    ("uva", "summary/total_bytes", 1, "summary.total_bytes: 1 in the file, 7936 from"),
    ("prefetch", "summary/peak_gpu_bytes", 3328, "summary.peak_gpu_bytes: 3328 in the file, 5632 from"),
    ("none", "summary/layers", 9, "summary.layers: 9 in the file, 8 from"),
    ("none", "layers/0/params/weight/dtype", "bfloat61", "did you mean 'bfloat16'"),
    ("uva", "summary/gpu_budget_bytes", 100, "the peak (2176 bytes) is larger than the plan's GPU budget"),
    ("prefetch", "buffer_pool/bytes", 9, "buffer_pool.bytes: 9 in the file, 2304 from"),
    ("prefetch", "buffer_pool/keys/1/param", "mlp.w9", "buffer_pool.keys[1]: no offloaded param needs a buffer mlp.w9"),
    ("prefetch", "layers/5/prefetch/copy_before", "blocks.4", "layers[5].prefetch.copy_before: 'blocks.4' in the file"),
    ("prefetch", "layers/3/prefetch/copy_before", "blocks.3", "layers[3].prefetch.copy_before: 'blocks.3' in the file"),
    ("prefetch", "layers/6/prefetch/slot", 0, "layers[6].prefetch.slot: 0 in the file, 1 from"),
    ("uva", "layers/2/offloaded", ["mlp.w1", "mlp.w1"], "layers[2].offloaded[1]: 'mlp.w1' is listed more than once"),
    ("uva", "summary/backend", "none", "summary.backend: 'none' keeps every param on the GPU, but 5 layer(s)"),
    ("none", "summary/spec_sha256", "g" * 64, "summary.spec_sha256"),
]


@pytest.mark.parametrize("kind,path,value,fragment", EDITS, ids=[f"{e[0]}:{e[1]}" for e in EDITS])
def test_each_edit_is_refused_naming_the_field(kind: str, path: str, value: Any, fragment: str) -> None:
    data = edit(kind, path, value)
    with pytest.raises(InputError) as info:
        load_text(dump_yaml(data))
    assert fragment in str(info.value)
    assert "plan.yaml:" in str(info.value)
    with pytest.raises(ValidationError, match="the plan contradicts itself"):
        Plan.model_validate(data)  # a Plan made in Python is checked too


def test_four_layers_on_one_slot_lists_every_wrong_slot() -> None:
    data = valid_plan_data("prefetch")
    for i in (2, 3, 5, 6):
        data["layers"][i]["prefetch"]["slot"] = 0
    found = findings(data)
    assert found == ["layers[3].prefetch.slot: 0 in the file, 1 from the schedule of prefetch_step 2 over 4 "
                     "offloaded layers in 2 slots",
                     "layers[6].prefetch.slot: 0 in the file, 1 from the schedule of prefetch_step 2 over 4 "
                     "offloaded layers in 2 slots"]


def test_all_findings_are_reported_together_with_their_lines() -> None:
    data = edit("uva", "summary/total_bytes", 1)
    data["layers"][1]["params"]["mlp.w1"]["bytes"] = 2
    data["summary"]["spec_sha256"] = "abc"
    text = dump_yaml(data)
    with pytest.raises(InputError) as info:
        load_text(text)
    lines = text.splitlines()
    problems = info.value.problems
    assert {p.field for p in problems} >= {"summary.total_bytes", "layers[1].params['mlp.w1'].bytes",
                                           "summary.spec_sha256"}
    for p in problems:
        assert p.line is not None
        key = p.field.rsplit(".", 1)[-1].strip("[]'")
        assert key in lines[p.line - 1], (p, lines[p.line - 1])


def test_runtime_check_catches_a_plan_built_without_validation() -> None:
    torch = pytest.importorskip("torch")  # noqa: F841
    import runtime

    plan = Plan.model_validate(valid_plan_data("prefetch"))
    bad = plan.model_copy(update={"buffer_pool": plan.buffer_pool.model_copy(update={"slots": 1})})
    with pytest.raises(InputError, match=r"buffer_pool.slots: 1 in the file, 2 from"):
        runtime.apply(bad, torch.nn.Module(), device="cpu")


# -- the contract pieces defined once ---------------------------------------------------------


def _walk_back_schedule(positions: list[int], num_layers: int, step: int) -> list[tuple[int, int]]:
    """The schedule rule written plainly: walk back to the previous user of the slot, start right after it."""
    n, k = len(positions), min(len(positions), step)

    def pos(m: int) -> int:
        return positions[m % n] + num_layers * (m // n)

    out = []
    for j in range(n):
        m = j - 1
        while (m % n) % k != j % k:
            m -= 1
        out.append((j % k, max(pos(m) + 1, positions[j] - num_layers + 1)))
    return out


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_schedule_matches_the_walk_back_rule(data: st.DataObject) -> None:
    num_layers = data.draw(st.integers(1, 40))
    positions = sorted(data.draw(st.sets(st.integers(0, num_layers - 1), min_size=1)))
    step = data.draw(st.one_of(st.integers(1, 50), st.just(10**30)))
    got = [dataclasses.astuple(t) for t in schedule(positions, num_layers, step)]
    assert got == _walk_back_schedule(positions, num_layers, step)


def test_pool_key_is_the_one_key() -> None:
    plan = Plan.model_validate(valid_plan_data("prefetch"))
    layer = plan.layers[2]
    keys = {p.pool_key(rel) for rel, p in layer.params.items()}
    assert keys == {k.key for k in plan.buffer_pool.keys}
    assert PoolKey.of("w", [2, 3], "float16", [1, 2]) == PoolKey("w", (2, 3), "float16", (1, 2))
    rebuilt = build_pool([signature(_TensorLike(rel, p) for rel, p in layer.params.items())] * 4, 2)
    assert [(e.key, e.nbytes, list(e.slots)) for e in rebuilt] == \
        [(k.key, k.bytes, k.slots) for k in plan.buffer_pool.keys]


@dataclasses.dataclass
class _TensorLike:
    rel: str
    p: Any

    def __getattr__(self, name: str) -> Any:
        p = self.__dict__["p"]
        return {"name": self.rel, "shape": tuple(p.shape), "dtype": p.dtype,
                "stride": None if p.stride is None else tuple(p.stride), "nbytes": p.bytes}[name]


def test_runtime_dtype_table_follows_the_schema_names() -> None:
    torch = pytest.importorskip("torch")
    from runtime.tensors import DTYPES, dtype_name

    assert set(DTYPES) <= set(DTYPE_BYTES)
    assert {"float32", "float16", "bfloat16", "int8", "bool"} <= set(DTYPES)
    for name, dtype in DTYPES.items():
        assert dtype_name(dtype) == name
        assert torch.empty((), dtype=dtype).element_size() == DTYPE_BYTES[name], name


# -- the property: a random single edit is refused or changes nothing the runtime uses --------


def runtime_view(plan: Plan, renamed: dict[str, str] | None = None) -> Any:
    """What runtime.apply acts on, by layer name, leaving out the model description (param
    shapes, dtypes, strides, buffer flags, tie targets, the order of layers): runtime.check_model
    compares that with the real model, and the schedule check with the prefetch entries.
    ``renamed`` maps a layer's new name back to its old one."""
    renamed = renamed or {}

    def name(n: str) -> str:
        return renamed.get(n, n)

    layers = {name(layer.name): ({rel: p.bytes for rel, p in layer.params.items()}, sorted(layer.tied),
                                 sorted(layer.offloaded),  # a set: the order only orders the copies
                                 None if layer.prefetch is None else (layer.prefetch.slot, name(layer.prefetch.copy_before),
                                                                      layer.prefetch.previous_forward))
              for layer in plan.layers}
    return plan.summary.backend, layers, plan.buffer_pool


def description(plan: Plan) -> Any:
    return [(layer.name, dict(layer.tied), {rel: (p.shape, p.dtype, p.stride, p.buffer, p.kind)
                                            for rel, p in layer.params.items()}) for layer in plan.layers]


@st.composite
def specs(draw: st.DrawFn) -> tuple[SpecFile, dict[str, Any]]:
    dtype = draw(st.sampled_from(["float16", "bfloat16", "float32"]))
    dims = st.integers(1, 6)
    params: dict[str, Any] = {}
    for i in range(draw(st.integers(1, 3))):
        shape = draw(st.lists(dims, min_size=1, max_size=2))
        if len(shape) == 2 and draw(st.booleans()):  # a transposed view of a wider storage
            params[f"w{i}"] = {"shape": shape, "stride": [1, shape[0] + draw(st.integers(0, 2))]}
        else:
            params[f"w{i}"] = {"shape": shape, "dtype": draw(st.sampled_from([dtype, "float32"]))}
    layers: list[dict[str, Any]] = [{"name": "embed", "params": {"weight": [8, 4]}}]
    layers.append({"name": "blocks.{i}", "repeat": draw(st.integers(2, 6)), "params": params})
    if draw(st.booleans()):
        layers.append({"name": "head", "tied": {"weight": "embed.weight"}})
    spec = SpecFile.model_validate({"model": {"name": "prop", "dtype": dtype, "layers": layers}})
    backend = draw(st.sampled_from(["prefetch", "prefetch", "uva", "none", "auto"]))
    step = draw(st.one_of(st.none(), st.integers(1, 4)))
    if draw(st.integers(0, 2)):  # mostly the group strategy: it always offloads something
        g = draw(st.integers(1, 3))
        settings_ = {"strategy": "group", "group_size": g, "num_in_group": draw(st.integers(1, g))}
    else:
        settings_ = {"gpu_budget": draw(st.integers(64, 4000))}
    return spec, {"backend": backend, "prefetch_step": step, **settings_}


def _by_field(data: dict[str, Any]) -> dict[tuple[str, str], list[tuple]]:
    """Every node's path (the root left out), grouped by (section, field): so that a rare field
    (a prefetch slot) is drawn about as often as a common one (a param's bytes)."""
    groups: dict[tuple[str, str], list[tuple]] = {}
    for path in _nodes(data)[1:]:
        field = next((p for p in reversed(path) if isinstance(p, str)), "")
        if path[:1] == ("layers",) and len(path) == 2:
            field = "a layer"
        elif len(path) > 1 and path[-2] == "params":
            field = "a param"
        section = next((s for s in ("prefetch", "params", "summary", "buffer_pool") if s in path), "layers")
        groups.setdefault((section, field), []).append(path)
    return groups


def _nodes(data: Any, path: tuple = ()) -> list[tuple]:
    """The path of every node of ``data``."""
    out = [path]
    if isinstance(data, dict):
        for k, v in data.items():
            out += _nodes(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _nodes(v, path + (i,))
    return out


def _mutations(value: Any, plan: dict[str, Any]) -> list[Any]:
    """Replacement values for one node (``_DELETE`` removes a key or list item)."""
    if isinstance(value, bool):
        return [not value, None, "yes"]
    if isinstance(value, int):
        return [0, value + 1, max(value - 1, 0), value * 2, 10**30, -1, "12", None]
    if isinstance(value, str):
        names = [layer["name"] for layer in plan["layers"]]
        return ["", value + "x", value.upper(), None, 7, *names[:3], _DELETE]
    if isinstance(value, list):
        out: list[Any] = [[], None, _DELETE, value[::-1]]
        if value:
            out += [value[:-1], value[1:], value + value[:1]]
        return out
    if isinstance(value, dict):
        out = [{**value, "extra": 1}, _DELETE]
        out += [{k: v for k, v in value.items() if k != key} for key in value]
        return out
    return [0, "x", _DELETE]


_DELETE = object()


def _apply(data: dict[str, Any], path: tuple, new: Any) -> None:
    node: Any = data
    for key in path[:-1]:
        node = node[key]
    if new is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = new


@given(specs(), st.data())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_a_random_edit_is_refused_or_changes_nothing_the_runtime_uses(spec_and_settings, data) -> None:
    spec, options = spec_and_settings
    try:
        plan = planner.plan(spec, **options)
    except (InfeasibleError, PlanningError, ValidationError):
        assume(False)
    event(f"{plan.summary.backend} plan")
    original = json.loads(dump_model(plan, "json"))
    groups = _by_field(original)
    section = data.draw(st.sampled_from(sorted({s for s, _ in groups})))
    field = data.draw(st.sampled_from(sorted(f for s, f in groups if s == section)))
    path = data.draw(st.sampled_from(groups[section, field]))
    node: Any = original
    for key in path:
        node = node[key]
    new = data.draw(st.sampled_from(_mutations(node, original)))
    mutated = copy.deepcopy(original)
    _apply(mutated, path, new)
    try:
        again = load_text(dump_yaml(mutated))
    except InputError as err:
        event("refused")
        assert str(err) and "Traceback" not in str(err)
        with pytest.raises(ValidationError):  # the same verdict for a Plan built in Python
            Plan.model_validate(mutated)
        return
    renamed = {new: node} if path[0] == "layers" and path[-1] == "name" and isinstance(new, str) else {}
    assert runtime_view(again, renamed) == runtime_view(plan), (path, new)
    event("accepted: the runtime sees the same plan")
    if description(again) != description(plan):
        # only the model description changed (a renamed layer, a reshaped resident param): what
        # runtime.check_model compares with the real model; nothing the plan can judge itself
        whole_param = len(path) == 4 and path[0] == "layers" and path[2] == "params"  # a whole param entry
        assert path == ("layers",) or whole_param or any(
            part in ("name", "shape", "dtype", "stride", "buffer", "kind", "tied")
            for part in path if isinstance(part, str)), (path, new)
        event("accepted: only the model description changed")
